"""The daemon's configuration: one typed attribute per `serve` setting, with the settings table's default.

Generated from the table (packrat_daemon/config.py): `python -m packrat_daemon.config --typed >
packrat_daemon/serve_config.py`. Do not edit; a test checks that it matches. What each setting means, its
flag and what a reload does with it: docs/configuration.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ServeConfig:
    """Built by `load_config` (the defaults, then the TOML file, then the flags) at start and on each reload;
    tests build it directly, e.g. ServeConfig(model="builtin:tiny-mlp", max_batch=4)."""

    # Model
    model: str = "builtin:resnet50"
    repository: str | None = None
    input: str | None = None
    runtime: str = "auto"
    emulate_cores: int | None = None
    emulate_interference: str | None = None
    precision: str = "auto"
    first_answer: str = "auto"
    max_rel_error: float = 0.05
    calibration: str | None = None
    accuracy_top1: str = "auto"
    allocator: str = "system"
    emulate_measure: bool = False

    # Serving
    endpoint: str = "tcp://127.0.0.1:5555"
    server_key: str | None = None
    allowed_clients: str | None = None
    insecure_public: bool = False
    max_batch: int = 16
    max_delay_ms: float = 1.0
    max_batch_tokens: int = 0
    length_batching: str = "by-cost"
    max_queue: int = 1024
    run_dir: str | None = None
    control: str | None = None

    # Planning
    policy: str = "packrat"
    plan: str | None = None
    cpus: str | None = None
    profile: str | None = None
    save_profile: str | None = None
    batches: list[int] = field(default_factory=list)
    min_split_gain: float = 0.05
    split_check_rounds: int = 5
    profile_budget: str = "0.25"
    state_dir: str | None = None

    # Adaptation (packrat policy)
    adapt: bool = True
    adapt_interval_s: float = 5.0
    adapt_min_batches: int = 50
    adapt_cooldown_s: float = 30.0
    adapt_min_gain: float = 0.05

    # Timeouts
    job_timeout_s: float = 120.0
    slice_deadline_margin: float = 3.0
    slice_deadline_floor_ms: float = 1000.0
    slice_spin_floor_ms: float = 200.0
    slice_hedge_margin: float = 1.5
    slice_hedge_floor_ms: float = 100.0
    drain_timeout_s: float = 30.0
    startup_timeout_s: float = 600.0

    # Metrics and logs
    metrics_port: int = 0
    metrics_address: str = "127.0.0.1"
    log_level: str = "info"
    log_format: str = "text"

    # Open Inference Protocol (docs/oip.md)
    http_port: int = 0
    grpc_port: int = 0
    oip_address: str = "127.0.0.1"
    oip_model_name: str | None = None
    oip_tls_cert: str | None = None
    oip_tls_key: str | None = None
    oip_limits: str | None = None
    oip_metrics_port: int = 0
