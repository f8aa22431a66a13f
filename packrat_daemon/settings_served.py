"""The settings table, its first half: what is served (the model, its runtime and precision, the accuracy guard) and
where and how requests are taken. `packrat_daemon.config` assembles the table from this and `settings_run`.
"""

from __future__ import annotations

from packrat_daemon.settings import (
    OPTIONAL_TEXT,
    POSITIVE_INT,
    SWITCH,
    TEXT,
    WAIT,
    Setting,
    choice,
    integer,
    number,
)
from workers.models.spec import PRECISION_CHOICES
from workers.models.spec import RAGGED_MODES as LENGTH_MODES
from workers.runtimes.registry import computing, either

# auto by default: the accuracy guard, not the user, decides whether a reduced precision is served, and it
# leaves one out where it fails (or where the CPU flags show no units for it). Whether bf16 pays is measured
# here at start on this CPU, never assumed: with AMX it served ResNet-50 about 4x faster than fp32, without
# AMX it measured no faster, and either way what the first start measured is kept in the state directory, so
# only the first start pays for the extra candidates. int8 is never chosen by auto (it needs --calibration
# on the user's own data); --precision fp32 pins fp32.
DEFAULT_PRECISION = "auto"
DEFAULT_RUNTIME = "auto"  # every installed runtime is measured and the fastest served, under the same rule
# The accuracy guard's (packrat_daemon.measure.accuracy) bound on a reduced precision's relative error, and whether
# the output is class scores whose top-1 must be kept (--accuracy-top1).
DEFAULT_MAX_REL_ERROR = 0.05
TOP1_CHOICES = ("auto", "on", "off")
RUNTIME_NAMES = either(computing())  # "torch, onnxruntime or openvino": the registry's computing runtimes

# The headings and the settings below each, in the docs' order (`settings.sectioned` files each under its heading).
SERVED: tuple[str | Setting, ...] = (
    "Model",
    Setting(
        "model",
        TEXT,
        "builtin:resnet50",
        "model spec: builtin:NAME, a .pt2, .pt or .onnx file, a Hugging Face folder (hf:DIR), or module:function; "
        "serve also takes a folder holding one such file or folder, whatever its name (KServe's /mnt/models)",
        reload="restart",
    ),
    Setting(
        "repository",
        OPTIONAL_TEXT,
        None,
        "serve every model of a model repository instead of --model: a folder in Triton's layout (NAME/1/model.onnx, "
        "config.pbtxt read where present) and/or a repository.toml listing models with their own settings; one "
        "daemon per model, one Open Inference Protocol endpoint (--http-port, --grpc-port) with Triton's repository "
        "extension, the joint core plan over the models loaded (docs/repository.md)",
        unset="serve --model alone",
        reload="restart",
    ),
    Setting(
        "input",
        OPTIONAL_TEXT,
        None,
        "input of a model file that does not declare it, e.g. float32:3x224x224",
        unset="declared by the model",
        reload="restart",
    ),
    Setting(
        "runtime",
        TEXT,
        DEFAULT_RUNTIME,
        f"auto: measure each installed runtime (serve then serves the fastest); {RUNTIME_NAMES} pins one; "
        "emulated: workers that compute nothing and wait the --profile's latencies (docs/emulation.md)",
        reload="restart",
    ),
    Setting(
        "emulate_cores",
        integer("a positive integer", lambda value: value >= 1, optional=True),
        None,
        "runtime emulated: plan for this many made-up cores; the workers run unpinned",
        unset="this machine's cores",
        reload="restart",
    ),
    Setting(
        "emulate_interference",
        OPTIONAL_TEXT,
        None,
        "runtime emulated: none, default, auto (the model's own, measured side by side on this machine "
        "once and cached), a number F (the slow-down with every core busy, linear in the cores busy), or a "
        "CSV of busy_cores,factor rows: how much slower each call waits while that many cores are busy",
        unset="default (fitted to Inception-v3 side by side on 16 cores)",
        reload="restart",
    ),
    Setting(
        "precision",
        choice(*PRECISION_CHOICES),
        DEFAULT_PRECISION,
        "auto: also measure bf16 where the CPU has bf16 units and the accuracy guard passes, and serve the "
        "fastest; fp32 pins fp32; bf16 (under the guard); int8 (runtime openvino, quantized on --calibration; "
        "never chosen by auto)",
        reload="restart",
    ),
    Setting(
        "first_answer",
        TEXT,
        "auto",
        "auto: with several runtime candidates to measure, the first one (fp32, no conversion) answers at once on "
        "a plan that needs no profile while every candidate is measured in the background at a lower priority, "
        "and the daemon switches, with no failed request, to the one measured fastest (docs/precision.md); off: "
        f"measure every candidate before answering; {RUNTIME_NAMES}: that runtime at fp32 answers first, whether "
        "or not it is a candidate",
        reload="restart",
    ),
    Setting(
        "max_rel_error",
        number("a number above 0, e.g. 0.05", lambda value: value > 0),
        DEFAULT_MAX_REL_ERROR,
        "accuracy guard: the largest relative error a reduced precision may show against fp32 "
        "(classifiers must also keep every input's top-1 class)",
        reload="restart",
    ),
    Setting(
        "calibration",
        OPTIONAL_TEXT,
        None,
        "accuracy guard: a .npy file of your own inputs (N x the model's input) checked besides the samples; "
        "int8 is quantized on them",
        unset="sample inputs only",
        reload="restart",
    ),
    Setting(
        "accuracy_top1",
        choice(*TOP1_CHOICES),
        "auto",
        "accuracy guard: hold the output to top-1 agreement (class scores): on, off, or auto: a 2-D output "
        "of probabilities or of scores not all within [-1, 1] (embeddings stay within it)",
        reload="restart",
    ),
    Setting("allocator", choice("system", "jemalloc", "tcmalloc"), "system", "malloc to preload", reload="restart"),
    Setting(
        "emulate_measure",
        SWITCH,
        False,
        "runtime emulated: measure the start-up profile on the emulated workers, as a daemon without a "
        "profile does, instead of planning on the profile they wait",
        reload="restart",
    ),
    "Serving",
    Setting("endpoint", TEXT, "tcp://127.0.0.1:5555", "where clients connect (tcp:// or ipc://)", reload="restart"),
    Setting(
        "server_key",
        OPTIONAL_TEXT,
        None,
        "the daemon's CURVE key pair, the .key_secret file of `packrat keygen`: clients must then encrypt "
        "and present a key listed in allowed_clients (docs/security.md)",
        unset="none: plaintext",
        reload="restart",
    ),
    Setting(
        "allowed_clients",
        OPTIONAL_TEXT,
        None,
        "with server_key: the folder of the public .key files of the clients that may connect; "
        "re-read when a file is added or removed",
        unset="none",
        reload="restart",
    ),
    Setting(
        "insecure_public",
        SWITCH,
        False,
        "serve plaintext on an endpoint beyond loopback and ipc (refused otherwise): anyone who reaches it "
        "may use the model",
        reload="restart",
    ),
    Setting(
        "max_batch",
        POSITIVE_INT,
        16,
        "most inputs in one batch",
        reload="live",
        reload_note="can only shrink without a restart",
    ),
    Setting("max_delay_ms", WAIT, 1.0, "longest wait in milliseconds to fill a batch", reload="live"),
    Setting(
        "max_batch_tokens",
        integer("an integer >= 0", lambda value: value >= 0),
        0,
        "most padded tokens in one batch, for a model of a free axis (0: max_batch times its longest)",
        reload="restart",
    ),
    Setting(
        "length_batching",
        choice(*LENGTH_MODES),
        LENGTH_MODES[0],
        "a model of a free axis: by-cost (batches sorted by length, cut by predicted cost, each slice padded to its "
        "own longest) or pad-batch (every slice padded to the batch's longest, cut by count: the baseline)",
        reload="restart",
    ),
    Setting("max_queue", POSITIVE_INT, 1024, "inputs that may wait, across requests", reload="live"),
    Setting(
        "run_dir",
        OPTIONAL_TEXT,
        None,
        "folder for the internal ipc sockets",
        unset="a private temp folder",
        reload="restart",
    ),
    Setting(
        "control",
        OPTIONAL_TEXT,
        None,
        "the endpoint `packrat reconfigure` talks to: ipc://PATH in a folder only this user may enter, or "
        "tcp on loopback; never the serving endpoint (docs/status.md)",
        unset="ipc://RUN_DIR/control.ipc, logged at start",
        reload="restart",
    ),
)
