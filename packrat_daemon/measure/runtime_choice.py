"""Which runtime `--runtime auto` serves with: a pure function of each runtime's predicted latencies.

A "runtime" here is a candidate's label: with `--precision auto` each (runtime, precision) pair is one
candidate ("openvino", "openvino/bf16"), chosen between by the same rule.

The plan with the lowest expected latency wins, unless another runtime's plan is predicted within
NEAR_TIE of it. A start-up profile is good to a few percent, so such a gap says nothing; and expected
latency weighs the largest batches most, so a runtime can win it while being clearly slower for small
batches (measured here: ONNX Runtime won ResNet-50's expected latency over B ∈ {1,4,8,16} by 1%
while it is 8% slower than OpenVINO at B=1). Among runtimes within the tie, the one least behind the
fastest runtime at its worst batch size is served.

A policy that checks its splits revises a plan's prediction after measuring it (`choose_checked`): the
profile can overrate a split, never underrate it by much, so a runtime chosen on a split that then measured
slower may no longer be the fastest. The choice is made again until the one chosen has been checked.

Each candidate's `Verdict` (served, slower, or refused by the accuracy guard) and why is what the log and
`packrat status` show, and what the state file keeps, so that a restart can serve the one chosen at once.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

NEAR_TIE = 0.02  # expected latencies within 2% are a tie
# Before several candidates are profiled, each is timed at one cell; one this much slower than the fastest there
# is not profiled. Splitting can change which runtime is fastest, but by a few percent, not by half.
SCREEN_MARGIN = 1.5

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True)
class RuntimeOption:
    runtime: str
    expected_ms: float  # inf when unknown
    batch_ms: Mapping[int, float | None]  # predicted latency per batch size of the distribution


@dataclass(frozen=True)
class RuntimeChoice:
    runtime: str
    reason: str


def choose_runtime(options: Sequence[RuntimeOption], near_tie: float = NEAR_TIE) -> RuntimeChoice:
    if not options:
        raise ValueError("choose_runtime needs at least one runtime")
    best = min(options, key=lambda o: o.expected_ms)
    predicted = "predicted: " + ", ".join(f"{o.runtime} {o.expected_ms:.1f} ms" for o in options)
    tied = [o for o in options if o.expected_ms <= best.expected_ms * (1.0 + near_tie)]
    lags: dict[str, tuple[float, int]] = {}
    for option in tied:
        lag = worst_lag(option, options)
        if lag is None:  # a batch size without a prediction: expected latency alone decides
            return RuntimeChoice(best.runtime, predicted)
        lags[option.runtime] = lag
    chosen = min(tied, key=lambda o: (lags[o.runtime][0], o.expected_ms))
    if chosen is best:
        return RuntimeChoice(best.runtime, predicted)
    behind = "; ".join(f"{name} {lag:.1%} at batch {batch}" for name, (lag, batch) in lags.items())
    return RuntimeChoice(
        chosen.runtime,
        f"{predicted}; within {near_tie:.0%} of each other, so the one least behind the fastest runtime at "
        f"its worst batch size ({behind})",
    )


def choose_checked(choose: Callable[[], K], check: Callable[[K], None]) -> K:
    """Choose, check the one chosen (which may revise its prediction), and choose again, until the one chosen
    has been checked. Each candidate is checked at most once, so this ends after as many checks as there
    are candidates at worst; usually after one."""
    checked: set[K] = set()
    while (chosen := choose()) not in checked:
        check(chosen)
        checked.add(chosen)
    return chosen


def worst_lag(option: RuntimeOption, options: Sequence[RuntimeOption]) -> tuple[float, int] | None:
    """(fraction, batch): how far `option` is behind the fastest runtime at its worst batch size.

    None when a latency is unknown for some batch size, or none is known.
    """
    worst: tuple[float, int] | None = None
    for batch, latency in option.batch_ms.items():
        known = [o.batch_ms.get(batch) for o in options]
        if latency is None or any(x is None for x in known):
            return None
        fastest = min(x for x in known if x is not None)
        lag = latency / fastest - 1.0
        if worst is None or lag > worst[0]:
            worst = (lag, batch)
    return worst


SERVED, SLOWER, REFUSED = "served", "slower", "refused"
MEASURING = "measuring"  # `packrat status` only, while the first answer serves: never a kept verdict


def ms_text(ms: float) -> str:
    """A latency for the log and `packrat status`: three significant digits, never an exponent."""
    return f"{ms:.3g}" if abs(ms) < 1000 else f"{ms:.0f}"


@dataclass(frozen=True)
class Verdict:
    """What became of one candidate at start, for the log, `packrat status` and the state file."""

    candidate: str  # its label: "torch", "openvino/bf16"
    verdict: str  # SERVED, SLOWER (measured, and another was chosen), REFUSED (by the accuracy guard)
    predicted_ms: float | None  # its plan's expected latency (None: refused before it was measured, or unknown)
    why: str

    def to_json(self) -> dict[str, object]:
        return {"candidate": self.candidate, "verdict": self.verdict, "predicted_ms": self.predicted_ms,
                "why": self.why}  # fmt: skip

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> Verdict:
        predicted = data.get("predicted_ms")
        verdict = str(data["verdict"])
        if verdict not in (SERVED, SLOWER, REFUSED):
            raise ValueError(f"unknown verdict {verdict!r}")
        return cls(str(data["candidate"]), verdict, None if predicted is None else float(str(predicted)),
                   str(data.get("why", "")))  # fmt: skip


def screened_slower(ms: float, fastest_ms: float, fastest: str, margin: float = SCREEN_MARGIN) -> str | None:
    """Why a candidate timed at `ms` on the screening cell is not profiled, or None: it is not more than `margin`
    slower than the fastest candidate screened whose guard passed (`fastest`, at `fastest_ms`)."""
    if ms <= fastest_ms * margin:
        return None
    return (f"{ms / fastest_ms:.2f}× {fastest}'s time on the screening cell ({ms_text(ms)} ms against "
            f"{ms_text(fastest_ms)} ms), beyond {margin:.2f}×")  # fmt: skip


def verdicts(
    served: str, reason: str, predicted: Mapping[str, float], refused: Mapping[str, str],
    screened: Mapping[str, str] | None = None,
) -> list[Verdict]:  # fmt: skip
    """Each candidate's verdict once `served` was chosen for `reason` (choose_runtime's) on the `predicted`
    expected latencies of those measured; `refused`: the accuracy guard's account of those it left out;
    `screened`: why each candidate left out at screening (`screened_slower`) was."""
    best = predicted.get(served, math.inf)
    out = []
    for name, ms in predicted.items():
        known = None if math.isinf(ms) else ms
        if name == served:
            why = "the only candidate" if len(predicted) + len(refused) + len(screened or {}) == 1 else reason
            out.append(Verdict(name, SERVED, known, why))
        elif math.isinf(ms):
            out.append(Verdict(name, SLOWER, None, f"no latency predicted; {served} was chosen ({reason})"))
        elif math.isinf(best):
            out.append(Verdict(name, SLOWER, known, f"{served} was chosen ({reason})"))
        else:
            behind = ms / best - 1.0
            tie = "; within the near tie, so decided at the worst batch size" if behind <= NEAR_TIE else ""
            out.append(Verdict(name, SLOWER, known, f"{behind:+.1%} on {served}'s {ms_text(best)} ms{tie}"))
    out += [Verdict(name, SLOWER, None, f"not profiled: {why}") for name, why in (screened or {}).items()]
    out += [Verdict(name, REFUSED, None, f"accuracy guard: {why}") for name, why in refused.items()]
    return out
