"""`packrat demo`, the README's main job, end to end on a tiny model: two real daemons, real requests."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest

from packrat_daemon.commands.demo import verdict

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.slow
def test_demo_serves_both_policies_and_prints_the_comparison() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "packrat_daemon", "demo", "--model", "builtin:tiny-mlp", "--batch", "4",
         "--requests", "6"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0] == "model: builtin:tiny-mlp, batch 4, 6 requests each (paired rounds)"
    assert lines[1].startswith("packrat plan: ")
    assert any(line.startswith("  why: ") for line in lines)
    speedup = next(line for line in lines if line.startswith("speed-up of packrat over single: "))
    assert float(speedup.split(": ")[1].split("×")[0]) > 0
    assert any(line.startswith("  97% confidence interval: ") for line in lines)  # 6 rounds: their min and max
    assert any(line.startswith("verdict: ") for line in lines)
    assert "starting the `single` baseline" in done.stderr
    assert "single serves torch at fp32" in lines  # the baseline, whatever packrat chose
    served = next(line for line in lines if line.startswith("packrat serves "))
    runtime, precision = served.split()[2], served.split()[4]
    assert any(line.startswith("median latency  packrat: ") and f"({runtime} {precision})" in line for line in lines)
    # The defaults are auto: every candidate was measured, and each one's verdict is printed.
    chose = lines.index(next(line for line in lines if line.startswith("packrat chose among ")))
    verdicts = [line.split(":")[1].split()[0] for line in lines[chose + 1 :]]
    assert verdicts.count("served") == 1 and set(verdicts) <= {"served", "slower", "refused"}
    assert f"  {runtime if precision == 'fp32' else runtime + '/' + precision}: served" in "\n".join(lines)


def demo(*args: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-m", "packrat_daemon", "demo", "--model", "builtin:tiny-mlp", "--batch", "4",
         "--requests", "6", *args],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.splitlines()


@pytest.mark.slow
def test_a_second_demo_serves_the_first_ones_choice_at_once(tmp_path: Path) -> None:
    """The README's promise: the first demo measures every candidate and keeps its choice; the second, on the same
    state folder and flags, serves that choice without measuring, and says so; and each says why when it does not."""
    state = tmp_path / "state"
    first = demo("--state-dir", str(state))
    said = f"packrat measured every candidate again: no choice was kept in {state}/learned-profile.json yet"
    assert said in "\n".join(first)
    assert any(line.startswith("packrat chose among ") and line.endswith(" at this start:") for line in first)
    served = next(line for line in first if line.startswith("packrat serves "))
    second = demo("--state-dir", str(state))
    assert f"at an earlier start, kept in {state}/learned-profile.json:" in "\n".join(second)
    assert not any(line.startswith("packrat measured every candidate again") for line in second)
    assert served in second  # the same runtime and precision
    assert any(line.startswith("  why: restored from the state file") for line in second)
    third = demo("--state-dir", str(state), "--batch", "2")  # another max batch: another choice, and why
    said = "packrat measured every candidate again: the kept choice was made for other settings (max_batch 4 → 2"
    assert said in "\n".join(third)


def noisy(base: float, factor: float, rounds: int, seed: int) -> tuple[list[float], list[float]]:
    """Paired latencies: packrat around `base` ms, single `factor` times it, each with ±10% noise."""
    draw = random.Random(seed)
    packrat = [base * draw.uniform(0.9, 1.1) for _ in range(rounds)]
    return packrat, [p * factor * draw.uniform(0.9, 1.1) for p in packrat]


@pytest.mark.parametrize("seed", range(5))
def test_verdict_on_synthetic_rounds_faster_slower_and_tie(seed: int) -> None:
    assert verdict(*noisy(100.0, 1.5, 20, seed)).word == "faster"
    assert verdict(*noisy(100.0, 1 / 1.5, 20, seed)).word == "slower"
    assert verdict(*noisy(100.0, 1.0, 20, seed)).word == "a tie within noise"


def test_the_interval_is_the_sign_tests_and_holds_the_median() -> None:
    packrat = [100.0] * 20
    single = [100.0 + k for k in range(20)]  # speed-ups 1.00, 1.01, ..., 1.19
    judged = verdict(packrat, single)
    # n = 20: P(Binomial(20, 1/2) <= 5) = 0.0207 <= 0.025 < P(<= 6): order statistics 6 and 15.
    assert (judged.low, judged.high) == (1.05, 1.14)
    assert judged.confidence == pytest.approx(1 - 2 * 0.020695, abs=1e-6)
    assert judged.low <= judged.speedup <= judged.high and judged.rounds == 20


def test_a_few_stalled_rounds_do_not_flip_the_verdict() -> None:
    packrat, single = noisy(100.0, 1.5, 20, seed=7)
    packrat[:3] = [1000.0, 1000.0, 1000.0]  # three rounds where packrat's daemon was descheduled
    assert verdict(packrat, single).word == "faster"


def test_a_small_gain_or_too_few_rounds_is_a_tie() -> None:
    assert verdict(*noisy(100.0, 1.03, 30, seed=1)).word == "a tie within noise"  # under --tie-within
    assert verdict(*noisy(100.0, 1.03, 30, seed=1), tie_within=0.0).word != "slower"
    judged = verdict([100.0] * 5, [200.0] * 5)  # 5 rounds cannot bound a 95% interval
    assert judged.word == "a tie within noise" and judged.high == float("inf")
