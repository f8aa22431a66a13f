"""The runtimes a worker can run a model through, and `make_runtime`, which builds one by name.

Each runtime is its module here (a `workers.runtimes.base.Runtime`) and its record in `workers.runtimes.registry`,
which every table about runtimes is read from. Only the runtimes' modules, `workers.models.loading`,
`workers.models.cache`, `workers.models.convert` and `workers.models.onnx_files` import the runtimes' packages,
and only when a runtime is made or loads: importing this package, or the registry, stays torch-free, and a
runtime's module is imported only when one is made.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from workers.runtimes.registry import BY_NAME, EMULATED

if TYPE_CHECKING:  # the base imports the model cache, which reads the registry through workers.models.spec
    from workers.runtimes.base import Runtime


def runtime_class(name: str) -> type[Runtime]:
    """The class of the registered runtime `name` (KeyError for a name that is not)."""
    made: type[Runtime] = BY_NAME[name].runtime_class()
    return made


def make_runtime(name: str, precision: str = "fp32") -> Runtime:
    """The runtime `name`; the daemon starts an emulated template as `emulated:FILE`, FILE holding the
    numbers its workers wait (workers.runtimes.emulated)."""
    from workers.models.spec import check_runtime

    if name.startswith(f"{EMULATED}:"):
        runtime = runtime_class(EMULATED)(name.partition(":")[2])  # type: ignore[call-arg]
    else:
        check_runtime(name)  # an unknown name or a missing package: a ConfigError that says what to install
        runtime = runtime_class(name)()
    runtime.use_precision(precision)
    return runtime
