"""The daemon's configuration: every `serve` option, with its default."""

from __future__ import annotations

from dataclasses import dataclass, field

from policies.packrat import MIN_SPLIT_GAIN


@dataclass
class ServeConfig:
    model: str = "builtin:resnet50"
    input: str | None = None
    endpoint: str = "tcp://127.0.0.1:5555"
    policy: str = "packrat"
    plan: str | None = None
    profile: str | None = None
    save_profile: str | None = None
    max_batch: int = 16
    max_delay_ms: float = 1.0
    max_queue: int = 1024  # inputs waiting, across requests
    allocator: str = "system"
    runtime: str = "torch"
    run_dir: str | None = None
    job_timeout_s: float = 120.0
    drain_timeout_s: float = 30.0
    startup_timeout_s: float = 600.0
    batches: list[int] = field(default_factory=list)  # batch sizes to plan for (default: max_batch)
    min_split_gain: float = MIN_SPLIT_GAIN  # packrat policy: several instances must beat one by this much
    split_check_rounds: int = 5  # packrat policy: at start, check each split against one instance this many rounds
    # Online adaptation (packrat policy only): re-plan when the live batch sizes move.
    adapt: bool = True
    adapt_interval_s: float = 5.0
    adapt_min_batches: int = 50
    adapt_cooldown_s: float = 30.0
    adapt_min_gain: float = 0.05
    metrics_port: int = 0  # 0: no metrics endpoint
    metrics_address: str = "127.0.0.1"
