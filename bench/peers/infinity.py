"""infinity-emb 0.0.78 as a peer for variable-length text (issue 40): a `save_pretrained` BERT with random weights and a
word-level tokenizer built here, `infinity_emb v2` serving it on loopback at its batching defaults, and an open-loop
Poisson client over its OpenAI-style /embeddings endpoint. Harness side (Packrat's .venv); the server runs from
bench/peers/.venv-infinity (`bash bench/peers/install_infinity.sh`), never the README's install.

API (from bench/, put bench/peers on sys.path first: `sys.path.insert(0, str(Path(__file__).parent / "peers"))`):

    build_folder(out, config=None, seed=0) -> Path
        `out` holds BertModel(config).save_pretrained (random weights, seeded) and a tokenizer beside it
        (tokenizer.json + tokenizer_config.json + special_tokens_map.json). `config`: a transformers BertConfig, a dict
        of BertConfig's arguments, or None for bert-base's shape (768 wide, 12 layers, 30522 words, 512 positions).
        The tokenizer is a WordLevel vocabulary: the word "w17" is id 17 for every id of the vocabulary but BERT's
        special ones ([PAD] 0, [UNK] 100, [CLS] 101, [SEP] 102, [MASK] 103), words split on whitespace, BERT's
        post-processor ([CLS] ... [SEP]): a text of N words is exactly N + 2 token ids.
    make_requests(lengths, vocab_size, seed=0) -> list[Request]
        One Request per length: .text (that many words) and .ids (int64, [CLS] + the words' ids + [SEP], length + 2)
        -- the ids to send Packrat for the same request. Words are drawn from ids of one width (10000..30521 for
        bert-base's vocabulary), so a text's length in characters (7 N - 1 there) orders texts as their token counts
        do. Lengths up to the model's positions - 2 (510 for BERT): infinity truncates longer texts.
    Infinity(folder, ...)  .start() / .stop() (or `with Infinity(...) as server:`)
        One `infinity_emb v2` on 127.0.0.1 at a free port, engine torch, device cpu, HF_HUB_OFFLINE=1, the folder as
        its model id, batching at its defaults unless `batch_size=` or `lengths_via_tokenize=` are given (DEFAULTS
        below). `extra_args`, `env`: more CLI options or environment (OMP_NUM_THREADS, say). .url, .log_path,
        .embed(texts) -> (float32 array (n, hidden), usage dict), .describe() -> what was started.
    await time_one(session, url, request) / open_loop(url, requests, rate, seed=0, timeout_s=60.0, hidden=None)
        A request is one text (POST /embeddings {"model", "input": [text]}), timed from just before it is sent to its
        whole reply read and checked (one embedding, of `hidden` floats when given). open_loop (sync; runs its own
        event loop) sends `requests` in order at Poisson arrivals of `rate` per second, each at its time whether or
        not the earlier ones were answered, and returns {"rate_rps", "sent", "ok", "errors", "latency_ms": {p50, p90,
        p99}, "throughput_rps", "send_lag_p99_ms", "requests": [{"length", "at_s", "latency_ms" | None, "error"}]}.
    reference(folder, requests) -> float32 array (n, hidden)
        What infinity returns, computed by transformers in this process on each request's ids alone, unpadded:
        BertModel's last hidden state, mean over all of the request's tokens ([CLS] and [SEP] included), L2-normalised.

What infinity serves for a BERT folder without a sentence-transformers config: sentence-transformers 3.4 wraps it as
Transformer + Pooling("mean") (it logs "Creating a new one with mean pooling"); the mean is over the attention mask,
so over [CLS], the words and [SEP], never the padding; infinity then L2-normalises every embedding (its
`normalize_embeddings = True`). `--pooling-method` is read only by its optimum and neuron engines, not torch.

Its batching at the defaults (infinity_emb/env.py, inference/batch_handler.py, inference/queue.py in 0.0.78):
`--batch-size 32` (the most texts in one forward pass); no waiting for company: a batch is whatever is queued when the
model thread can take one; when more than 32 are queued it takes up to 8 x 32 of the oldest, sorts them by length and
cuts them into batches of 32; the length is len(text) in characters (`--no-lengths-via-tokenize`, the default; with
`--lengths-via-tokenize` the tokenizer counts them, also in the reply's usage); each batch is tokenized with padding to
its own longest text (sentence-transformers' tokenize); tokenize, forward and normalise run in three threads, with up
to 3 batches tokenized ahead; the post-processing thread sleeps 5 ms before each batch when nothing else waits
(batch_delay, not settable); `--no-compile`, no BetterTransformer (optimum is not installed), float32 on CPU, torch's
default threads (one per core), the model warmed up before /health answers, no vector disk cache.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from common import HERE, PeerMissing, dump, free_port, http, start, stop, wait_http

VENV = HERE / ".venv-infinity"
INSTALLER = "bench/peers/install_infinity.sh"
VERSION = "0.0.78"
START_TIMEOUT_S = 600.0
SERVED_NAME = "peer-bert"
# BERT's special tokens at the ids of bert-base-uncased's vocabulary.
SPECIAL = {"[PAD]": 0, "[UNK]": 100, "[CLS]": 101, "[SEP]": 102, "[MASK]": 103}
CLS, SEP = SPECIAL["[CLS]"], SPECIAL["[SEP]"]
# infinity-emb's own defaults, as `infinity_emb v2 --help` and env.py give them (nothing here changes them).
DEFAULTS = {
    "batch_size": 32,
    "lengths_via_tokenize": False,
    "queue_popped_at_once": "8 x batch_size, sorted by length when over batch_size",
    "batch_delay_ms": 5,
    "compile": False,
    "bettertransformer": "on, but not applied (optimum not installed)",
    "dtype": "auto (float32 on CPU)",
    "vector_disk_cache": False,
    "model_warmup": True,
    "queue_size": 32000,
}


def require() -> Path:
    """The peer's environment, or PeerMissing naming the install script."""
    binary = VENV / "bin/infinity_emb"
    if not binary.exists():
        raise PeerMissing(f"infinity-emb is not installed ({binary} missing); run: bash {INSTALLER}")
    return VENV


def installed_versions() -> dict[str, str]:
    venv = require()
    probe = (
        "import importlib.metadata as m, json; print(json.dumps({n: m.version(n) for n in "
        "('infinity-emb', 'torch', 'transformers', 'sentence-transformers', 'tokenizers')}))"
    )
    out = subprocess.run([str(venv / "bin/python"), "-c", probe], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


# --- the model folder ---------------------------------------------------------------------------------------------


def _config(config: Any) -> Any:
    from transformers import BertConfig

    if config is None:
        return BertConfig()
    if isinstance(config, dict):
        return BertConfig(**config)
    return config


def word_ids(vocab_size: int) -> tuple[int, int]:
    """[low, high): the ids whose words "w<id>" all have the same number of characters (the widest ones)."""
    width = len(str(vocab_size - 1))
    low = max(10 ** (width - 1), max(SPECIAL.values()) + 1)
    if vocab_size - low < 100:
        raise ValueError(f"a vocabulary of {vocab_size} leaves {vocab_size - low} words of one width: use >= 1000")
    return low, vocab_size


def build_tokenizer(vocab_size: int, max_length: int) -> Any:
    """A `tokenizers.Tokenizer`: "w<i>" -> i, BERT's special tokens, whitespace split, [CLS] $A [SEP]."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {f"w{i}": i for i in range(vocab_size)}
    for token, index in SPECIAL.items():
        del vocab[f"w{index}"]
        vocab[token] = index
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", CLS), ("[SEP]", SEP)],
    )
    tokenizer.add_special_tokens(list(SPECIAL))
    tokenizer.enable_truncation(max_length)
    return tokenizer


def build_folder(out: Path | str, config: Any = None, seed: int = 0) -> Path:
    """A `save_pretrained` BertModel with random weights (seeded) and its tokenizer, in `out`."""
    import torch
    from transformers import BertModel

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    config = _config(config)
    torch.manual_seed(seed)
    model = BertModel(config).eval()
    model.save_pretrained(out)
    build_tokenizer(config.vocab_size, config.max_position_embeddings).save(str(out / "tokenizer.json"))
    special = {"unk_token": "[UNK]", "pad_token": "[PAD]", "cls_token": "[CLS]", "sep_token": "[SEP]"}
    special["mask_token"] = "[MASK]"
    # Written by hand rather than by PreTrainedTokenizerFast.save_pretrained: transformers 5 names its own class
    # there, which the 4.x of infinity's environment does not know.
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": config.max_position_embeddings,
        "model_input_names": ["input_ids", "token_type_ids", "attention_mask"],
        "padding_side": "right",
        "truncation_side": "right",
        "clean_up_tokenization_spaces": False,
        **special,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=1))
    (out / "special_tokens_map.json").write_text(json.dumps(special, indent=1))
    return out


def folder_config(folder: Path | str) -> dict[str, Any]:
    return json.loads((Path(folder) / "config.json").read_text())


# --- requests -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    text: str
    ids: np.ndarray  # int64, (length + 2,): [CLS] words [SEP]

    @property
    def length(self) -> int:
        """Words, i.e. tokens without [CLS] and [SEP]."""
        return len(self.ids) - 2


def make_requests(lengths: list[int] | np.ndarray, vocab_size: int, seed: int = 0) -> list[Request]:
    low, high = word_ids(vocab_size)
    rng = np.random.default_rng(seed)
    requests = []
    for length in lengths:
        words = rng.integers(low, high, size=int(length))
        text = " ".join(f"w{i}" for i in words)
        requests.append(Request(text, np.concatenate([[CLS], words, [SEP]]).astype(np.int64)))
    return requests


# --- the server ---------------------------------------------------------------------------------------------------


@dataclass
class Infinity:
    """One `infinity_emb v2` on loopback serving `folder` (torch engine, CPU, offline)."""

    folder: Path
    batch_size: int | None = None  # None: infinity's default (32)
    lengths_via_tokenize: bool | None = None  # None: infinity's default (off: len(text) in characters)
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    port: int = field(default_factory=free_port)
    log_dir: Path = HERE / ".work" / "infinity"
    process: Any = None
    command: list[str] = field(default_factory=list)
    started_s: float = 0.0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"infinity-{self.port}.log"

    def start(self) -> Infinity:
        venv = require()
        folder = Path(self.folder).resolve()
        command = [str(venv / "bin/infinity_emb"), "v2", "--model-id", str(folder)]
        command += ["--served-model-name", SERVED_NAME, "--engine", "torch", "--device", "cpu"]
        command += ["--host", "127.0.0.1", "--port", str(self.port), "--log-level", "warning"]
        if self.batch_size is not None:
            command += ["--batch-size", str(self.batch_size)]
        if self.lengths_via_tokenize is not None:
            command += ["--lengths-via-tokenize" if self.lengths_via_tokenize else "--no-lengths-via-tokenize"]
        command += self.extra_args
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", DO_NOT_TRACK="1")
        env.update(INFINITY_ANONYMOUS_USAGE_STATS="0", HF_HOME=str(self.log_dir / "hf-home"), **self.env)
        env.pop("PYTHONPATH", None)
        env.pop("VIRTUAL_ENV", None)
        env["PATH"] = f"{venv / 'bin'}:{env['PATH']}"
        self.command = command
        self.log_dir.mkdir(parents=True, exist_ok=True)
        began = time.monotonic()
        self.process = start(command, self.log_path, cwd=self.log_dir, env=env)
        try:
            wait_http(f"{self.url}/health", self.process, self.log_path, START_TIMEOUT_S)
        except BaseException:
            self.stop()
            raise
        self.started_s = round(time.monotonic() - began, 2)
        return self

    def stop(self) -> None:
        if self.process is not None:
            stop(self.process, 30)
            self.process = None

    def __enter__(self) -> Infinity:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def embed(self, texts: list[str], timeout: float = 120.0) -> tuple[np.ndarray, dict[str, Any]]:
        body = json.dumps({"model": SERVED_NAME, "input": texts}).encode()
        status, reply = http(
            "POST", f"{self.url}/embeddings", body, timeout=timeout, headers={"Content-Type": "application/json"}
        )
        if status != 200:
            raise RuntimeError(f"/embeddings answered {status}: {reply[:500]!r}")
        answer = json.loads(reply)
        rows = sorted(answer["data"], key=lambda item: item["index"])
        return np.asarray([row["embedding"] for row in rows], dtype=np.float32), answer["usage"]

    def describe(self) -> dict[str, Any]:
        settings = dict(DEFAULTS)
        if self.batch_size is not None:
            settings["batch_size"] = self.batch_size
        if self.lengths_via_tokenize is not None:
            settings["lengths_via_tokenize"] = self.lengths_via_tokenize
        return {
            "server": f"infinity-emb {VERSION}",
            "engine": "torch",
            "device": "cpu",
            "settings": settings,
            "log_level": "warning (no access log per request)",
            "extra_args": self.extra_args,
            "env": self.env,
            "start_s": self.started_s,
        }


# --- the client ---------------------------------------------------------------------------------------------------


def _percentiles(latencies_ms: list[float]) -> dict[str, float | None]:
    if not latencies_ms:
        return {"p50": None, "p90": None, "p99": None}
    values = np.asarray(latencies_ms)
    return {f"p{q}": round(float(np.percentile(values, q)), 2) for q in (50, 90, 99)}


async def time_one(session: Any, url: str, request: Request, hidden: int | None = None) -> tuple[float | None, str]:
    """(latency in ms, "") or (None, the error's name) for one request: POST, whole reply read and checked."""
    body = json.dumps({"model": SERVED_NAME, "input": [request.text]}).encode()
    began = time.perf_counter()
    try:
        async with session.post(f"{url}/embeddings", data=body, headers={"Content-Type": "application/json"}) as reply:
            data = await reply.read()
            if reply.status != 200:
                return None, f"HTTP_{reply.status}"
        elapsed = (time.perf_counter() - began) * 1000.0
        rows = json.loads(data)["data"]
        if len(rows) != 1 or (hidden is not None and len(rows[0]["embedding"]) != hidden):
            return None, "WRONG_SIZE"
        return elapsed, ""
    except TimeoutError:
        return None, "CLIENT_TIMEOUT"
    except Exception as exc:  # noqa: BLE001 - every failure is counted under its own name
        return None, type(exc).__name__


async def open_loop_async(
    url: str,
    requests: list[Request],
    rate: float,
    seed: int = 0,
    timeout_s: float = 60.0,
    hidden: int | None = None,
) -> dict[str, Any]:
    """Poisson arrivals at `rate`/s: `requests` in order, each sent at its time whatever the earlier ones did."""
    import aiohttp

    gaps = np.random.default_rng(seed).exponential(1.0 / rate, size=len(requests))
    times = np.cumsum(gaps) - gaps[0]
    rows: list[dict[str, Any]] = [{} for _ in requests]
    lags: list[float] = []
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:

        async def one(index: int) -> None:
            latency, error = await time_one(session, url, requests[index], hidden)
            rows[index] = {
                "length": requests[index].length,
                "at_s": round(float(times[index]), 4),
                "latency_ms": None if latency is None else round(latency, 3),
                "error": error,
            }

        tasks = []
        began = time.perf_counter()
        for index, at in enumerate(times):
            delay = began + float(at) - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            lags.append((time.perf_counter() - began - float(at)) * 1000.0)
            tasks.append(asyncio.create_task(one(index)))
        await asyncio.gather(*tasks)
        window = time.perf_counter() - began
    latencies = [row["latency_ms"] for row in rows if row["latency_ms"] is not None]
    errors: dict[str, int] = {}
    for row in rows:
        if row["error"]:
            errors[row["error"]] = errors.get(row["error"], 0) + 1
    return {
        "mode": "poisson",
        "rate_rps": rate,
        "sent": len(rows),
        "ok": len(latencies),
        "errors": errors,
        "throughput_rps": round(len(latencies) / window, 3) if window > 0 else None,
        "latency_ms": _percentiles(latencies),
        "send_lag_p99_ms": round(float(np.percentile(lags, 99)), 2) if lags else None,
        "window_s": round(window, 2),
        "requests": rows,
    }


def open_loop(
    url: str,
    requests: list[Request],
    rate: float,
    seed: int = 0,
    timeout_s: float = 60.0,
    hidden: int | None = None,
) -> dict[str, Any]:
    return asyncio.run(open_loop_async(url, requests, rate, seed, timeout_s, hidden))


# --- the reference ------------------------------------------------------------------------------------------------


def pool(hidden_states: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """infinity's output from BERT's last hidden state (n, t, h) and attention mask (n, t): the mean over the masked
    tokens ([CLS] and [SEP] included), L2-normalised."""
    mask = mask.astype(np.float32)[..., None]
    mean = (hidden_states * mask).sum(axis=1) / np.maximum(mask.sum(axis=1), 1e-9)
    return mean / np.maximum(np.linalg.norm(mean, axis=1, keepdims=True), 1e-12)


def reference(folder: Path | str, requests: list[Request]) -> np.ndarray:
    """transformers' BertModel on each request alone (unpadded), pooled as infinity pools."""
    import torch
    from transformers import BertModel

    model = BertModel.from_pretrained(str(folder)).eval()
    out = []
    with torch.inference_mode():
        for request in requests:
            ids = torch.from_numpy(request.ids)[None]
            hidden = model(
                input_ids=ids, attention_mask=torch.ones_like(ids), token_type_ids=torch.zeros_like(ids)
            ).last_hidden_state
            out.append(pool(hidden.numpy(), np.ones(ids.shape, dtype=np.int64))[0])
    return np.asarray(out, dtype=np.float32)


# --- the check ----------------------------------------------------------------------------------------------------


def _tokenizer_check(folder: Path, requests: list[Request]) -> dict[str, Any]:
    """The folder's tokenizer, loaded as transformers (this .venv's) and infinity's environment load it, gives each
    request's ids."""
    from transformers import AutoTokenizer

    texts = [request.text for request in requests]
    here = AutoTokenizer.from_pretrained(str(folder))
    same_here = all(list(here(request.text)["input_ids"]) == request.ids.tolist() for request in requests)
    probe = (
        "import json, sys; from transformers import AutoTokenizer; "
        f"t = AutoTokenizer.from_pretrained({str(folder)!r}); "
        "print(json.dumps([type(t).__name__, t(json.load(sys.stdin))['input_ids']]))"
    )
    out = subprocess.run(
        [str(require() / "bin/python"), "-c", probe], input=json.dumps(texts), capture_output=True, text=True
    )
    if out.returncode != 0:
        raise RuntimeError(f"infinity's environment cannot load the tokenizer: {out.stderr[-2000:]}")
    kind, there = json.loads(out.stdout)
    same_there = all(ids == request.ids.tolist() for ids, request in zip(there, requests, strict=True))
    return {
        "transformers_here": type(here).__name__,
        "same_ids_here": same_here,
        "infinity_env": kind,
        "same_ids_infinity_env": same_there,
    }


def verify(folder: Path, config: Any, lengths: list[int], rate: float, count: int, seed: int) -> dict[str, Any]:
    """Build the folder, start infinity at its defaults, check dimensions, usage and the embeddings against
    transformers, run a short Poisson load; then once more with --lengths-via-tokenize for the usage in tokens."""
    began = time.monotonic()
    build_folder(folder, config, seed)
    cfg = folder_config(folder)
    hidden, vocab = cfg["hidden_size"], cfg["vocab_size"]
    requests = make_requests(lengths, vocab, seed)
    report: dict[str, Any] = {
        "versions": installed_versions(),
        "folder": str(folder),
        "model": {k: cfg[k] for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")},
        "built_s": round(time.monotonic() - began, 1),
        "lengths": lengths,
        "tokenizer": _tokenizer_check(folder, requests),
    }
    expected = reference(folder, requests)
    with Infinity(folder) as server:
        report["server"] = server.describe()
        one = [server.embed([request.text]) for request in requests]
        single = np.concatenate([embedding for embedding, _ in one])
        batch, usage = server.embed([request.text for request in requests])
        report["dimension"] = {"expected": hidden, "got": list(batch.shape)}
        report["usage_default"] = {
            "got": [u["total_tokens"] for _, u in one],
            "characters": [len(request.text) for request in requests],
            "batch_total": usage["total_tokens"],
        }
        report["vs_transformers"] = {
            "max_abs_diff_one_by_one": float(np.abs(single - expected).max()),
            "max_abs_diff_one_batch_padded": float(np.abs(batch - expected).max()),
            "min_cosine": float((single * expected).sum(axis=1).min()),
            "norms": [round(float(n), 6) for n in np.linalg.norm(single, axis=1)],
        }
        load_lengths = [lengths[i % len(lengths)] for i in range(count)]
        load = open_loop(server.url, make_requests(load_lengths, vocab, seed + 1), rate, seed, hidden=hidden)
        load["requests"] = load["requests"][:5]  # a sample; the harness returns all of them
        report["poisson"] = load
    with Infinity(folder, lengths_via_tokenize=True) as server:
        tokens = [server.embed([request.text])[1]["total_tokens"] for request in requests]
        report["usage_lengths_via_tokenize"] = {"got": tokens, "intended": [r.length for r in requests]}
    report["ok"] = bool(
        report["tokenizer"]["same_ids_here"]
        and report["tokenizer"]["same_ids_infinity_env"]
        and report["dimension"]["got"] == [len(lengths), hidden]
        and report["usage_default"]["got"] == report["usage_default"]["characters"]
        and report["usage_lengths_via_tokenize"]["got"] == report["usage_lengths_via_tokenize"]["intended"]
        and report["vs_transformers"]["max_abs_diff_one_batch_padded"] < 1e-4
        and report["poisson"]["ok"] == report["poisson"]["sent"]
    )
    report["total_s"] = round(time.monotonic() - began, 1)
    return report


SHAPES = {
    "tiny": {"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 512},
    "small": {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4, "intermediate_size": 1024},
    "base": {},
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--folder", type=Path, default=HERE / ".work" / "infinity-bert")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="small", help="the BertConfig built (base: 768x12)")
    parser.add_argument("--lengths", default="1,5,12,31,64,128")
    parser.add_argument("--rate", type=float, default=5.0, help="the short Poisson load's requests/s")
    parser.add_argument("--count", type=int, default=50, help="requests in the short Poisson load")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        require()
    except PeerMissing as exc:
        print(exc, file=sys.stderr)
        return 2
    lengths = [int(x) for x in args.lengths.split(",")]
    report = verify(args.folder, SHAPES[args.shape], lengths, args.rate, args.count, args.seed)
    print(dump(report))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
