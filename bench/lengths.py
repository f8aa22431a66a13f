"""Text as it arrives (issue 40): short-query traffic served at one padded length against by length, side by side.

Two comparisons, each in one run, daemons alternating round by round on the same seeded traffic (Poisson arrivals,
lengths drawn from `--lengths`, by default lognormal with median 12 tokens, p99 64, at most 128):

- `local`: built-in BERT-base (`builtin:bert-base-masked`: input_ids, attention_mask, token_type_ids) on this
  machine's cores, served by today's fixed-length daemon (`--input int64:128`: every request padded to 128 by its
  client) and by the daemon of a free axis (each slice padded to its own longest). Both on one plan (`fixed Nx8`,
  torch fp32), so only the lengths differ. Load: half the fixed daemon's capacity (measured first, closed loop).
- `simulated`: the emulated comparison's daemon on a virtual clock (`packrat simulate --lengths`: the daemon's
  batcher, splitter and policy, each slice waiting the same table and length rule), at 0.5, 0.7, 0.8 and 0.9 of the
  pad-batch daemon's simulated capacity, three seeds each: what the emulated run shows without this machine's load.
- `emulated`: the same model at 16 emulated cores (`--runtime emulated`, the Packrat paper's 16-core BERT table),
  planned by the packrat policy, served by length (`--length-batching by-cost`) and in the naive dynamic mode
  (`pad-batch`: every slice padded to the batch's longest, cut by count). The emulated workers wait what the
  length rule gives (`packrat_daemon.wire.length_cost`): that assumption, and how far it holds for this machine's
  BERT, is in the JSON (`rule_check`: measured L(b, 32) against L(b·32/128, 128) with torch at one thread).

    python bench/lengths.py                       # both; JSON on stdout and in bench/results/lengths.json
    python bench/lengths.py --only emulated --seconds 20 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import zmq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import DaemonProcess  # noqa: E402
from packrat_daemon.load.lengths import parse_lengths  # noqa: E402
from packrat_daemon.wire import client_side  # noqa: E402

MODEL = "builtin:bert-base-masked"
LONGEST = 128
VOCAB = 30522
# Simulated seconds of traffic per run: long enough that the adaptation's first plans (the first 5-35 s, made
# before the traffic was seen) weigh little in the p99.
SIMULATED_S = 480.0
PROFILE_16 = Path(__file__).resolve().parent / "profiles" / "bert-base-lengths16.csv"  # made by bench/length_table.py


def request(length: int, pad_to: int, seed: int) -> dict[str, np.ndarray]:
    """One query of `length` tokens, padded by its client to `pad_to` (mask 0 there) when the daemon is fixed."""
    ids = np.zeros((1, pad_to or length), np.int64)
    ids[0, :length] = np.random.default_rng(seed).integers(1, VOCAB, length)
    mask = np.zeros_like(ids)
    mask[0, :length] = 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}


def encoded(request_id: int, length: int, pad_to: int) -> list[bytes]:
    return client_side.encode_tensors_request(request_id, request(length, pad_to, request_id))


class Driver:
    """Open-loop requests on one DEALER socket to a daemon; each latency from its send to its reply."""

    def __init__(self, endpoint: str) -> None:
        self.socket = zmq.Context.instance().socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.connect(endpoint)
        self.poller = zmq.Poller()
        self.poller.register(self.socket, zmq.POLLIN)
        self.next_id = 0

    def receive(self) -> int:
        header, _ = client_side.decode_reply(self.socket.recv_multipart())
        if "error" in header:
            raise RuntimeError(f"request {header.get('id')} failed: {header['error']}")
        return int(header["id"])

    def send(self, length: int, pad_to: int) -> int:
        self.next_id += 1
        self.socket.send_multipart(encoded(self.next_id, length, pad_to))
        return self.next_id

    def open_loop(self, gaps: np.ndarray, lengths: np.ndarray, pad_to: int) -> list[float]:
        """One request per gap (seconds after the previous), of each length; the latencies in ms, in order."""
        sent: dict[int, float] = {}
        latency: dict[int, float] = {}
        order: list[int] = []
        next_send, k = time.perf_counter() + float(gaps[0]), 0
        while k < len(gaps) or sent:
            wait_ms = max(0.0, (next_send - time.perf_counter()) * 1000.0) if k < len(gaps) else 1000.0
            if self.poller.poll(wait_ms):
                done = self.receive()
                latency[done] = (time.perf_counter() - sent.pop(done)) * 1000.0
                continue
            if k < len(gaps):
                request_id = self.send(int(lengths[k]), pad_to)
                sent[request_id] = time.perf_counter()
                order.append(request_id)
                k += 1
                if k < len(gaps):
                    next_send += float(gaps[k])
        return [latency[request_id] for request_id in order]

    def closed_loop(self, lengths: np.ndarray, pad_to: int, window: int, seconds: float) -> float:
        """Requests/s with `window` outstanding at all times for `seconds` (and two windows at least)."""
        k = 0
        for k in range(window):
            self.send(int(lengths[k % len(lengths)]), pad_to)
        outstanding, done = window, 0
        start = time.perf_counter()
        while time.perf_counter() - start < seconds or done < 2 * window:  # at least two windows answered
            if self.poller.poll(1000):
                self.receive()
                done += 1
                k += 1
                self.send(int(lengths[k % len(lengths)]), pad_to)
        elapsed = time.perf_counter() - start
        for _ in range(outstanding):
            self.receive()
        return done / elapsed

    def close(self) -> None:
        self.socket.close()


def traffic(rate: float, seconds: float, lengths_text: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Seeded Poisson gaps at `rate` over `seconds` and each request's length."""
    rng = np.random.default_rng(seed)
    count = max(1, int(rate * seconds))
    return rng.exponential(1.0 / rate, count), parse_lengths(lengths_text).sample(rng, count)


def summary(latencies: list[float]) -> dict[str, float]:
    return {
        "requests": len(latencies),
        "p50_ms": round(float(np.percentile(latencies, 50)), 1),
        "p99_ms": round(float(np.percentile(latencies, 99)), 1),
    }


def side_by_side(
    daemons: dict[str, tuple[DaemonProcess, int]], rate: float, args: argparse.Namespace, seed: int, warmup_s: float = 0
) -> dict[str, Any]:
    """Paired rounds at `rate`: each round the same traffic to every daemon, in alternating order; first, unmeasured,
    `warmup_s` of it to each (an adapting daemon's plan settles on the traffic before it is measured)."""
    drivers = {name: Driver(daemon.endpoint) for name, (daemon, _) in daemons.items()}
    pooled: dict[str, list[float]] = {name: [] for name in daemons}
    rounds = []
    names = list(daemons)
    if warmup_s > 0:
        gaps, lengths = traffic(rate, warmup_s, args.lengths, seed - 1)
        for name in names:
            drivers[name].open_loop(gaps, lengths, daemons[name][1])
            time.sleep(1.0)
    for round_number in range(args.rounds):
        gaps, lengths = traffic(rate, args.seconds, args.lengths, seed + round_number)
        this_round = {}
        for name in names if round_number % 2 == 0 else names[::-1]:
            latencies = drivers[name].open_loop(gaps, lengths, daemons[name][1])
            pooled[name] += latencies
            this_round[name] = summary(latencies)
            time.sleep(1.0)  # the queue drains and the workers idle between runs
        rounds.append(this_round)
        print(json.dumps({"round": round_number, **this_round}), file=sys.stderr)
    for driver in drivers.values():
        driver.close()
    return {"rate_per_s": round(rate, 2), "rounds": rounds, "pooled": {name: summary(v) for name, v in pooled.items()}}


def ratio(result: dict[str, Any], slower: str, faster: str, key: str) -> float:
    """The median over rounds of slower's figure over faster's."""
    return round(statistics.median(r[slower][key] / r[faster][key] for r in result["rounds"]), 3)


def local(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    common = ["--model", MODEL, "--runtime", "torch", "--precision", "fp32", "--policy", "fixed",
              "--plan", f"{args.threads}x8", "--max-batch", "8", "--log-level", "warning"]  # fmt: skip
    fixed = DaemonProcess("fixed-128", folder, [*common, "--input", f"int64:{LONGEST}"])
    by_length = DaemonProcess("by-length", folder, common)
    try:
        for daemon in (fixed, by_length):
            daemon.wait()
        sample = parse_lengths(args.lengths).sample(np.random.default_rng(99), 512)
        driver = Driver(fixed.endpoint)
        capacity = driver.closed_loop(sample, LONGEST, window=8, seconds=args.capacity_seconds)
        driver.close()
        result = side_by_side({"fixed-128": (fixed, LONGEST), "by-length": (by_length, 0)}, capacity / 2, args, 1)
    finally:
        fixed.close()
        by_length.close()
    result["fixed_capacity_per_s"] = round(capacity, 2)
    result["p50_ratio_fixed_over_by_length"] = ratio(result, "fixed-128", "by-length", "p50_ms")
    result["p99_ratio_fixed_over_by_length"] = ratio(result, "fixed-128", "by-length", "p99_ms")
    result["rule_check"] = rule_check(args.threads)
    return result


def emulated(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    common = ["--model", MODEL, "--runtime", "emulated", "--emulate-cores", "16", "--emulate-interference", "none",
              "--profile", str(PROFILE_16), "--max-batch", "16", "--log-level", "info"]  # fmt: skip
    naive = DaemonProcess("pad-batch-16", folder, [*common, "--length-batching", "pad-batch"])
    by_cost = DaemonProcess("by-cost-16", folder, [*common, "--length-batching", "by-cost"])
    try:
        for daemon in (naive, by_cost):
            daemon.wait()
        sample = parse_lengths(args.lengths).sample(np.random.default_rng(99), 512)
        capacity = 0.0
        for daemon in (by_cost, naive):  # both see the same closed loop: the naive daemon's capacity is the load's
            driver = Driver(daemon.endpoint)
            capacity = driver.closed_loop(sample, 0, window=32, seconds=args.capacity_seconds)
            driver.close()
        rate = capacity * args.emulated_load
        result = side_by_side({"pad-batch": (naive, 0), "by-cost": (by_cost, 0)}, rate, args, 101, args.warmup_seconds)
        result["plans"] = {"pad-batch": naive.plan_log(), "by-cost": by_cost.plan_log()}
    finally:
        naive.close()
        by_cost.close()
    result["pad_batch_capacity_per_s"] = round(capacity, 2)
    result["p99_ratio_pad_batch_over_by_cost"] = ratio(result, "pad-batch", "by-cost", "p99_ms")
    result["p50_ratio_pad_batch_over_by_cost"] = ratio(result, "pad-batch", "by-cost", "p50_ms")
    result["tables"] = (
        f"{PROFILE_16.name} (the Packrat paper's 16-core BERT, taken as measured at {LONGEST} tokens); a slice of b "
        f"sequences padded to n tokens waits L(t, b*n/{LONGEST}), interpolated (packrat_daemon.wire.length_cost)"
    )
    return result


def simulated(args: argparse.Namespace) -> dict[str, Any]:
    """The emulated comparison's daemon on a virtual clock (`packrat simulate --lengths`): the same table and rule,
    none of this machine's load; a sweep of loads, each a share of the pad-batch daemon's simulated capacity."""
    from packrat_daemon.config import ServeConfig
    from packrat_daemon.load.arrivals import BatchMix, Poisson
    from packrat_daemon.simulate import Simulation, Traffic
    from policies.planning.profile import Profile

    profile, lengths = Profile.read_csv(PROFILE_16), parse_lengths(args.lengths)

    def run(mode: str, seed: int, rate: float | None = None) -> dict[str, Any]:
        config = ServeConfig(max_batch=16, length_batching=mode)
        if rate is None:  # closed loop: the capacity
            traffic = Traffic(BatchMix.single(1), concurrency=64, duration_s=30.0, seed=seed, lengths=lengths)
        else:
            traffic = Traffic(BatchMix.single(1), Poisson(rate), duration_s=SIMULATED_S, seed=seed, lengths=lengths)
        return Simulation(config, profile, 16).run(traffic).to_json()

    capacity = run("pad-batch", 0)["throughput_rps"]
    sweep = []
    for share in (0.5, 0.7, 0.8, 0.9):
        rounds = []
        for seed in range(1, 4):
            both = {mode: run(mode, seed, share * capacity)["latency_ms"] for mode in ("pad-batch", "by-cost")}
            rounds.append({mode: {"p50_ms": v["p50"], "p99_ms": v["p99"]} for mode, v in both.items()})
        point: dict[str, Any] = {"load": share, "rate_per_s": round(share * capacity, 1), "rounds": rounds}
        for key in ("p99_ms", "p50_ms"):
            point[f"{key[:3]}_ratio_pad_batch_over_by_cost"] = ratio({"rounds": rounds}, "pad-batch", "by-cost", key)
        sweep.append(point)
        print(
            json.dumps({"simulated_load": share, **{k: v for k, v in sweep[-1].items() if "ratio" in k}}),
            file=sys.stderr,
        )
    return {"pad_batch_capacity_per_s": capacity, "seconds": SIMULATED_S, "seeds": 3, "sweep": sweep}


def rule_check(threads: int, batch: int = 4, short: int = 32, repeats: int = 5) -> dict[str, Any]:
    """How far the length rule holds for this machine's BERT-base: L(batch, short) measured against the rule's
    prediction from the table at 128 tokens, L(batch*short/128, 128) (here a batch of 1)."""
    from bench.length_table import bert_timer

    timed = bert_timer(threads, repeats)
    at_ref_1, at_ref_b, at_short = timed(1, LONGEST), timed(batch, LONGEST), timed(batch, short)
    return {
        "threads": threads,
        f"L({batch},{LONGEST})_ms": round(at_ref_b, 1),
        f"L({batch},{short})_ms": round(at_short, 1),
        f"rule_L({batch * short // LONGEST},{LONGEST})_ms": round(at_ref_1, 1),
        "measured_over_rule": round(at_short / at_ref_1, 3),
        f"ratio_{LONGEST}_over_{short}": round(at_ref_b / at_short, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=("local", "emulated", "simulated"))
    parser.add_argument("--lengths", default=f"lognormal:median=12,p99=64,max={LONGEST}")
    parser.add_argument("--seconds", type=float, default=30.0, help="of traffic per daemon per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--capacity-seconds", type=float, default=15.0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--warmup-seconds", type=float, default=60.0,
                        help="emulated: unmeasured traffic to each daemon before the rounds (default 60)")  # fmt: skip
    parser.add_argument("--emulated-load", type=float, default=0.5, help="share of the pad-batch daemon's capacity")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "lengths.json")
    args = parser.parse_args()
    import os

    result: dict[str, Any] = {"lengths": args.lengths, "load_average": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory(prefix="packrat-lengths-") as tmp:
        if args.only in (None, "local"):
            result["local"] = local(args, Path(tmp))
        if args.only in (None, "emulated"):
            result["emulated_16"] = emulated(args, Path(tmp))
        if args.only in (None, "simulated"):
            result["simulated_16"] = simulated(args)
    text = json.dumps(result, indent=2)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
