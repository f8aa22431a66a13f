"""Packrat against the real servers, side by side in one run: TorchServe 0.12 (at its defaults, and the best of a
worker sweep under its CPU launcher), Triton 2.51 through nvidia-pytriton (at its defaults, and the best of the
search Model Analyzer would run) and Packrat at its defaults (over the Open Inference Protocol and over its ZeroMQ
client). Then MLPerf LoadGen's SingleStream and Server scenarios for Packrat and the best peer. Prints one JSON
object (and writes it with --out); docs/peers.md has the tables and what each peer was configured with.

    .venv/bin/python bench/peers/run.py --out bench/results/peers-resnet50.json        # the full run, ~25 min
    .venv/bin/python bench/peers/run.py --duration 2 --search-duration 1 --rounds 1 \\
        --loadgen-duration 5 --out /tmp/peers-smoke.json                             # a smoke run
    .venv/bin/python bench/peers/run.py --same-runtime --out bench/results/peers-resnet50-torch.json

--same-runtime serves every server on torch at fp32 (Packrat pinned to it, the peers as always): the scheduling
alone is compared, and the summary says at which points Packrat's p50 and p99 are at or below the best peer's.

Install the peers first: bash bench/peers/install_torchserve.sh, install_triton.sh, install_loadgen.sh.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import REPO, PeerMissing, dump, require  # noqa: E402
from packrat_peer import PackratServer  # noqa: E402
from passes import checkpoint, ints, log, pick_best, probe_score, run_loadgen, run_points  # noqa: E402
from payload import MODELS  # noqa: E402
from summary import summarize  # noqa: E402
from torchserve import TorchServe, build_archive  # noqa: E402
from triton_peer import TritonServer, default_config, search_space  # noqa: E402

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
    parser.add_argument(
        "--same-runtime", action="store_true",
        help="every server on torch at fp32: Packrat pinned to it is the one judged, Packrat at its defaults is not "
        "started, so the scheduling is compared alone",
    )  # fmt: skip
    parser.add_argument(
        "--torchserve-defaults", action=argparse.BooleanOptionalAction, default=True,
        help="pass B: TorchServe at its defaults against Packrat again (one TorchServe server at a time)",
    )  # fmt: skip
    parser.add_argument("--out", help="write the JSON here too")
    parser.add_argument("--note", help="a label kept in the JSON (e.g. how busy the machine was)")
    parser.add_argument("--work", help="folder for logs and archives (default: a temporary one, kept on failure)")
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    # SIGTERM ends the run like Ctrl-C: the servers started so far are stopped on the way out.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    peers = [peer for peer in args.peers.split(",") if peer]
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
    run = Run(args, peers, work)
    try:
        run.serve_packrat()
        if "triton" in peers:
            run.search_triton()
        if "torchserve" in peers:
            run.search_torchserve()
        run.measure()
    finally:
        for server in reversed(run.servers):
            server.close()
    result = run.result
    result["run_s"] = round(time.monotonic() - run.began, 1)
    result["load_average_at_end"] = os.getloadavg()
    result["work"] = str(work)
    text = dump(result)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


class Run:
    """One run's servers, targets and result, step by step (main). Under --same-runtime the Packrat judged is the
    daemon pinned to torch at fp32 (`packrat_torch`) and Packrat at its defaults is not started: every server runs
    the model on torch at fp32, so what differs is the scheduling alone."""

    def __init__(self, args: argparse.Namespace, peers: list[str], work: Path) -> None:
        self.args, self.peers, self.work = args, peers, work
        self.began = time.monotonic()
        self.cores = len(os.sched_getaffinity(0))
        self.model = MODELS[args.model]
        self.packrat_name = "packrat_torch" if args.same_runtime else "packrat_oip"
        self.servers: list[Any] = []
        self.targets: dict[str, dict[str, Any]] = {}
        self.packrat: PackratServer | None = None  # the daemon judged (its plan is read before and after)
        self.store: Path | None = None
        self.ts_tuned: TorchServe | None = None
        self.result: dict[str, Any] = {
            "bench": "peers",
            "mode": "same-runtime (torch fp32 everywhere)" if args.same_runtime else "defaults",
            "note": args.note,
            "model": self.model["spec"],
            "cores": self.cores,
            "machine": os.uname().nodename,
            "load_average_at_start": os.getloadavg(),
            "options": vars(args),
            "packrat": self.packrat_name,
            "configured": {},
            "search": {},
            "started_s": {},
        }

    def serve_packrat(self) -> None:
        """Packrat first, alone on the machine while it measures the cells it plans from."""
        result, model = self.result, self.model
        if not self.args.same_runtime:
            # A state folder of this run's own: at its defaults Packrat keeps what a first start measured (the
            # runtime and precision chosen, the profile) and a restart serves from it at once; this run times a first
            # start. The conversion cache is left as it is: converting the model once is a one-time cost.
            env = {**os.environ, "XDG_STATE_HOME": str(self.work / "state")}
            env.pop("STATE_DIRECTORY", None)
            log("starting Packrat at its defaults")
            packrat = self.packrat = PackratServer("packrat", model["spec"], self.work, env=env)
            self.servers.append(packrat)
            packrat.start()
            result["started_s"]["packrat"] = round(packrat.started_s, 1)
            result["configured"]["packrat_oip"] = result["configured"]["packrat_zmq"] = packrat.describe()
            self.targets["packrat_oip"] = packrat.oip_target(self.args.model)
            self.targets["packrat_zmq"] = packrat.zmq_target()
        if self.args.pinned or self.args.same_runtime:
            # The peers serve the model with torch at fp32: this daemon, pinned to the same, shows how much of the
            # difference is Packrat's scheduling and how much its choice of runtime and precision.
            log("starting Packrat pinned to torch at fp32")
            pinned_args = ["--runtime", "torch", "--precision", "fp32", "--state-dir", "none"]
            pinned = PackratServer("packrat-torch", model["spec"], self.work, pinned_args)
            self.servers.append(pinned)
            pinned.start()
            self.packrat = self.packrat if self.packrat is not None else pinned
            result["started_s"]["packrat_torch"] = round(pinned.started_s, 1)
            result["configured"]["packrat_torch"] = pinned.describe()
            self.targets["packrat_torch"] = pinned.oip_target(self.args.model)

    def probes(self) -> list[tuple[int, int]]:
        return [(c, batch) for batch in ints(self.args.batches) for c in ints(self.args.probe_concurrency)]

    def search_triton(self) -> None:
        args, result = self.args, self.result
        log("starting Triton with its defaults and the search's configurations")
        began = time.monotonic()
        space = search_space(self.cores, ints(args.triton_max_batch), args.triton_queue_delay_us)
        triton = TritonServer("triton", args.model, self.work, [default_config(self.cores), *space])
        self.servers.append(triton)
        triton.start()
        result["started_s"]["triton_all_configurations"] = round(time.monotonic() - began, 1)
        self.targets["triton_default"] = triton.target("triton_default")
        result["configured"]["triton_default"] = triton.describe("triton_default")
        log("Triton's search: instances × dynamic batching × max_batch_size")
        scored = {}
        for config in space:
            scored[config["name"]] = {
                "config": config,
                **probe_score(triton.target(config["name"]), args, self.probes()),
            }
            log(f"  {config['name']}: score {scored[config['name']]['score_p99_geomean_ms']} ms")
        best = pick_best(scored)
        result["search"]["triton"] = {
            "configurations": scored,
            "best": best,
            "search_s": round(time.monotonic() - began, 1),
            "note": "search_s includes starting Triton with every configuration",
        }
        self.targets["triton_best"] = triton.target(best)
        result["configured"]["triton_best"] = triton.describe(best)

    def search_torchserve(self) -> None:
        # One TorchServe server at a time: a second one on this machine shut itself down (its JVM's shutdown hook
        # ran) as its first worker started, so the defaults get a pass of their own after the others.
        args = self.args
        self.store = build_archive(args.model, self.work / "store")
        log("TorchServe's sweep: CPU launcher × workers × batch_size")
        began = time.monotonic()
        tuned = self.ts_tuned = TorchServe("torchserve-launcher", args.model, self.work, launcher=True, preload=False)
        self.servers.append(tuned)
        tuned.start(self.store.parent)
        scored = {}
        for workers in range(1, self.cores + 1):
            for batch_size in ints(args.torchserve_batch):
                name = f"ts_w{workers}_b{batch_size}"
                tuned.register(name, workers, batch_size, args.torchserve_batch_delay_ms)
                scored[name] = {"config": tuned.describe(name), **probe_score(tuned.target(name), args, self.probes())}
                log(f"  {name}: score {scored[name]['score_p99_geomean_ms']} ms")
                tuned.unregister(name)  # one at a time: workers of another config would hold the cores' memory
        best = pick_best(scored)
        best_config = scored[best]["config"]
        tuned.register(best, best_config["workers"], best_config["batch_size"], args.torchserve_batch_delay_ms)
        self.result["search"]["torchserve"] = {
            "configurations": scored,
            "best": best,
            "search_s": round(time.monotonic() - began, 1),
        }
        self.targets["torchserve_best"] = tuned.target(best)
        self.result["configured"]["torchserve_best"] = tuned.describe(best)

    def measure(self) -> None:
        """Pass A (every target taking turns), LoadGen for Packrat and the best peer, pass B (TorchServe at its
        defaults against Packrat again)."""
        args, result, packrat, targets = self.args, self.result, self.packrat_name, self.targets
        assert self.packrat is not None
        concurrencies, batches = ints(args.concurrency), ints(args.batches)
        result["packrat_plan_before_measuring"] = self.packrat.plan_now()
        log(f"pass A: {', '.join(targets)} taking turns")
        points = run_points(args, targets, concurrencies, batches)
        checkpoint(args, result, points=points, summary=summarize(points, list(targets), packrat))
        best_peer = summarize(points, list(targets), packrat)["best_peer"]
        if args.loadgen and best_peer is not None:
            bound_ms = args.bound_ms or {"resnet50": 100.0, "bert-base": 300.0}[args.model]
            loadgen_dir = Path(args.loadgen_out or REPO / "bench" / "results" / f"peers-loadgen-{args.model}")
            chosen = {packrat: targets[packrat], best_peer: targets[best_peer]}
            result["loadgen"] = run_loadgen(args, chosen, bound_ms, loadgen_dir)
        names = list(targets)
        if self.ts_tuned is not None and self.store is not None and args.torchserve_defaults:
            self.ts_tuned.close()
            log("starting TorchServe at its defaults")
            began = time.monotonic()
            ts_default = TorchServe("torchserve-default", args.model, self.work, launcher=False, preload=True)
            self.servers.append(ts_default)
            ts_default.start(self.store.parent)
            result["started_s"]["torchserve_default"] = round(time.monotonic() - began, 1)
            result["configured"]["torchserve_default"] = ts_default.describe(args.model)
            second = {f"{packrat}_b": targets[packrat], "torchserve_default": ts_default.target(args.model)}
            log(f"pass B: {', '.join(second)} taking turns")
            checkpoint(args, result, points=points)
            run_points(args, second, concurrencies, batches, template=points)
            names += list(second)
        result["packrat_plan_after_measuring"] = self.packrat.plan_now()
        result["points"] = points
        result["summary"] = summarize(points, names, packrat)


if __name__ == "__main__":
    sys.exit(main())
