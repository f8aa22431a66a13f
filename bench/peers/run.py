"""Packrat against the real servers, side by side in one run: TorchServe 0.12 (at its defaults, and the best of a
worker sweep under its CPU launcher), Triton 2.51 through nvidia-pytriton (at its defaults, and the best of the
search Model Analyzer would run) and Packrat at its defaults (over the Open Inference Protocol and over its ZeroMQ
client). Then MLPerf LoadGen's SingleStream and Server scenarios for Packrat and the best peer. Prints one JSON
object (and writes it with --out); docs/peers.md has the tables and what each peer was configured with.

    .venv/bin/python bench/peers/run.py --out bench/results/peers-resnet50.json        # the full run, ~25 min
    .venv/bin/python bench/peers/run.py --duration 2 --search-duration 1 --rounds 1 \\
        --loadgen-duration 5 --out /tmp/peers-smoke.json                             # a smoke run

Install the peers first: bash bench/peers/install_torchserve.sh, install_triton.sh, install_loadgen.sh.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import HERE, REPO, PeerMissing, dump, require  # noqa: E402
from load import measure  # noqa: E402
from packrat_peer import PackratServer  # noqa: E402
from payload import MODELS  # noqa: E402
from torchserve import TorchServe, build_archive  # noqa: E402
from triton_peer import TritonServer, default_config, search_space  # noqa: E402

LOADGEN = HERE / "loadgen.py"
ALL_PEERS = ("torchserve", "triton")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="resnet50", choices=sorted(MODELS))
    parser.add_argument("--peers", default=",".join(ALL_PEERS), help="which peers (default: torchserve,triton)")
    parser.add_argument("--concurrency", default="1,2,4,8", help="closed-loop concurrencies (default 1,2,4,8)")
    parser.add_argument("--batches", default="1,8", help="samples per request (default 1,8)")
    parser.add_argument(
        "--rate-fractions",
        default="0.3,0.6,0.9",
        help="open-loop Poisson rates, as fractions of the highest closed-loop throughput any configuration reached "
        "at that batch size in this run (default 0.3,0.6,0.9)",
    )
    parser.add_argument("--rates", help="fixed Poisson rates (requests/s) instead, the same for every batch size")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per point per configuration (default 5)")
    parser.add_argument("--warmup", type=float, default=1.0, help="uncounted seconds before each point (default 1)")
    parser.add_argument("--rounds", type=int, default=1, help="rounds over every point; medians across (default 1)")
    parser.add_argument(
        "--search-duration", type=float, default=3.0, help="seconds per probe in the peers' searches (default 3)"
    )
    parser.add_argument(
        "--probe-concurrency", default="1,4", help="closed-loop concurrencies the searches probe, at each batch size"
    )
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds a request may take (default 60)")
    parser.add_argument("--triton-max-batch", default="8,16", help="max_batch_size values Triton's search tries")
    parser.add_argument("--triton-queue-delay-us", type=int, default=2000, help="dynamic batcher delay in the search")
    parser.add_argument("--torchserve-batch", default="1,4", help="TorchServe batch_size values its sweep tries")
    parser.add_argument("--torchserve-batch-delay-ms", type=int, default=5, help="max_batch_delay in the sweep")
    parser.add_argument("--loadgen", action=argparse.BooleanOptionalAction, default=True, help="run MLPerf LoadGen")
    parser.add_argument("--loadgen-duration", type=float, default=15.0, help="seconds per LoadGen test (default 15)")
    parser.add_argument("--bound-ms", type=float, default=None, help="Server scenario's p99 bound (default per model)")
    parser.add_argument(
        "--loadgen-out", help="folder for LoadGen's summaries (default bench/results/peers-loadgen-MODEL)"
    )
    parser.add_argument(
        "--pinned", action=argparse.BooleanOptionalAction, default=True,
        help="also serve Packrat pinned to torch at fp32, the peers' runtime, so the scheduling is compared alone",
    )  # fmt: skip
    parser.add_argument("--out", help="write the JSON here too")
    parser.add_argument("--note", help="a label kept in the JSON (e.g. how busy the machine was)")
    parser.add_argument("--work", help="folder for logs and archives (default: a temporary one, kept on failure)")
    return parser.parse_args()


def ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part]


def floats(text: str) -> list[float]:
    return [float(part) for part in text.split(",") if part]


def log(message: str) -> None:
    print(f"[peers {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(value) for value in values) / len(values))


def probe_score(target: dict[str, Any], args: argparse.Namespace, probes: list[tuple[int, int]]) -> dict[str, Any]:
    """A configuration's p99 at each probe point (closed loop); its score is their geometric mean (inf if any
    request failed)."""
    results = {}
    for concurrency, batch in probes:
        report = asyncio.run(
            measure(
                target,
                args.model,
                batch,
                {"concurrency": concurrency},
                args.search_duration,
                min(args.warmup, 1.0),
                args.timeout,
            )
        )
        results[f"c{concurrency}_b{batch}"] = {
            "p99": report["latency_ms"]["p99"],
            "errors": report["errors"],
            "throughput_rps": report["throughput_rps"],
        }
    p99s = [entry["p99"] for entry in results.values()]
    failed = any(entry["errors"] for entry in results.values()) or None in p99s
    return {"probes": results, "score_p99_geomean_ms": None if failed else round(geomean(p99s), 2)}


def pick_best(scored: dict[str, dict[str, Any]]) -> str:
    usable = {name: entry for name, entry in scored.items() if entry["score_p99_geomean_ms"] is not None}
    if not usable:
        raise RuntimeError(f"every configuration failed a probe: {dump(scored)}")
    return min(usable, key=lambda name: usable[name]["score_p99_geomean_ms"])


def main() -> int:
    args = parse_args()
    # SIGTERM ends the run like Ctrl-C: the servers started so far are stopped on the way out.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    peers = [peer for peer in args.peers.split(",") if peer]
    cores = len(os.sched_getaffinity(0))
    model = MODELS[args.model]
    bound_ms = args.bound_ms or {"resnet50": 100.0, "bert-base": 300.0}[args.model]
    try:
        for peer in peers:
            require(peer)
        if args.loadgen:
            require("loadgen")
    except PeerMissing as missing:
        print(f"error: {missing}", file=sys.stderr)
        return 2
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="packrat-peers-"))
    work.mkdir(parents=True, exist_ok=True)
    run_began = time.monotonic()
    concurrencies, batches = ints(args.concurrency), ints(args.batches)
    probes = [(concurrency, batch) for batch in batches for concurrency in ints(args.probe_concurrency)]
    result: dict[str, Any] = {
        "bench": "peers",
        "note": args.note,
        "model": model["spec"],
        "cores": cores,
        "machine": os.uname().nodename,
        "load_average_at_start": os.getloadavg(),
        "options": vars(args),
        "configured": {},
        "search": {},
        "started_s": {},
    }
    servers: list[Any] = []
    targets: dict[str, dict[str, Any]] = {}
    try:
        # Packrat first, alone on the machine while it measures the cells it plans from.
        # A state folder of this run's own: at its defaults Packrat keeps what a first start measured (the runtime
        # and precision chosen, the profile) and a restart serves from it at once; this run times a first start.
        # The conversion cache is left as it is: converting the model once is a one-time cost of a machine.
        env = {**os.environ, "XDG_STATE_HOME": str(work / "state")}
        env.pop("STATE_DIRECTORY", None)
        log("starting Packrat at its defaults")
        packrat = PackratServer("packrat", model["spec"], work, env=env)
        servers.append(packrat)
        packrat.start()
        result["started_s"]["packrat"] = round(packrat.started_s, 1)
        result["configured"]["packrat_oip"] = result["configured"]["packrat_zmq"] = packrat.describe()
        targets["packrat_oip"] = packrat.oip_target(args.model)
        targets["packrat_zmq"] = packrat.zmq_target()
        if args.pinned:
            # The peers serve the model with torch at fp32: this daemon, pinned to the same, shows how much of the
            # difference is Packrat's scheduling and how much its choice of runtime and precision.
            log("starting Packrat pinned to torch at fp32")
            pinned_args = ["--runtime", "torch", "--precision", "fp32", "--state-dir", "none"]
            pinned = PackratServer("packrat-torch", model["spec"], work, pinned_args)
            servers.append(pinned)
            pinned.start()
            result["started_s"]["packrat_torch"] = round(pinned.started_s, 1)
            result["configured"]["packrat_torch"] = pinned.describe()
            targets["packrat_torch"] = pinned.oip_target(args.model)

        if "triton" in peers:
            log("starting Triton with its defaults and the search's configurations")
            began = time.monotonic()
            space = search_space(cores, ints(args.triton_max_batch), args.triton_queue_delay_us)
            triton = TritonServer("triton", args.model, work, [default_config(cores), *space])
            servers.append(triton)
            triton.start()
            result["started_s"]["triton_all_configurations"] = round(time.monotonic() - began, 1)
            targets["triton_default"] = triton.target("triton_default")
            result["configured"]["triton_default"] = triton.describe("triton_default")
            log("Triton's search: instances × dynamic batching × max_batch_size")
            scored = {}
            for config in space:
                scored[config["name"]] = {"config": config, **probe_score(triton.target(config["name"]), args, probes)}
                log(f"  {config['name']}: score {scored[config['name']]['score_p99_geomean_ms']} ms")
            best = pick_best(scored)
            result["search"]["triton"] = {
                "configurations": scored,
                "best": best,
                "search_s": round(time.monotonic() - began, 1),
                "note": "search_s includes starting Triton with every configuration",
            }
            targets["triton_best"] = triton.target(best)
            result["configured"]["triton_best"] = triton.describe(best)

        ts_tuned = None
        if "torchserve" in peers:
            # One TorchServe server at a time: a second one on this machine shut itself down (its JVM's shutdown
            # hook ran) as its first worker started, so the defaults get a pass of their own after the others.
            store = build_archive(args.model, work / "store")
            log("TorchServe's sweep: CPU launcher × workers × batch_size")
            began = time.monotonic()
            ts_tuned = TorchServe("torchserve-launcher", args.model, work, launcher=True, preload=False)
            servers.append(ts_tuned)
            ts_tuned.start(store.parent)
            scored = {}
            for workers in range(1, cores + 1):
                for batch_size in ints(args.torchserve_batch):
                    name = f"ts_w{workers}_b{batch_size}"
                    ts_tuned.register(name, workers, batch_size, args.torchserve_batch_delay_ms)
                    scored[name] = {
                        "config": ts_tuned.describe(name),
                        **probe_score(ts_tuned.target(name), args, probes),
                    }
                    log(f"  {name}: score {scored[name]['score_p99_geomean_ms']} ms")
                    ts_tuned.unregister(name)  # one at a time: workers of another config would hold the cores' memory
            best = pick_best(scored)
            best_config = scored[best]["config"]
            ts_tuned.register(best, best_config["workers"], best_config["batch_size"], args.torchserve_batch_delay_ms)
            result["search"]["torchserve"] = {
                "configurations": scored,
                "best": best,
                "search_s": round(time.monotonic() - began, 1),
            }
            targets["torchserve_best"] = ts_tuned.target(best)
            result["configured"]["torchserve_best"] = ts_tuned.describe(best)

        result["packrat_plan_before_measuring"] = packrat.plan_now()
        log(f"pass A: {', '.join(targets)} taking turns")
        points = run_points(args, targets, concurrencies, batches)
        checkpoint(args, result, points=points, summary=summarize(points, list(targets)))
        best_peer = summarize(points, list(targets))["best_peer"]
        if args.loadgen and best_peer is not None:
            loadgen_dir = Path(args.loadgen_out or REPO / "bench" / "results" / f"peers-loadgen-{args.model}")
            result["loadgen"] = run_loadgen(
                args, {"packrat_oip": targets["packrat_oip"], best_peer: targets[best_peer]}, bound_ms, loadgen_dir
            )
        names = list(targets)
        if ts_tuned is not None:
            ts_tuned.close()
            log("starting TorchServe at its defaults")
            began = time.monotonic()
            ts_default = TorchServe("torchserve-default", args.model, work, launcher=False, preload=True)
            servers.append(ts_default)
            ts_default.start(store.parent)
            result["started_s"]["torchserve_default"] = round(time.monotonic() - began, 1)
            result["configured"]["torchserve_default"] = ts_default.describe(args.model)
            second = {"packrat_oip_b": targets["packrat_oip"], "torchserve_default": ts_default.target(args.model)}
            log(f"pass B: {', '.join(second)} taking turns")
            checkpoint(args, result, points=points)
            run_points(args, second, concurrencies, batches, template=points)
            names += list(second)
        result["packrat_plan_after_measuring"] = packrat.plan_now()
        result["points"] = points
        result["summary"] = summarize(points, names)
    finally:
        for server in reversed(servers):
            server.close()
    result["run_s"] = round(time.monotonic() - run_began, 1)
    result["work"] = str(work)
    text = dump(result)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


def checkpoint(args: argparse.Namespace, result: dict[str, Any], **parts: Any) -> None:
    """What is measured so far to --out, marked partial, so that a run stopped later keeps it."""
    if args.out:
        Path(args.out).write_text(dump({**result, **parts, "partial": True}) + "\n")


def run_points(
    args: argparse.Namespace,
    targets: dict[str, dict[str, Any]],
    concurrencies: list[int],
    batches: list[int],
    template: list[dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Every point, the configurations taking turns (the order rotating from point to point and round to round);
    closed-loop points first, so that the Poisson rates can follow from the throughputs they reached. With
    `template` (an earlier pass's points), the same points again, their runs added to those points."""
    names = list(targets)
    points: list[dict[str, Any]] = []
    closed = [{"batch": batch, "concurrency": concurrency} for batch in batches for concurrency in concurrencies]
    turn = 0
    for phase in ("closed", "poisson"):
        if template is not None:
            todo = [point for point in template if ("concurrency" in point) == (phase == "closed")]
            for point in todo:
                point["runs"].update({name: [] for name in names})
        elif phase == "poisson":
            todo = []
            for batch in batches:
                if args.rates:
                    rates = floats(args.rates)
                else:
                    capacity = max(
                        (run["throughput_rps"] or 0.0)
                        for done in points
                        if done["batch"] == batch and "concurrency" in done
                        for runs in done["runs"].values()
                        for run in runs
                    )
                    rates = [round(fraction * capacity, 2) for fraction in floats(args.rate_fractions)]
                todo += [{"batch": batch, "rate": rate} for rate in rates if rate > 0]
        else:
            todo = closed
        if template is None:
            for point in todo:
                point["runs"] = {name: [] for name in names}
        points += todo
        for round_index in range(args.rounds):
            for point in todo:
                order = names[turn % len(names) :] + names[: turn % len(names)]
                turn += 1
                label = f"B={point['batch']} " + (
                    f"c={point['concurrency']}" if "concurrency" in point else f"{point['rate']}/s"
                )
                for name in order:
                    spec = {key: point[key] for key in ("concurrency", "rate") if key in point}
                    report = asyncio.run(
                        measure(
                            targets[name],
                            args.model,
                            point["batch"],
                            spec,
                            args.duration,
                            args.warmup,
                            args.timeout,
                            seed=round_index,
                        )
                    )
                    point["runs"][name].append(report)
                    log(
                        f"{label} round {round_index + 1}: {name} p50 {report['latency_ms']['p50']} "
                        f"p99 {report['latency_ms']['p99']} ms, {report['throughput_rps']}/s, errors {report['errors']}"
                    )
    return points


def _median(values: list[Any]) -> Any:
    present = [value for value in values if value is not None]
    return round(statistics.median(present), 2) if present else None


def _ratio(mine: float, theirs: float) -> float | None:
    if math.isinf(mine) or math.isinf(theirs) or theirs <= 0:
        return None
    return round(mine / theirs, 3)


def summarize(points: list[dict[str, Any]], names: list[str]) -> dict[str, Any]:
    """Per point and configuration the medians across rounds; the ratios the issue's targets are stated in. Each
    peer is compared with the Packrat runs of its own pass (packrat_oip_b for TorchServe's defaults)."""
    table = []
    for point in points:
        row: dict[str, Any] = {key: point[key] for key in ("batch", "concurrency", "rate") if key in point}
        for name in names:
            runs = point["runs"][name]
            row[name] = {
                **{q: _median([run["latency_ms"][q] for run in runs]) for q in ("p50", "p90", "p99")},
                "throughput_rps": _median([run["throughput_rps"] for run in runs]),
                "errors": sum(sum(run["errors"].values()) for run in runs),
            }
        table.append(row)
    peers = [name for name in names if not name.startswith("packrat")]

    def p99(row: dict[str, Any], name: str) -> float:
        value = row[name]["p99"]
        return math.inf if value is None or row[name]["errors"] else value

    def reference(peer: str) -> str:
        return "packrat_oip_b" if peer == "torchserve_default" and "packrat_oip_b" in names else "packrat_oip"

    candidates = [name for name in peers if reference(name) == "packrat_oip"]  # measured in Packrat's main pass
    scores = {name: geomean([min(p99(row, name), 1e9) for row in table]) for name in candidates}
    best_peer = min(scores, key=lambda name: scores[name]) if scores else None
    checks = []
    for row in table:
        entry: dict[str, Any] = {key: row[key] for key in ("batch", "concurrency", "rate") if key in row}
        ratios = {peer: _ratio(p99(row, reference(peer)), p99(row, peer)) for peer in peers}
        entry["packrat_p99_vs"] = ratios
        if "torchserve_default" in ratios:
            entry["packrat_vs_torchserve_default_p99"] = ratios["torchserve_default"]
        known = {peer: ratio for peer, ratio in ratios.items() if ratio is not None}
        if known:
            worst = max(known, key=lambda peer: known[peer])
            entry.update(best_peer_here=worst, packrat_vs_best_peer_p99=known[worst], within_5pct=known[worst] <= 1.05)
        entry["packrat_zmq_vs_oip_p99"] = _ratio(p99(row, "packrat_zmq"), p99(row, "packrat_oip"))
        if "packrat_torch" in names and candidates:
            # Pinned to the peers' runtime: its p99 against the lowest peer p99 of its own pass.
            lowest = min(candidates, key=lambda peer: p99(row, peer))
            entry["packrat_torch_vs_best_peer_p99"] = _ratio(p99(row, "packrat_torch"), p99(row, lowest))
        checks.append(entry)
    closed_ts = [
        entry.get("packrat_vs_torchserve_default_p99")
        for entry in checks
        if "concurrency" in entry and "torchserve_default" in peers
    ]
    return {
        "table": table,
        "checks": checks,
        "peer_scores_p99_geomean_ms": {name: round(score, 2) for name, score in scores.items()},
        "best_peer": best_peer,
        "targets": {
            "packrat_p99_below_torchserve_default_every_concurrency": bool(closed_ts)
            and all(ratio is not None and ratio < 1 for ratio in closed_ts),
            "packrat_within_5pct_of_best_peer_every_point": all(entry.get("within_5pct", False) for entry in checks),
            "points_missed": [entry for entry in checks if not entry.get("within_5pct", False)],
        },
    }


def run_loadgen(
    args: argparse.Namespace, targets: dict[str, dict[str, Any]], bound_ms: float, out: Path
) -> dict[str, Any]:
    """bench/peers/loadgen.py in LoadGen's own environment, for each target in turn: SingleStream, then the
    Server scenario's search for the highest QPS whose p99 is under `bound_ms`."""
    python = str(require("loadgen") / "bin/python")
    results: dict[str, Any] = {
        "bound_ms": bound_ms,
        "summaries": str(out.relative_to(REPO)) if out.is_relative_to(REPO) else str(out),
    }
    for scenario in ("SingleStream", "Server"):
        for name, target in targets.items():
            log(f"LoadGen {scenario}: {name}")
            command = [
                python,
                str(LOADGEN),
                "--target",
                json.dumps(target),
                "--name",
                name,
                "--model",
                args.model,
                "--scenario",
                scenario,
                "--duration",
                str(args.loadgen_duration),
                "--bound-ms",
                str(bound_ms),
                "--timeout",
                str(args.timeout),
                "--out",
                str(out / name),
            ]
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode != 0:
                raise RuntimeError(f"loadgen.py failed for {name} {scenario}: {done.stderr[-3000:]}")
            results.setdefault(name, {})[scenario] = json.loads(done.stdout)
    return results


if __name__ == "__main__":
    sys.exit(main())
