"""The runtimes a worker can run a model through, by name, and `make_runtime`, which builds one.

    torch        PyTorch eager (the default); re-threads in place.          workers.runtimes.torch_runtime
    onnxruntime  ONNX Runtime on the model exported to ONNX.                  workers.runtimes.onnx_runtime
    openvino     OpenVINO on the model converted to its IR.                   workers.runtimes.openvino_runtime
    emulated     workers that compute nothing (a measuring instrument).      workers.runtimes.emulated

The interface they share is `workers.runtimes.base`. Only the runtimes' modules, `workers.models.loading`,
`workers.models.cache`, `workers.models.convert` and `workers.models.onnx_files` import the runtimes' packages,
and only when a runtime is made or loads: importing this registry stays torch-free. `workers.models.spec`
says which packages each runtime needs and at which precisions each can serve.
"""

from __future__ import annotations

from collections.abc import Callable

from workers.models.spec import EMULATED, check_runtime
from workers.runtimes.base import Runtime
from workers.runtimes.emulated import EmulatedRuntime
from workers.runtimes.onnx_runtime import OnnxRuntime
from workers.runtimes.openvino_runtime import OpenVinoRuntime
from workers.runtimes.torch_runtime import TorchRuntime

RUNTIMES: dict[str, Callable[[], Runtime]] = {
    "torch": TorchRuntime, "onnxruntime": OnnxRuntime, "openvino": OpenVinoRuntime, EMULATED: EmulatedRuntime
}  # fmt: skip


def make_runtime(name: str, precision: str = "fp32") -> Runtime:
    """The runtime `name`; the daemon starts an emulated template as `emulated:FILE`, FILE holding the
    numbers its workers wait (workers.runtimes.emulated)."""
    if name.startswith(f"{EMULATED}:"):
        runtime: Runtime = EmulatedRuntime(name.partition(":")[2])
    else:
        check_runtime(name)  # an unknown name or a missing package: a ConfigError that says what to install
        runtime = RUNTIMES[name]()
    runtime.use_precision(precision)
    return runtime
