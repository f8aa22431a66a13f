"""`packrat simulate` against `packrat serve --runtime emulated` at 16 cores, on the same inputs.

    .venv/bin/python bench/sim_vs_emulated.py [--duration 40] [--seed 3] [--loads 0.3,0.5]

For each shipped 16-core table (bench/profiles/), policy (packrat, single) and load (Poisson at a fraction
of what one 16-thread instance computes at max_batch; requests of 1, 4 or 16 inputs): an emulated daemon
with 16 emulated cores and the default interference under `packrat load --warmup 0`, then the simulation
with the same profile, settings, traffic and seed, twice:
- bare: the simulation with nothing of the daemon's own cost, only when its traffic started (the daemon's
  uptime: its adaptation looks count from its own start);
- modelled: with what the daemon costs (`DaemonCosts`), each measured, never fitted to the latencies it is
  compared with:
  - the work of the daemon's one loop, from the same run's /metrics (scraped before and after it), as the
    daemon sums it by phase (`packrat_loop_seconds` and `packrat_loop_events`): starting a batch, answering
    one, and taking in a request, less the copy of its rows, whose cost per sample comes from an emulated
    daemon of the table scaled by 1e-6 (compute that costs nothing) right after, closed loop at batch 1
    and at max_batch: its read time per request, the difference over the samples between them;
  - each slice's trip to its worker beyond its compute (`packrat_worker_hop_seconds`), from the same run;
  - transport (client to daemon and back): the same run's client mean latency less the daemon's own mean
    from receipt to reply, split into a part per sample (the same difference on the zero-compute daemon,
    closed loop at batch 1 and at max_batch, over the samples between them) and the rest per request.
    Costs are measured in the run itself because on this shared machine they move between runs minutes
    apart (the transport fourfold, 7 to 29 ms);
  - the reconciler's switch time: from the emulated daemon's own log (from "reconciling to generation N"
    to "generation N serves"), the time the old plan kept serving after the decision;
  - the uptime: the daemon's "serving on" log line to the load's first request (`started_unix_s`).
The simulation is sent the requests as `packrat load` sent them (its `--save-trace`: the Poisson schedule,
each request as late as the client's loop let it leave, kept in the row as "sent_trace"), so that two
requests that left together in the run arrive together in the simulation too.
The daemon's own mean from receipt to reply is also set beside the simulation's (its latency less the
transport), which leaves the transport out of the comparison altogether, and split in two as the
daemon's /metrics split it: the queue wait, and the rest (the batch in flight).
Where the emulated median falls among the simulated latencies is given too (as a percentile): where a
median lies on the gap between two modes, one request more on one side moves it by many ms.
`--rescore FILE` simulates a saved run's rows again from their inputs, without the emulated runs.
The warm-up is off so that the daemon's batch-size estimator sees only the traffic the simulation sees.
Both are stand-ins: this checks that they agree, not that either matches a real machine. Prints JSON;
progress on stderr.
"""

from __future__ import annotations

import argparse
import bisect
import datetime
import json
import re
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from harness import DaemonProcess, free_port  # noqa: E402
from stand_ins import TRANSPORT_SCALE, error, scaled  # noqa: E402

from packrat_daemon.config import ServeConfig  # noqa: E402
from packrat_daemon.load.arrivals import BatchMix, Poisson, Trace  # noqa: E402
from packrat_daemon.measure.emulation import Interference  # noqa: E402
from packrat_daemon.simulate import DaemonCosts, Simulation, SimulationResult, Traffic  # noqa: E402
from packrat_daemon.simulate.run import FREE  # noqa: E402
from policies.planning.profile import Profile  # noqa: E402

MODEL = "builtin:resnet50"  # its input stands in for the tables' models (as in bench/emulated.py)
CORES = 16
MIX = "1:0.4,4:0.3,16:0.3"
MAX_BATCH = 16
INTERFERENCE = "default"
POLICIES = ("packrat", "single")
COST_CLOSED_S = 8.0  # each closed-loop run on the zero-compute daemon, for the read cost per sample
LOG_TIME = "%Y-%m-%d %H:%M:%S,%f"  # the daemon's log lines start with this (packrat_daemon.ops.logs.TEXT_FORMAT)
# The daemon's log lines that say how it came to the plan it serves (the production guard's is a warning).
PLAN_LINES = ("packrat.daemon: plan ", "adapting to the live batch sizes", "production timings reverted the plan")
SAMPLE = re.compile(r"^(packrat_\w+(?:\{[^}]*\})?) (\S+)$")

Scrape = dict[str, float]  # one /metrics sample (name with its labels) → value


def scrape(port: int) -> Scrape:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {match.group(1): float(match.group(2)) for line in text.splitlines() if (match := SAMPLE.match(line))}


def delta(before: Scrape, after: Scrape, name: str) -> float:
    return after.get(name, 0.0) - before.get(name, 0.0)


def mean_ms(before: Scrape, after: Scrape, name: str) -> float:
    """The daemon's mean of histogram or summary `name` over what it observed between two scrapes, in ms."""
    count = delta(before, after, f"{name}_count")
    if count <= 0:
        raise RuntimeError(f"the daemon observed no {name} between the two scrapes")
    return 1000.0 * delta(before, after, f"{name}_sum") / count


def loop_ms(before: Scrape, after: Scrape, phase: str) -> tuple[float, float]:
    """The loop's time in `phase` between two scrapes (ms), and how many events it handled."""
    labels = f'{{phase="{phase}"}}'
    seconds = delta(before, after, f"packrat_loop_seconds_total{labels}")
    return 1000.0 * seconds, delta(before, after, f"packrat_loop_events_total{labels}")


def per_event_ms(before: Scrape, after: Scrape, phase: str) -> float:
    total_ms, events = loop_ms(before, after, phase)
    if events <= 0:
        raise RuntimeError(f"the daemon's loop handled no {phase} between the two scrapes")
    return total_ms / events


def run_costs(before: Scrape, after: Scrape, per_sample: dict[str, float]) -> dict[str, Any]:
    """The daemon's own costs over one run, from its /metrics (see the docstring); the transport is added by
    `compare`, from the client's side."""
    read_per_sample_ms = per_sample["read"]
    read_ms, messages = loop_ms(before, after, "read")
    samples = delta(before, after, "packrat_batch_size_sum")
    return {
        "read_ms": [round(max(0.0, read_ms - read_per_sample_ms * samples) / messages, 4), read_per_sample_ms],
        "dispatch_ms": round(per_event_ms(before, after, "dispatch"), 4),
        "answer_ms": [round(per_event_ms(before, after, "answer"), 4), 0.0],
        "hop_ms": round(mean_ms(before, after, "packrat_worker_hop_seconds"), 4),
        "transport_per_sample_ms": per_sample["transport"],
    }


def log_time(line: str) -> float:
    return datetime.datetime.strptime(line[:23], LOG_TIME).timestamp()


def served_since(log: str) -> float:
    """When the daemon's loop started: its "serving on" line."""
    return log_time(next(line for line in log.splitlines() if " serving on " in line))


def switch_times_ms(log: str) -> list[float]:
    """Each re-plan's time from the reconciler's start to the new generation serving (generation 1 is start-up)."""
    started: dict[str, float] = {}
    times = []
    for line in log.splitlines():
        if (match := re.search(r"reconciling to generation (\d+)", line)) and match.group(1) != "1":
            started[match.group(1)] = log_time(line)
        elif (match := re.search(r"generation (\d+) serves", line)) and match.group(1) in started:
            times.append(1000.0 * (log_time(line) - started[match.group(1)]))
    return times


def load(endpoint: str, *args: str) -> dict[str, Any]:
    command = [sys.executable, "-m", "packrat_daemon", "load", "--endpoint", endpoint, "--warmup", "0", "--quiet",
               "--json", *args]  # fmt: skip
    return json.loads(subprocess.run(command, cwd=REPO, check=True, capture_output=True, text=True).stdout)


def poisson(endpoint: str, rate: float, duration: float, seed: int, trace: Path) -> dict[str, Any]:
    """`packrat load`'s report, with the requests as they left (its --save-trace) in "sent_trace"."""
    report = load(endpoint, "--rate", str(rate), "--batches", MIX, "--duration", str(duration), "--seed", str(seed),
                  "--save-trace", str(trace))  # fmt: skip
    report["sent_trace"] = [[round(t_s, 5), samples] for t_s, samples in Trace.read(trace).rows]
    return report


def per_sample_ms(daemon: DaemonProcess, port: int) -> dict[str, float]:
    """Per sample, on a daemon whose compute costs nothing (see the docstring): the loop's cost of taking a
    request in (the copy of its rows), and the transport (the client's mean less the daemon's own)."""
    read, transport = {}, {}
    for batch in (1, MAX_BATCH):
        before = scrape(port)
        report = load(daemon.endpoint, "--batch", str(batch), "--concurrency", "1", "--duration", str(COST_CLOSED_S))
        after = scrape(port)
        read[batch] = per_event_ms(before, after, "read")
        transport[batch] = report["latency_mean_ms"] - mean_ms(before, after, "packrat_request_latency_seconds")
    return {name: round(max(0.0, (by_batch[MAX_BATCH] - by_batch[1]) / (MAX_BATCH - 1)), 5)
            for name, by_batch in (("read", read), ("transport", transport))}  # fmt: skip


def mean_samples(row: dict[str, Any]) -> float:
    """Inputs per request over the run's requests as they left."""
    return sum(samples for _, samples in row["sent_trace"]) / len(row["sent_trace"])


def transport_pair(costs: dict[str, Any]) -> tuple[float, float]:
    """(fixed, per sample) ms; rows saved before the transport had a part per sample have one figure."""
    transport = costs["transport_ms"]
    return (float(transport), 0.0) if isinstance(transport, int | float) else (transport[0], transport[1])


def simulate(
    table: Profile, policy: str, row: dict[str, Any], args: argparse.Namespace, costs: dict[str, Any] | None
) -> SimulationResult:
    """The simulation of `row`'s run: the requests as its load sent them when the row has them, else the
    Poisson schedule they were sent on (rows saved before the trace was kept)."""
    config = ServeConfig(policy=policy, max_batch=MAX_BATCH, batches=[MAX_BATCH], max_delay_ms=1.0)
    mix, uptime_s = BatchMix.parse(MIX), row["uptime_s"]
    if "sent_trace" in row:
        sent = Trace(tuple((t_s, samples) for t_s, samples in row["sent_trace"]))
        traffic = Traffic(mix, process=sent, seed=args.seed, uptime_s=uptime_s)
    else:
        traffic = Traffic(mix, process=Poisson(row["rate_rps"]), duration_s=args.duration, seed=args.seed,
                          uptime_s=uptime_s)  # fmt: skip
    interference = Interference.named(INTERFERENCE)
    daemon_costs = FREE if costs is None else DaemonCosts(**{
        **{k: tuple(v) if isinstance(v, list) else v for k, v in costs.items() if k != "transport_per_sample_ms"},
        "transport_ms": transport_pair(costs)})  # fmt: skip
    return Simulation(config, table, CORES, interference, daemon_costs).run(traffic)


def percentile_of(result: SimulationResult, latency_ms: float) -> float:
    """Which percentile of the simulation's latencies `latency_ms` is: where the emulated median falls in the
    simulated distribution. Near a gap between two modes a median moves by many ms for one request; this
    says by how many requests."""
    latencies = sorted(1000.0 * latency for latency in result.tally.latencies_s)
    return round(100.0 * bisect.bisect_left(latencies, latency_ms) / len(latencies), 2)


def quantiles(report: dict[str, Any]) -> dict[str, float]:
    return {q: report["latency_ms"][q] for q in ("p50", "p99")}


def compare(name: str, table: Profile, policy: str, rate: float, load_share: float, args: argparse.Namespace,
            emulated: dict[str, Any], log: str, costs: dict[str, Any],
            daemon: tuple[float, float]) -> dict[str, Any]:  # fmt: skip
    """`daemon`: the emulated daemon's means over the run, from receipt to reply and of the queue wait (ms)."""
    daemon_ms, queue_ms = daemon
    uptime_s = emulated["started_unix_s"] - served_since(log)
    switches = switch_times_ms(log)
    # The run's mean transport, split as the zero-compute daemon's sizes split it: a part per sample, the
    # rest fixed.
    transport_ms = max(0.0, emulated["latency_mean_ms"] - daemon_ms)
    per_sample = costs.pop("transport_per_sample_ms")
    fixed = max(0.0, transport_ms - per_sample * mean_samples(emulated))
    costs = {**costs, "transport_ms": [round(fixed, 3), per_sample],
             "switch_ms": round(sum(switches) / len(switches), 3) if switches else 0.0}  # fmt: skip
    row = {
        "table": name, "policy": policy, "load": load_share, "rate_rps": rate, "uptime_s": round(uptime_s, 3),
        "costs": costs, "switch_ms_measured": [round(ms, 1) for ms in switches], "emulated_ms": quantiles(emulated),
        "daemon_mean_ms": {"emulated": round(daemon_ms, 3)},
        # The daemon's time in two: waiting to be batched, then its batch in flight (sent, computed, gathered).
        "queue_wait_mean_ms": {"emulated": round(queue_ms, 3)},
        "in_flight_mean_ms": {"emulated": round(daemon_ms - queue_ms, 3)},
        "emulated_sent_ok_errors": [emulated["sent"], emulated["ok"], emulated["errors"]],
        "emulated_plan_log": emulated["plan_log"],
        "sent_trace": emulated["sent_trace"],  # what the simulation is sent: the load's requests as they left
        "emulated_by_samples": by_samples(emulated),
    }  # fmt: skip
    return simulated_side(row, table, args)


def by_samples(report: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per request size, its count, p50 and p99 (`packrat load`'s `latency_ms_by_samples`)."""
    return {size: {"ok": sizes["ok"], "p50": sizes["p50"], "p99": sizes["p99"]}
            for size, sizes in report.get("latency_ms_by_samples", {}).items()}  # fmt: skip


def simulated_side(row: dict[str, Any], table: Profile, args: argparse.Namespace) -> dict[str, Any]:
    """The simulation of one emulated run, bare and modelled, set beside it (every field it adds is made
    here, so --rescore remakes them all from a saved run's inputs)."""
    policy, costs = row["policy"], row["costs"]
    emulated = row["emulated_ms"]
    bare = simulate(table, policy, row, args, None).to_json()
    result = simulate(table, policy, row, args, costs)
    modelled = result.to_json()
    daemon_ms = row["daemon_mean_ms"]["emulated"]
    fixed, per_sample = transport_pair(costs)
    simulated_daemon_ms = modelled["latency_mean_ms"] - (fixed + per_sample * mean_samples(row))
    simulated_queue_ms = modelled["queue_wait_mean_ms"]
    return {
        **row, "simulated_ms": quantiles(modelled), "bare_ms": quantiles(bare),
        "error": {q: error(modelled["latency_ms"][q], emulated[q]) for q in ("p50", "p99")},
        "error_bare": {q: error(bare["latency_ms"][q], emulated[q]) for q in ("p50", "p99")},
        "emulated_p50_is_simulated_percentile": percentile_of(result, emulated["p50"]),
        "daemon_mean_ms": {"emulated": daemon_ms, "simulated": round(simulated_daemon_ms, 3),
                           "error": error(simulated_daemon_ms, daemon_ms)},
        "queue_wait_mean_ms": {**row["queue_wait_mean_ms"], "simulated": simulated_queue_ms},
        "in_flight_mean_ms": {**row["in_flight_mean_ms"],
                              "simulated": round(simulated_daemon_ms - simulated_queue_ms, 3)},
        "simulated_sent_ok_errors": [modelled["sent"], modelled["ok"], modelled["errors"]],
        # Each size's own median: the sizes form separate modes, and the overall one can sit on a gap.
        "simulated_by_samples": by_samples(modelled),
        "error_by_samples": {size: {q: error(by_samples(modelled)[size][q], emulated_size[q]) for q in ("p50", "p99")}
                             for size, emulated_size in row.get("emulated_by_samples", {}).items()},
        "simulated_plan_changes": modelled["plan_changes"],
    }  # fmt: skip


def profile_of(name: str) -> Profile:
    return Profile.read_csv(REPO / "bench" / "profiles" / f"{name}-cloudlab16.csv")


def rescore(path: str) -> dict[str, Any]:
    """A saved run's simulated side made again from its inputs (the simulation is deterministic), for when
    the simulation's code changed and the emulated runs need not."""
    saved = json.loads(Path(path).read_text())
    args = argparse.Namespace(duration=saved["duration_s"], seed=saved["seed"])
    saved["rows"] = [simulated_side(row, profile_of(row["table"]), args) for row in saved["rows"]]
    return saved


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--duration", type=float, default=40.0, help="seconds of traffic per emulated run")
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--loads", default="0.3,0.5", help="offered load, over one 16-thread instance at max_batch")
    parser.add_argument("--tables", default="inception3,bert")
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--rescore", metavar="FILE.json", help="only simulate again a saved run's rows")
    args = parser.parse_args()
    if args.rescore:
        print(json.dumps(rescore(args.rescore), indent=1))
        return
    loads = [float(share) for share in args.loads.split(",")]
    rows = []
    for name in args.tables.split(","):
        path = REPO / "bench" / "profiles" / f"{name}-cloudlab16.csv"
        table = profile_of(name)
        alone_ms = table.lhat(CORES, MAX_BATCH)
        assert alone_ms is not None
        rates = {share: round(share * MAX_BATCH / (alone_ms / 1000.0) / BatchMix.parse(MIX).mean, 3) for share in loads}
        with tempfile.TemporaryDirectory(prefix="packrat-sim-vs-emulated-") as folder:
            work = Path(folder)
            tiny = work / "tiny.csv"
            scaled(table, TRANSPORT_SCALE).write_csv(tiny)
            for policy in args.policies.split(","):
                port = free_port()
                common = [
                    "--model", MODEL, "--policy", policy, "--max-batch", str(MAX_BATCH), "--max-delay-ms", "1.0",
                    "--split-check-rounds", "0", "--runtime", "emulated", "--emulate-cores", str(CORES),
                    "--emulate-interference", INTERFERENCE, "--metrics-port", str(port), "--log-level", "info",
                ]  # fmt: skip
                for share in loads:
                    daemon = DaemonProcess(f"emulated-{policy}-{share}", work, [*common, "--profile", str(path)])
                    try:
                        daemon.wait()
                        before = scrape(port)
                        sent = work / f"sent-{policy}-{share}.csv"
                        emulated = poisson(daemon.endpoint, rates[share], args.duration, args.seed, sent)
                        after = scrape(port)
                        daemon_ms = mean_ms(before, after, "packrat_request_latency_seconds")
                        queue_ms = mean_ms(before, after, "packrat_queue_wait_seconds")
                    finally:
                        daemon.close()
                    log = daemon.log_path.read_text(errors="replace")
                    emulated["plan_log"] = [line.split(": ", 1)[-1] for line in log.splitlines()
                                            if any(marker in line for marker in PLAN_LINES)]  # fmt: skip
                    daemon = DaemonProcess(f"costs-{policy}-{share}", work, [*common, "--profile", str(tiny)])
                    try:
                        daemon.wait()
                        costs = run_costs(before, after, per_sample_ms(daemon, port))
                    finally:
                        daemon.close()
                    row = compare(
                        name, table, policy, rates[share], share, args, emulated, log, costs, (daemon_ms, queue_ms)
                    )
                    rows.append(row)
                    print(f"{name} {policy} load {share}: error {row['error']}, bare {row['error_bare']}, daemon "
                          f"mean {row['daemon_mean_ms']}, costs {row['costs']}", file=sys.stderr)  # fmt: skip
    print(json.dumps({
        "traffic": f"poisson at each load × one {CORES}-thread instance's capacity at max_batch, batch {MIX}",
        "cores": CORES, "interference": INTERFERENCE, "duration_s": args.duration, "seed": args.seed, "rows": rows,
    }, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
