"""Emulation: the settings' checks, the interference models and their fit, the workers' numbers, and a real
emulating daemon (16 unpinned workers on this machine, Poisson traffic, no failures)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from packrat_daemon.config import ServeConfig
from packrat_daemon.measure import emulation
from packrat_daemon.wire.errors import ConfigError, ProfileError
from policies.planning.profile import Profile
from tests.helpers.daemons import daemon_env, running_daemon

REPO = Path(__file__).resolve().parents[3]
PROFILES = REPO / "bench" / "profiles"


def test_the_emulate_settings_are_refused_with_a_real_runtime() -> None:
    with pytest.raises(ConfigError, match="--emulate-cores only work with --runtime emulated"):
        emulation.check(ServeConfig(runtime="torch", emulate_cores=16))
    with pytest.raises(ConfigError, match="--emulate-interference only work with --runtime emulated"):
        emulation.check(ServeConfig(runtime="auto", emulate_interference="none"))
    assert emulation.check(ServeConfig(runtime="torch")) is False


def test_the_emulated_runtime_needs_a_profile_and_a_readable_interference_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--profile FILE"):
        emulation.check(ServeConfig(runtime="emulated", emulate_cores=16))
    profile = str(PROFILES / "bert-cloudlab16.csv")
    with pytest.raises(ConfigError, match="busy_cores,factor"):
        emulation.check(ServeConfig(runtime="emulated", profile=profile, emulate_interference=str(tmp_path / "no")))
    assert emulation.check(ServeConfig(runtime="emulated", profile=profile, emulate_cores=16)) is True


def test_emulate_cores_plans_for_a_made_up_machine() -> None:
    assert emulation.topology(ServeConfig(runtime="emulated", emulate_cores=64)).usable_cores == 64


def test_interference_none_default_and_from_a_file(tmp_path: Path) -> None:
    assert emulation.Interference.named("none").contention(16) == (1.0,) * 16
    default = emulation.Interference.named(None).contention(16)
    assert default[0] == 1.0 and default[-1] == pytest.approx(emulation.DEFAULT_FULL_LOAD)
    assert list(default) == sorted(default)
    (tmp_path / "f.csv").write_text("# measured elsewhere\nbusy_cores,factor\n4,1.2\n2,1.0\n")
    from_file = emulation.Interference.named(str(tmp_path / "f.csv"))
    assert from_file.contention(6) == pytest.approx((1.0, 1.0, 1.1, 1.2, 1.2, 1.2))


def test_a_number_is_the_factor_with_every_core_busy() -> None:
    given = emulation.Interference.named("1.4")
    assert given.contention(5) == pytest.approx((1.0, 1.1, 1.2, 1.3, 1.4))
    assert "×1.4 with every core busy" in given.describe()
    with pytest.raises(ConfigError, match="at least 1"):
        emulation.Interference.named("0.9")


def test_an_instance_alone_waits_its_profiled_latency_whatever_the_interference() -> None:
    # The profile measured each cell with that instance's own cores busy: a call of t threads waits
    # L̂(t, b) · f(busy) / f(t), so alone (busy = t) it waits L̂(t, b), beside others f(T) / f(t) more.
    profile = Profile.read_csv(PROFILES / "inception3-cloudlab16.csv")
    interference = emulation.Interference.named("1.4")
    handed = emulation.numbers(profile, 16, 8, interference)
    for threads in (1, 4, 16):
        alone = handed.latency_s(threads, 8) * handed.slowdown(threads) * 1000.0
        assert alone == pytest.approx(profile.lhat(threads, 8))
        full = handed.latency_s(threads, 8) * handed.slowdown(16) * 1000.0
        assert full == pytest.approx(profile.lhat(threads, 8) * 1.4 / interference.factor(threads, 16))


def test_the_speedup_errors_on_the_side_by_side_groups() -> None:
    multi, isolated = PROFILES / "multi-inception-fiddle16.csv", PROFILES / "inception3-cloudlab16.csv"
    groups = emulation.side_by_side_groups(multi, isolated)
    assert len(groups) == 8 and {g.threads for g in groups} == {1, 4}

    def mean_abs(text: str) -> float:
        errors = emulation.speedup_errors(multi, isolated, emulation.Interference.named(text))
        assert len(errors) == len(groups)
        return sum(abs(e) for e in errors) / len(errors)

    # Without interference every split looks better than it ran; the fitted default is closer, and a
    # pessimistic factor overshoots the other way.
    assert all(e > 0 for e in emulation.speedup_errors(multi, isolated, emulation.Interference.named("none")))
    assert mean_abs("default") < mean_abs("none") and mean_abs("default") < mean_abs("1.4")
    assert all(e < 0 for e in emulation.speedup_errors(multi, isolated, emulation.Interference.named("1.4")))


def test_the_default_interference_is_the_fit_on_the_shipped_tables() -> None:
    fitted = emulation.fit_full_load(PROFILES / "multi-inception-fiddle16.csv", PROFILES / "inception3-cloudlab16.csv")
    assert round(fitted, 3) == emulation.DEFAULT_FULL_LOAD


def test_the_workers_numbers_are_the_profiles_lhat(tmp_path: Path) -> None:
    profile = Profile.read_csv(PROFILES / "inception3-cloudlab16.csv")
    handed = emulation.numbers(profile, 8, 40, emulation.Interference.named("none"))
    assert sorted(handed.latency_ms) == list(range(1, 9))
    for threads, batch in [(1, 1), (3, 33), (8, 40)]:
        assert handed.latency_s(threads, batch) * 1000.0 == profile.lhat(threads, batch)
    assert "EMULATING 8 cores" in handed.label


def test_an_emulation_waits_one_runtimes_rows(tmp_path: Path) -> None:
    rows = "threads,batch,latency_ms,runtime\n1,1,5.0,torch\n"
    (tmp_path / "one.csv").write_text(rows)
    assert emulation.emulated_profile(str(tmp_path / "one.csv")).runtime == "emulated"
    (tmp_path / "two.csv").write_text(rows + "1,1,4.0,openvino\n")
    with pytest.raises(ProfileError, match="several runtimes"):
        emulation.emulated_profile(str(tmp_path / "two.csv"))


def _profile(path: Path) -> Path:
    """Latencies of a few ms, so a short test sees many batches."""
    lines = ["threads,batch,latency_ms"]
    lines += [f"{t},{b},{2.0 + 4.0 * b / t:.3f}" for t in range(1, 17) for b in range(1, 17)]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.slow
def test_the_daemon_refuses_emulate_flags_with_a_real_runtime(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "packrat_daemon", "serve", "--runtime", "torch", "--emulate-cores", "16"]
    done = subprocess.run(command, env=daemon_env(), capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2 and "only work with --runtime emulated" in done.stderr


@pytest.mark.slow
def test_sixteen_unpinned_emulated_workers_take_poisson_traffic_without_a_failure(tmp_path: Path) -> None:
    from packrat_daemon.wire.client import AsyncClient

    args = (
        "--runtime", "emulated", "--emulate-cores", "16", "--profile", str(_profile(tmp_path / "p.csv")),
        "--model", "builtin:tiny-mlp", "--policy", "fixed", "--plan", "16*1x1", "--max-batch", "16", "--no-adapt",
    )  # fmt: skip
    with running_daemon(tmp_path, *args) as (endpoint, _):

        async def traffic() -> tuple[dict, list[np.ndarray]]:
            async with AsyncClient(endpoint, timeout=30.0) as client:
                info = await client.info()
                rng = np.random.default_rng(7)
                inputs = np.ones((1, *info["input"]["shape"]), np.float32)
                tasks = []
                for gap in rng.exponential(1 / 100.0, 300):  # 100 requests/s for about 3 s
                    await asyncio.sleep(gap)
                    tasks.append(asyncio.ensure_future(client.infer(inputs)))
                return info, await asyncio.gather(*tasks)

        info, outputs = asyncio.run(traffic())
    assert info["runtime"] == "emulated" and info["emulation"]["cores"] == 16
    assert "EMULATING 16 cores" in info["emulation"]["note"]
    assert len(info["workers"]) == 16 and max(max(w["cores"]) for w in info["workers"]) == 15
    assert len(outputs) == 300 and all(out.shape[0] == 1 and not out.any() for out in outputs)
    assert "EMULATING 16 cores" in (tmp_path / "daemon.log").read_text()
