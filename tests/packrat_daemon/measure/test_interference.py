"""`--emulate-interference auto`: folding the side-by-side rounds, the per-model cache, the refusals, and a real
side-by-side run of a small model on this machine's cores."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from packrat_daemon.config import ServeConfig
from packrat_daemon.measure import emulation, interference
from packrat_daemon.wire.errors import ConfigError
from policies.planning.topology import Topology
from workers.models.cache import entry_dir
from workers.models.spec import EMULATED

REPO = Path(__file__).resolve().parents[3]
PROFILES = REPO / "bench" / "profiles"


def _round(alone_cpu: float, side_cpu: float, on_cpu: float = 1.0) -> dict[str, Any]:
    return {
        "alone": {"cpu_ms": alone_cpu, "wall_ms": alone_cpu},
        "side": {"cpu_ms": side_cpu, "wall_ms": side_cpu / on_cpu, "others_on_cpu": on_cpu},
    }


def _run(rounds: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    return {"model": "builtin:m", "cpus": [0, 1], "torch": "x", "rounds": rounds}


def test_the_estimate_is_the_median_over_batches_of_each_batchs_median_ratio() -> None:
    run = _run(
        {
            "1": [_round(10.0, 11.0), _round(10.0, 13.0), _round(10.0, 12.0)],  # ×1.1, ×1.3, ×1.2: median 1.2
            "4": [_round(40.0, 56.0), _round(40.0, 60.0), _round(40.0, 52.0)],  # ×1.4, ×1.5, ×1.3: median 1.4
        }
    )
    found = interference.Estimate.from_run(run, "cpu", 0.5)
    assert found.by_batch == pytest.approx({1: 1.2, 4: 1.4})
    assert found.raw == pytest.approx(1.3) and found.factor == pytest.approx(1.3)
    assert not found.busy_machine and "busy" not in found.describe()
    assert "2 cores" in found.describe() and "3 paired rounds" in found.describe()
    assert interference.Estimate.from_json(found.to_json()) == found


def test_co_runners_never_speed_an_instance_up_and_a_busy_machine_is_said() -> None:
    run = _run({"1": [_round(10.0, 9.5, on_cpu=0.3), _round(10.0, 9.8, on_cpu=0.4)]})
    found = interference.Estimate.from_run(run, "cpu", 5.0)
    assert found.raw < 1.0 and found.factor == 1.0
    assert found.busy_machine and "understates" in found.describe()


class _Counter:
    def __init__(self, factor: float) -> None:
        self.calls = 0
        self.factor = factor

    def __call__(self, model: str, input_override: str | None, cpus: Any, batches: Any, rounds: int) -> Any:
        self.calls += 1
        return interference.Estimate.from_run(
            _run({"1": [_round(10.0, 10.0 * self.factor)]}), interference.machine_name(), 0.0
        )


def test_an_estimate_is_measured_once_per_model_and_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PACKRAT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(interference, "side_by_side_cpus", lambda: (0, 1))
    fake = _Counter(1.3)
    monkeypatch.setattr(interference, "measure", fake)
    first = interference.estimate("builtin:tiny-mlp")
    assert interference.estimate("builtin:tiny-mlp") == first and fake.calls == 1
    interference.estimate("builtin:tiny-cnn")
    assert fake.calls == 2  # another model, another measurement
    interference.estimate("builtin:tiny-mlp", refresh=True)
    assert fake.calls == 3
    cached = entry_dir("builtin:tiny-mlp", None, EMULATED) / "interference-2cpus.json"
    cached.write_text(cached.read_text().replace(interference.machine_name(), "another CPU"))
    interference.estimate("builtin:tiny-mlp")
    assert fake.calls == 4  # measured on another machine: measured again here


def test_auto_needs_two_cores_and_a_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Topology, "detect", classmethod(lambda cls, *a, **k: Topology.synthetic(1)))
    with pytest.raises(ConfigError, match="takes two usable cores.*default or a number"):
        interference.side_by_side_cpus()
    with pytest.raises(ConfigError, match="name the model with --model"):
        emulation.Interference.named("auto")


def test_auto_is_the_models_estimate_linear_in_the_cores_busy(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[tuple[str, str | None]] = []

    def fake(model: str, input_override: str | None = None) -> interference.Estimate:
        asked.append((model, input_override))
        return interference.Estimate.from_run(_run({"1": [_round(10.0, 13.0)]}), "cpu", 0.0)

    monkeypatch.setattr(interference, "estimate", fake)
    auto = emulation.Interference.named("auto", "builtin:bert-base")
    assert auto.full_load == pytest.approx(1.3)
    assert auto.contention(4) == pytest.approx((1.0, 1.1, 1.2, 1.3))
    assert auto.describe().startswith("auto: ×1.300 with every core busy")
    assert asked == [("builtin:bert-base", None)]
    profile = str(PROFILES / "bert-cloudlab16.csv")
    config = ServeConfig(runtime="emulated", profile=profile, model="builtin:bert-base", emulate_interference="auto")
    assert emulation.check(config) is True
    assert emulation.describe(config, 16)["interference"] == "auto" and asked[-1] == ("builtin:bert-base", None)


@pytest.mark.slow
def test_a_small_model_runs_alone_and_side_by_side_on_this_machines_cores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PACKRAT_CACHE_DIR", str(tmp_path))
    found = interference.estimate("builtin:tiny-cnn", batches=(1, 2), rounds=2)
    assert len(found.cpus) >= 2 and sorted(found.ratios) == [1, 2]
    assert all(len(r) == 2 and all(x > 0 for x in r) for r in found.ratios.values())
    assert found.factor >= 1.0 and 0.0 < found.on_cpu <= 2.0
    assert interference.estimate("builtin:tiny-cnn", batches=(1, 2), rounds=2) == found  # read from the cache
