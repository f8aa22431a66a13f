"""The emulated daemon at 16 cores against the solver's predictions, and emulated workers under load.

EMULATION: every daemon here runs `--runtime emulated`: its workers compute nothing and wait the
latencies of the real 16-core tables in bench/profiles/ (docs/emulation.md). What is measured is the
daemon (batching, splitting, transport, gathering), never a model.

1. closed loop, `packrat load --batch B --concurrency 1`: for each table, policy and batch size B, the median
   latency through `serve --runtime emulated --emulate-cores 16 --emulate-interference none`, against the
   plan latency the solver predicts (`info`'s plan). The transport cost is measured on its own: the same
   daemon, policy and requests with the table scaled by 1e-6 (the same plan, since every choice the solver
   makes is scale-free: checked), so the latency there is all daemon and transport. The two daemons run
   at once and take turns (--rounds): the machine may be shared, and a noisy moment then slows both.
2. Poisson: 16 emulated workers (`--policy fixed --plan 16*1x4`) under `packrat load --rate R` for
   --poisson-s seconds: every request answered, or the failures counted by code.
3. 64 emulated workers (`--emulate-cores 64 --policy fixed --plan 64*1x1`) start and serve.

Prints JSON (bench/results/emulated.json).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from harness import DaemonProcess  # noqa: E402  (bench/ is on sys.path when this script runs)

from packrat_daemon.wire.client import Client  # noqa: E402
from policies.planning.profile import Profile  # noqa: E402

TABLES = {  # table → the model whose input and output shapes the requests carry
    "inception3-cloudlab16": "builtin:resnet50",  # no Inception-v3 built in; ResNet-50's 3x224x224 input stands in
    "bert-cloudlab16": "builtin:bert-base",
}
TRANSPORT_SCALE = 1e-6
LOGS = Path(tempfile.gettempdir()) / "packrat-emulated-logs"  # daemon logs of points that had failures
BOUND = 0.05  # the bound: within 5% of the prediction, plus the measured transport cost


@contextlib.contextmanager
def daemon(run: Path, *args: str) -> Iterator[str]:
    """A `packrat serve` subprocess (harness.DaemonProcess, its log in `run`/daemon.log); yields its endpoint."""
    process = DaemonProcess("daemon", run, ["--log-level", "warning", *args])
    try:
        process.wait(300.0)
        yield process.endpoint
    finally:
        process.close()


def emulated(profile: Path, model: str, cores: int, *extra: str) -> list[str]:
    return [
        "--runtime", "emulated", "--emulate-cores", str(cores), "--emulate-interference", "none",
        "--profile", str(profile), "--model", model, "--no-adapt", "--split-check-rounds", "0", *extra,
    ]  # fmt: skip


def load(endpoint: str, *traffic: str) -> dict[str, Any]:
    """`packrat load --json` against `endpoint`: its report."""
    command = [sys.executable, "-m", "packrat_daemon", "load", "--endpoint", endpoint, "--json", "--quiet", *traffic]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def closed_loop(endpoint: str, batch: int, requests: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """`info`, and `packrat load --batch B --concurrency 1` for `requests` requests."""
    with Client(endpoint, timeout=30.0) as client:
        info = client.info()
    report = load(endpoint, "--concurrency", "1", "--batch", str(batch), "--requests", str(requests))
    if report["ok"] != report["sent"]:
        raise RuntimeError(f"failed requests at batch {batch}: {report['errors']}")
    return info, report


def pss_kib(pid: int) -> int:
    """The process's proportional share of the memory it maps (shared pages split among their sharers)."""
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1])
    return 0


def scaled(table: Path, out: Path) -> Path:
    profile = Profile.read_csv(table)
    Profile.from_latencies({key: cell.latency_ms * TRANSPORT_SCALE for key, cell in profile.items()}).write_csv(out)
    return out


def plan_shape(info: dict[str, Any]) -> list[list[int]]:
    plan = info["plan"]
    return [sorted(i["threads"] for i in layout) for layout in [plan["instances"], *plan["alternatives"]]]


def interleaved(endpoints: dict[str, str], batch: int, requests: int, rounds: int) -> dict[str, dict[str, Any]]:
    """`packrat load --batch B --concurrency 1` on each endpoint in turn, `rounds` times (the machine is
    shared: a noisy moment slows every daemon alike); per endpoint the median of the rounds' p50s, the
    requests sent and answered, and the errors by code."""
    outcome = {name: {"p50s": [], "sent": 0, "ok": 0, "errors": Counter()} for name in endpoints}
    for round_ in range(rounds):
        for name, endpoint in endpoints.items():
            warmup = "1" if round_ == 0 else "0"
            report = load(endpoint, "--concurrency", "1", "--batch", str(batch), "--requests", str(requests // rounds),
                          "--warmup", warmup)  # fmt: skip
            seen = outcome[name]
            seen["p50s"].append(report["latency_ms"]["p50"])
            seen["sent"] += report["sent"]
            seen["ok"] += report["ok"]
            seen["errors"].update(report["errors"])
            seen["emulated"] = report.get("emulated")
    for seen in outcome.values():
        seen["p50_ms"] = statistics.median(seen["p50s"])
    return outcome


def sweep(
    work: Path, batches: list[int], policies: list[str], requests: int, rounds: int, serve_args: list[str]
) -> list[dict[str, Any]]:
    rows = []
    for name, model in TABLES.items():
        table = REPO / "bench" / "profiles" / f"{name}.csv"
        tiny = scaled(table, work / f"{name}-scaled.csv")
        for policy in policies:
            for batch in batches:
                flags = ["--policy", policy, "--max-batch", str(batch), "--batches", str(batch), *serve_args]
                runs = {"real": Path(tempfile.mkdtemp(dir=work)), "transport": Path(tempfile.mkdtemp(dir=work))}
                with contextlib.ExitStack() as stack:
                    endpoints = {
                        "real": stack.enter_context(daemon(runs["real"], *emulated(table, model, 16, *flags))),
                        "transport": stack.enter_context(daemon(runs["transport"], *emulated(tiny, model, 16, *flags))),
                    }
                    infos = {}
                    for kind, endpoint in endpoints.items():
                        with Client(endpoint, timeout=30.0) as client:
                            infos[kind] = client.info()
                    measured = interleaved(endpoints, batch, requests, rounds)
                for kind, run in runs.items():
                    if measured[kind]["ok"] != measured[kind]["sent"]:  # keep the daemon's account of it
                        (LOGS / f"{name}-{policy}-{batch}-{kind}.log").write_bytes((run / "daemon.log").read_bytes())
                # None for a plan whose workers share cores (torchserve's): the solver predicts no latency there.
                predicted = infos["real"]["plan"]["predicted_latency_ms"]
                median, transport_ms = measured["real"]["p50_ms"], measured["transport"]["p50_ms"]
                gap = None if predicted is None else median - predicted
                row = {
                    "table": name, "model": model, "policy": policy, "batch": batch, "plan": plan_shape(infos["real"]),
                    "same_plan_for_transport": plan_shape(infos["transport"]) == plan_shape(infos["real"]),
                    "predicted_ms": predicted, "median_ms": median, "transport_ms": transport_ms,
                    "error_ms": gap, "error_pct": None if gap is None else 100.0 * gap / predicted,
                    "within_bound": None if gap is None else abs(gap) <= BOUND * predicted + transport_ms,
                    "sent": measured["real"]["sent"], "ok": measured["real"]["ok"],
                    "errors": dict(measured["real"]["errors"]),
                    "transport_errors": dict(measured["transport"]["errors"]),
                    "emulated_per_load": measured["real"]["emulated"],
                }  # fmt: skip
                print(json.dumps(row), file=sys.stderr, flush=True)
                rows.append(row)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for flag, default in (("--batches", "1,2,4,8,16,32,64"), ("--policies", "packrat,single")):
        parser.add_argument(flag, default=default, help=f"comma-separated (default {default})")
    parser.add_argument("--requests", type=int, default=24, help="per daemon and batch size, over the rounds")
    for flag, kind, default in (("--rounds", int, 4), ("--poisson-s", float, 600.0), ("--poisson-rate", float, 40.0)):
        parser.add_argument(flag, type=kind, default=default)
    parser.add_argument("--skip", default="", help="comma-separated parts to skip: sweep, poisson, workers64")
    parser.add_argument(
        "--serve-args", default="", help="more `packrat serve` options for the sweep's daemons: --serve-args='--opt v'"
    )
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    result: dict[str, Any] = {"emulated": True, "note": "EMULATION: workers compute nothing (docs/emulation.md)"}
    LOGS.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="packrat-emulated-") as folder:
        work = Path(folder)
        if "sweep" not in skip:
            batches = [int(b) for b in args.batches.split(",")]
            serve_args = args.serve_args.split()
            result["serve_args"] = serve_args
            policies = args.policies.split(",")
            result["closed_loop"] = sweep(work, batches, policies, args.requests, args.rounds, serve_args)
        table = REPO / "bench" / "profiles" / "inception3-cloudlab16.csv"
        if "poisson" not in skip:
            run = Path(tempfile.mkdtemp(dir=work))
            flags = ["--policy", "fixed", "--plan", "16*1x4", "--max-batch", "64"]
            with daemon(run, *emulated(table, TABLES["inception3-cloudlab16"], 16, *flags)) as endpoint:
                with Client(endpoint, timeout=30.0) as client:
                    workers = len(client.info()["workers"])
                traffic = ["--rate", str(args.poisson_rate), "--duration", str(args.poisson_s), "--seed", "2026"]
                report = load(endpoint, *traffic, "--timeout", "60")
                result["poisson_16_workers"] = {"workers": workers, "failed": report["sent"] - report["ok"], **report}
        if "workers64" not in skip:
            run = Path(tempfile.mkdtemp(dir=work))
            flags = ["--policy", "fixed", "--plan", "64*1x1", "--max-batch", "64"]
            started = time.perf_counter()
            with daemon(run, *emulated(table, TABLES["inception3-cloudlab16"], 64, *flags)) as endpoint:
                start_s = time.perf_counter() - started
                info, report = closed_loop(endpoint, 64, 10)
                pids = [info["template_pid"], *(w["pid"] for w in info["workers"])]
                result["workers_64"] = {
                    "pss_mib_template_and_workers": sum(map(pss_kib, pids)) / 1024.0,
                    "workers": len(info["workers"]), "start_s": start_s, "batch": 64, "sent": report["sent"],
                    "ok": report["ok"], "predicted_ms": info["plan"]["predicted_latency_ms"],
                    "median_ms": report["latency_ms"]["p50"],
                }  # fmt: skip
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
