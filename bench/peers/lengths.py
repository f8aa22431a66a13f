"""Variable-length text against a real peer (issue 40): Packrat and infinity-emb 0.0.78 serving one BERT folder,
the same requests (the same token ids), side by side in one run at every load of a sweep.

The folder is a `save_pretrained` BertModel with random weights and a tokenizer built here
(`bench/peers/infinity.py`: a text of N words is exactly N + 2 token ids), so both servers compute on the same ids:
infinity tokenizes each text itself, Packrat is sent the ids. Request lengths are drawn as in `bench/lengths.py`
(short queries: lognormal with median 12 tokens, p99 near 64, at most 128, the HF folder's longest in Packrat).

- Packrat: `packrat serve --model FOLDER` (the Hugging Face folder, its sequence axis free up to 128), torch fp32
  at one instance of every core (`--policy fixed --plan Nx8`: on this machine's cores the planner has nothing to
  split, and no start-up measurement enters the run), batches sorted by length and cut by cost (the default
  `--length-batching by-cost`), each slice padded to its own longest. Its native front door: ZeroMQ, one DEALER
  socket, open loop. It returns BERT's per-token hidden states at each request's own length; the client takes
  their mean and normalises it (what infinity returns), timed inside each request's latency.
- infinity-emb: `infinity_emb v2` at its defaults (torch engine, CPU, batch size 32, a queue sorted by length,
  each batch padded to its longest), its native front door: HTTP /embeddings, aiohttp, open loop.

Both servers stay up through the run (the idle one waits on its socket); each round sends the same seeded Poisson
arrivals and lengths to both, in alternating order. Loads are shares of Packrat's closed-loop capacity on the same
lengths, measured first. Before the sweep, a few requests are answered by both and compared (cosine of the
embeddings against transformers' own, unpadded).

    bash bench/peers/install_infinity.sh                   # once: bench/peers/.venv-infinity
    python bench/peers/lengths.py                          # JSON on stdout and in bench/results/lengths-infinity.json
    python bench/peers/lengths.py --shape small --seconds 10 --rounds 1 --loads 0.5
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

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent.parent))

import infinity  # noqa: E402

from bench.harness import DaemonProcess  # noqa: E402
from packrat_daemon.load.lengths import parse_lengths  # noqa: E402
from packrat_daemon.wire import client_side  # noqa: E402

LENGTHS = "lognormal:median=12,p99=64,max=128"
LONGEST = 128  # tokens, [CLS] and [SEP] included: the HF folder's free axis in Packrat
OUT = HERE.parent / "results" / "lengths-infinity.json"


def pooled(hidden: np.ndarray) -> np.ndarray:
    """infinity's embedding of one request's hidden states (tokens, width): their mean, L2-normalised."""
    mean = hidden.mean(axis=0)
    return mean / max(float(np.linalg.norm(mean)), 1e-12)


def arrays(request: infinity.Request) -> dict[str, np.ndarray]:
    ids = request.ids[None, :]
    return {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}


class Packrat:
    """Open-loop requests of `infinity.Request`s' ids on one DEALER socket; each latency from just before its send
    to its reply read and its embedding pooled."""

    def __init__(self, endpoint: str) -> None:
        self.socket = zmq.Context.instance().socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.connect(endpoint)
        self.poller = zmq.Poller()
        self.poller.register(self.socket, zmq.POLLIN)
        self.next_id = 0

    def send(self, request: infinity.Request) -> int:
        self.next_id += 1
        self.socket.send_multipart(client_side.encode_tensors_request(self.next_id, arrays(request)))
        return self.next_id

    def receive(self) -> tuple[int, np.ndarray]:
        header, result = client_side.decode_reply(self.socket.recv_multipart())
        if not header.get("ok", True) or not isinstance(result, dict):
            raise RuntimeError(f"request {header.get('id')} failed: {header.get('error')}")
        return int(header["id"]), pooled(result["last_hidden_state"][0])

    def embed(self, requests: list[infinity.Request]) -> np.ndarray:
        ids = [self.send(request) for request in requests]
        found = dict(self.receive() for _ in ids)
        return np.stack([found[i] for i in ids])

    def open_loop(self, times: np.ndarray, requests: list[infinity.Request]) -> list[float]:
        """Each request sent at its time (seconds from the start) whatever the earlier ones did; latencies in ms."""
        sent: dict[int, float] = {}
        latency: dict[int, float] = {}
        order: list[int] = []
        began, k = time.perf_counter(), 0
        while k < len(requests) or sent:
            due = began + float(times[k]) if k < len(requests) else None
            wait_ms = max(0.0, (due - time.perf_counter()) * 1000.0) if due is not None else 1000.0
            if self.poller.poll(wait_ms):
                done, _ = self.receive()
                latency[done] = (time.perf_counter() - sent.pop(done)) * 1000.0
                continue
            if k < len(requests):
                request_id = self.send(requests[k])
                sent[request_id] = time.perf_counter()
                order.append(request_id)
                k += 1
        return [latency[request_id] for request_id in order]

    def capacity(self, requests: list[infinity.Request], window: int, seconds: float) -> float:
        """Requests/s with `window` outstanding for `seconds` (two windows answered at least)."""
        k = 0
        for k in range(window):
            self.send(requests[k % len(requests)])
        done, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds or done < 2 * window:
            if self.poller.poll(1000):
                self.receive()
                done, k = done + 1, k + 1
                self.send(requests[k % len(requests)])
        elapsed = time.perf_counter() - start
        for _ in range(window):
            self.receive()
        return done / elapsed

    def close(self) -> None:
        self.socket.close()


def arrivals(rate: float, count: int, seed: int) -> np.ndarray:
    """Poisson send times from 0, exactly as `infinity.open_loop_async` draws them for the same seed."""
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, size=count)
    return np.cumsum(gaps) - gaps[0]


def summary(latencies: list[float]) -> dict[str, Any]:
    return {
        "requests": len(latencies),
        "p50_ms": round(float(np.percentile(latencies, 50)), 1),
        "p99_ms": round(float(np.percentile(latencies, 99)), 1),
    }


def agreement(folder: Path, packrat: Packrat, server: infinity.Infinity, requests: list[infinity.Request]) -> dict:
    """Both servers' embeddings of `requests` against transformers' own, each request alone and unpadded."""
    reference = infinity.reference(folder, requests)
    ours = packrat.embed(requests)
    theirs, _ = server.embed([request.text for request in requests])

    def least_cosine(found: np.ndarray) -> float:
        return round(float(np.min(np.sum(found * reference, axis=1))), 6)

    return {
        "requests": len(requests),
        "packrat_min_cosine": least_cosine(ours),
        "infinity_min_cosine": least_cosine(theirs),
    }


def one_load(
    packrat: Packrat, server: infinity.Infinity, rate: float, args: argparse.Namespace, vocab: int, seed: int
) -> dict[str, Any]:
    rounds = []
    pooled_ms: dict[str, list[float]] = {"packrat": [], "infinity": []}
    for number in range(args.rounds):
        count = max(1, int(rate * args.seconds))
        draw = np.random.default_rng(seed + number)
        tokens = np.clip(parse_lengths(args.lengths).sample(draw, count), 3, LONGEST)
        requests = infinity.make_requests(tokens - 2, vocab, seed=seed + number)
        this_round: dict[str, Any] = {}
        for name in ("packrat", "infinity") if number % 2 == 0 else ("infinity", "packrat"):
            if name == "packrat":
                latencies = packrat.open_loop(arrivals(rate, count, seed + number), requests)
            else:
                run = infinity.open_loop(server.url, requests, rate, seed=seed + number, timeout_s=120.0)
                if run["errors"]:
                    raise RuntimeError(f"infinity failed requests at {rate:.2f}/s: {run['errors']}")
                latencies = [row["latency_ms"] for row in run["requests"]]
            pooled_ms[name] += latencies
            this_round[name] = summary(latencies)
            time.sleep(1.0)  # the queues drain between runs
        rounds.append(this_round)
        print(json.dumps({"rate_per_s": round(rate, 2), "round": number, **this_round}), file=sys.stderr)

    def median_ratio(key: str) -> float:
        return round(statistics.median(r["infinity"][key] / r["packrat"][key] for r in rounds), 3)

    return {
        "rate_per_s": round(rate, 2),
        "rounds": rounds,
        "pooled": {name: summary(values) for name, values in pooled_ms.items()},
        "p50_ratio_infinity_over_packrat": median_ratio("p50_ms"),
        "p99_ratio_infinity_over_packrat": median_ratio("p99_ms"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=sorted(infinity.SHAPES), default="base", help="the BertConfig built")
    parser.add_argument("--lengths", default=LENGTHS, help="tokens per request, [CLS] and [SEP] included")
    parser.add_argument("--loads", default="0.25,0.5,0.75", help="shares of Packrat's closed-loop capacity")
    parser.add_argument("--seconds", type=float, default=30.0, help="of traffic per server per round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--capacity-seconds", type=float, default=20.0)
    parser.add_argument("--threads", type=int, default=2, help="Packrat's one instance's threads (the cores)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    loads = [float(share) for share in args.loads.split(",")]
    folder = infinity.build_folder(HERE / ".work" / f"lengths-bert-{args.shape}", infinity.SHAPES[args.shape])
    vocab = int(infinity.folder_config(folder)["vocab_size"])
    with tempfile.TemporaryDirectory(prefix="packrat-lengths-peer-") as run_dir:
        daemon = DaemonProcess(
            "packrat",
            Path(run_dir),
            [
                "--model",
                str(folder),
                "--runtime",
                "torch",
                "--precision",
                "fp32",
                "--policy",
                "fixed",
                "--plan",
                f"{args.threads}x8",
                "--max-batch",
                "8",
                "--log-level",
                "warning",
            ],  # fmt: skip
        )
        packrat = None
        try:
            info = daemon.wait()
            with infinity.Infinity(folder) as server:
                packrat = Packrat(daemon.endpoint)
                checked = infinity.make_requests([1, 10, 62, LONGEST - 2], vocab, seed=7)
                agreed = agreement(folder, packrat, server, checked)
                print(json.dumps({"agreement": agreed}), file=sys.stderr)
                draw = np.random.default_rng(99)
                sample = np.clip(parse_lengths(args.lengths).sample(draw, 256), 3, LONGEST)
                capacity = packrat.capacity(infinity.make_requests(sample - 2, vocab, 99), 8, args.capacity_seconds)
                sweep = [one_load(packrat, server, share * capacity, args, vocab, 1 + 100 * k)
                         for k, share in enumerate(loads)]  # fmt: skip
                peer = server.describe()
        finally:
            if packrat is not None:
                packrat.close()
            daemon.close()
    result = {
        "benchmark": "lengths-infinity",
        "folder": {
            "shape": args.shape,
            **{k: infinity.folder_config(folder)[k] for k in ("hidden_size", "num_hidden_layers")},
        },
        "lengths": args.lengths,
        "packrat": {"input": info.get("input"), "plan": f"{args.threads}x8", "runtime": "torch fp32"},
        "infinity": peer,
        "agreement": agreed,
        "packrat_capacity_per_s": round(capacity, 2),
        "loads": loads,
        "sweep": sweep,
        "packrat_at_or_below_everywhere": all(
            point["pooled"]["packrat"][key] <= point["pooled"]["infinity"][key]
            for point in sweep
            for key in ("p50_ms", "p99_ms")
        ),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
