"""`packrat demo`: the newcomer's first run — serve a built-in model and compare with one instance.

Starts the daemon as `packrat serve` starts by default: the packrat policy on every runtime and precision
candidate (each measured, a reduced precision under the accuracy guard, the fastest served; what it measured
kept in the default state folder, so a second demo starts at once). Then a second daemon with the `single`
policy on torch at fp32 (PyTorch's default: one instance, all cores, full precision), and sends
the same request to both through the client library in paired rounds (one to each, the order
alternating), so that a noisy neighbour slows both alike. It prints the plan, the median latencies and
a verdict that holds up to noise: the median of the rounds' speed-ups with a distribution-free
confidence interval (the sign test's), and "faster" or "slower" only when the whole interval lies
beyond `--tie-within` of 1, else "a tie within noise". It says which runtime and precision the packrat
daemon chose and why each other candidate lost. Both daemons are stopped before it returns.
"""

from __future__ import annotations

import argparse
import math
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packrat_daemon.commands.options import add_settings, argument_type, positive_int
from packrat_daemon.settings import FRACTION


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="serve a built-in model with packrat and with one instance, and compare their latency",
        description="Start the daemon on a built-in model, send a burst of requests, compare with `single`.",
    )
    # As `serve` takes them, for the packrat daemon; the `single` baseline is torch at fp32 whatever they say.
    add_settings(parser, ["model", "runtime", "precision", "max_rel_error"])
    parser.add_argument("--batch", type=positive_int, default=8, help="samples per request (default 8)")
    parser.add_argument(
        "--requests", type=positive_int, default=20, help="paired rounds: requests per policy (default 20)"
    )
    parser.add_argument(
        "--tie-within", type=argument_type(FRACTION), default=TIE_WITHIN, metavar="FRACTION",
        help=f"speed-ups closer to 1 than this are a tie (default {TIE_WITHIN})",
    )  # fmt: skip
    parser.add_argument(
        "--state-dir", metavar="DIR",
        help="where the packrat daemon keeps what it measured and chose, as serve's --state-dir (default: serve's "
        "default folder for this model and policy; `none` keeps nothing). A later demo with the same folder and "
        "flags serves the kept choice at once. Given, the `single` baseline keeps nothing",
    )  # fmt: skip
    parser.set_defaults(run=run)


TIE_WITHIN = 0.05  # a speed-up under 5% is not worth a verdict on a shared machine
CONFIDENCE = 0.95


@dataclass(frozen=True)
class Verdict:
    """Packrat against single over paired rounds."""

    speedup: float  # the median of the rounds' single ÷ packrat
    low: float  # the confidence interval of that median (0 and inf when too few rounds to bound it)
    high: float
    confidence: float  # the interval's exact coverage, at least CONFIDENCE when bounded
    rounds: int
    word: str  # "faster", "slower" or "a tie within noise"


def verdict(packrat_ms: Sequence[float], single_ms: Sequence[float], tie_within: float = TIE_WITHIN) -> Verdict:
    """The verdict on paired latencies (round k: `packrat_ms[k]` and `single_ms[k]`).

    The interval is the sign test's for the median speed-up: order statistics k and n + 1 − k of the
    rounds' speed-ups, with k the largest for which P(Binomial(n, ½) < k) ≤ (1 − CONFIDENCE) / 2. It
    assumes nothing about the noise's shape, so one stalled round cannot move it much.
    """
    ratios = sorted(single / packrat for packrat, single in zip(packrat_ms, single_ms, strict=True))
    n = len(ratios)
    if n == 0:
        raise ValueError("no rounds to judge")
    k, below = 0, 0.0  # below: P(Binomial(n, ½) < k)
    while k < n // 2 and below + math.comb(n, k) / 2**n <= (1 - CONFIDENCE) / 2:
        below += math.comb(n, k) / 2**n
        k += 1
    low, high = (ratios[k - 1], ratios[n - k]) if k else (0.0, math.inf)
    if low > 1 + tie_within:
        word = "faster"
    elif high < 1 / (1 + tie_within):
        word = "slower"
    else:
        word = "a tie within noise"
    return Verdict(statistics.median(ratios), low, high, 1 - 2 * below, n, word)


def _start(folder: Path, name: str, args: list[str]) -> tuple[subprocess.Popen, str]:
    endpoint = f"ipc://{folder}/{name}.ipc"
    command = [sys.executable, "-m", "packrat_daemon", "serve", "--endpoint", endpoint, "--log-level", "warning"]
    return subprocess.Popen([*command, *args]), endpoint


def _wait(process: subprocess.Popen, endpoint: str, timeout: float = 900.0) -> dict[str, Any]:
    from packrat_daemon.wire.client import Client, ClientTimeout

    deadline = time.monotonic() + timeout
    with Client(endpoint, timeout=2.0) as client:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise SystemExit(f"packrat demo: the daemon exited with status {process.returncode}")
            try:
                return client.info()
            except ClientTimeout:
                continue
    raise SystemExit("packrat demo: the daemon did not become ready in time")


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from packrat_daemon.wire.client import Client

    processes: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory(prefix="packrat-demo-") as tmp:
        folder = Path(tmp)
        common = ["--model", args.model, "--max-batch", str(args.batch), "--max-delay-ms", "0"]
        chosen = ["--runtime", args.runtime, "--precision", args.precision, "--max-rel-error", str(args.max_rel_error)]
        chosen += ["--first-answer", "off"]  # the demo times the choice, not the first answer while it is made
        kept = [] if args.state_dir is None else ["--state-dir", args.state_dir]
        try:
            print(
                f"packrat demo: serving {args.model} with the packrat policy at runtime {args.runtime}, precision "
                f"{args.precision} (each candidate measured first, unless the state folder keeps an earlier demo's "
                "choice) ...",
                file=sys.stderr,
            )
            packrat, packrat_endpoint = _start(folder, "packrat", [*common, *chosen, *kept, "--policy", "packrat"])
            processes.append(packrat)
            info = _wait(packrat, packrat_endpoint)
            print("packrat demo: starting the `single` baseline (torch at fp32) ...", file=sys.stderr)
            baseline = ["--runtime", "torch", "--precision", "fp32", "--policy", "single"]
            baseline += [] if args.state_dir is None else ["--state-dir", "none"]  # never the packrat daemon's file
            single, single_endpoint = _start(folder, "single", [*common, *baseline])
            processes.append(single)
            single_info = _wait(single, single_endpoint)
            spec = info["input"]
            rng = np.random.default_rng(0)
            shape = (args.batch, *spec["shape"])
            if spec["dtype"].startswith("float"):
                batch = rng.standard_normal(shape, dtype=np.float32).astype(spec["dtype"])
            else:
                batch = rng.integers(0, 100, shape).astype(spec["dtype"])
            times: dict[str, list[float]] = {"packrat": [], "single": []}
            with Client(packrat_endpoint, timeout=600) as fast, Client(single_endpoint, timeout=600) as base:
                clients = {"packrat": fast, "single": base}
                for client in clients.values():
                    client.infer(batch)  # warm-up: first calls build oneDNN primitives for this shape
                for round_ in range(args.requests):
                    for name in ("packrat", "single") if round_ % 2 == 0 else ("single", "packrat"):
                        client = clients[name]
                        start = time.perf_counter()
                        client.infer(batch)
                        times[name].append((time.perf_counter() - start) * 1000.0)
                status = fast.status()
        finally:
            for process in processes:
                process.terminate()
            for process in processes:
                try:
                    process.wait(60)
                except subprocess.TimeoutExpired:
                    process.kill()
    plan = info["plan"]
    parts = ", ".join(f"{i['threads']} thread(s) × {i['batch']} input(s)" for i in plan["instances"])
    packrat_ms, single_ms = statistics.median(times["packrat"]), statistics.median(times["single"])
    print(f"model: {args.model}, batch {args.batch}, {args.requests} requests each (paired rounds)")
    print(f"packrat plan: {len(plan['instances'])} instance(s): {parts}")
    for line in _prediction_lines(plan.get("predicted_latency_ms"), status):
        print(line)
    print(f"  why: {plan['reason']}")
    served = f"{info.get('runtime')} {info.get('precision', 'fp32')}"
    print(f"median latency  packrat: {packrat_ms:8.1f} ms   ({served})")
    print(f"median latency  single : {single_ms:8.1f} ms   (torch fp32, one instance, all cores: PyTorch's default)")
    judged = verdict(times["packrat"], times["single"], args.tie_within)
    print(f"speed-up of packrat over single: {judged.speedup:.2f}× (median of {judged.rounds} paired rounds)")
    if judged.high < math.inf:
        interval = f"{judged.low:.2f}×–{judged.high:.2f}×"
        print(f"  {judged.confidence:.0%} confidence interval: {interval}")
    else:
        print("  too few rounds to bound it: use --requests 6 or more")
    closer = f"a speed-up within {args.tie_within:.0%} of 1 counts as a tie"
    if judged.word == "a tie within noise":
        print(f"verdict: a tie within noise ({closer})")
    else:
        print(f"verdict: packrat is {judged.word} than single")
    for name, daemon in (("packrat", info), ("single", single_info)):
        guard = daemon.get("accuracy_guard")
        measured = "" if not guard else f" (accuracy guard: max relative error {guard['max_rel_error']:.2e})"
        print(f"{name} serves {daemon.get('runtime')} at {daemon.get('precision', 'fp32')}{measured}")
    if _layout(plan) == _layout(single_info["plan"]) and served == "torch fp32":
        print(
            "  packrat serves the same layout as single here (splitting is not predicted to pay on this "
            "machine), so the difference above is noise between two processes"
        )
    for line in _choice_lines(status.get("runtime_choice"), status["profile"].get("state_file")):  # a line each
        print(line)
    return 0


def _prediction_lines(predicted: float | None, status: dict[str, Any]) -> list[str]:
    """The plan's predicted latency against the compute the packrat daemon measured per layout while the demo ran
    (status' `predictions`), said to disagree beyond the profile's noise; and a profile measured while other work
    ran on its cores (status' profile `contention`)."""
    from packrat_daemon.measure.runtime_choice import ms_text

    lines = [] if predicted is None else [f"  predicted from the profile: {ms_text(predicted)} ms"]
    predictions = status.get("predictions") or {}
    noise = predictions.get("noise", 0.0)
    for row in predictions.get("layouts", []):
        if row["predicted_ms"] is None:
            continue
        verdict = f"beyond the profile's noise (±{noise:.0%})" if row["disagrees"] else "within the profile's noise"
        measured = f"measured {ms_text(row['measured_ms'])} ms compute per batch"
        lines.append(f"  layout {row['layout']}: predicted {ms_text(row['predicted_ms'])} ms, {measured} "
                     f"({row['ratio']:.2f}×, {verdict})")  # fmt: skip
    crowding = status.get("profile", {}).get("contention")
    if crowding and crowding.get("contended"):
        lines.append(f"  WARNING: the profile was {crowding['describe']}; the predictions above are not this "
                     "machine's alone (the next start on a quiet machine measures it again)")  # fmt: skip
    elif any(row["disagrees"] for row in predictions.get("layouts", []) if row["predicted_ms"] is not None):
        lines.append("  the profile's predictions do not hold here now: production timings correct the plan as it "
                     "serves (packrat status shows them)")  # fmt: skip
    return lines


def _choice_lines(choice: dict[str, Any] | None, state_file: str | None = None) -> list[str]:
    """How the packrat daemon chose its runtime and precision: when, why an earlier choice was not served again,
    and one line per candidate (status' runtime_choice)."""
    from packrat_daemon.measure.runtime_choice import ms_text

    if not choice or len(choice["candidates"]) < 2:
        return []
    where = "the state folder" if state_file is None else state_file
    when = "at this start" if choice["decided_at_this_start"] else f"at an earlier start, kept in {where}"
    lines = [f"packrat chose among {len(choice['candidates'])} candidates {when}:"]
    if choice["decided_at_this_start"] and choice.get("kept_choice_not_reused"):
        lines.insert(0, f"packrat measured every candidate again: {choice['kept_choice_not_reused']}")
    for candidate in choice["candidates"]:
        predicted = "" if candidate["predicted_ms"] is None else f" (predicted {ms_text(candidate['predicted_ms'])} ms)"
        lines.append(f"  {candidate['candidate']}: {candidate['verdict']}{predicted}: {candidate['why']}")
    return lines


def _layout(plan: dict) -> list[int]:
    return sorted(instance["threads"] for instance in plan["instances"])
