"""The 16-core BERT table the length benches emulate (issue 40), made from this machine's BERT-base at 128 tokens.

The Packrat paper's 16-core BERT table (`bench/profiles/bert-cloudlab16.csv`) barely depends on the batch below 8
(120 ms at batch 1, 137 at 2, on one thread): it was measured at an input far shorter than 128 tokens, so read as
a table at 128 tokens it says a 12-token query costs what a 128-token one does, and no planning by tokens can show.
This script makes the table the emulated comparison uses instead:

- its one-thread column is this machine's built-in BERT-base (`builtin:bert-base-masked`, torch fp32, one thread)
  measured at 128 tokens for batches 1, 2, 4, 8 and 16 (medians of `--repeats` runs after one warm-up);
- its other columns scale that by the paper's measured thread scaling at the same batch:
  L(t, b) = L_here(1, b) × L_paper(t, b) / L_paper(1, b).

The assumption, written into the table's comment line: BERT-base at 128 tokens scales over threads as the paper's
BERT did. The length rule the emulated workers wait by (`packrat_daemon.wire.length_cost`: b sequences of n tokens
cost a batch of b·n/128) is checked here on the same model: the JSON carries measured L(b, n) at shorter lengths
against the rule's prediction from the measured 128-token column.

    .venv/bin/python bench/length_table.py  # the table, and its JSON in bench/results/length-table.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from packrat_daemon.wire.length_cost import equivalent_batch, interpolate  # noqa: E402
from policies.planning.profile import Profile  # noqa: E402

HERE = Path(__file__).resolve().parent
PAPER = HERE / "profiles" / "bert-cloudlab16.csv"
OUT = HERE / "profiles" / "bert-base-lengths16.csv"
MODEL = "builtin:bert-base-masked"
REFERENCE = 128
BATCHES = (1, 2, 4, 8, 16)
VOCAB = 30522


def bert_timer(threads: int, repeats: int) -> Callable[[int, int], float]:
    """Times this machine's BERT-base (torch fp32, `threads` threads): ms of `rows` sequences of `length` tokens,
    the median of `repeats` runs after one warm-up."""
    import torch

    from workers.models.loading import load_model

    torch.set_num_threads(threads)
    model = load_model(MODEL).module
    rng = np.random.default_rng(0)

    def timed(rows: int, length: int) -> float:
        ids = rng.integers(1, VOCAB, (rows, length)).astype(np.int64)
        packed = np.concatenate([ids, np.ones_like(ids), np.zeros_like(ids)], axis=1).view(np.uint8)
        x = torch.from_numpy(packed)
        with torch.inference_mode():
            model(x)
            samples = []
            for _ in range(repeats):
                start = time.perf_counter()
                model(x)
                samples.append((time.perf_counter() - start) * 1000.0)
        return statistics.median(samples)

    return timed


def measure(repeats: int) -> tuple[dict[int, float], list[dict[str, Any]]]:
    """This machine's BERT-base on one thread: ms per batch at 128 tokens, and the length rule's check."""
    timed = bert_timer(1, repeats)
    column = {batch: timed(batch, REFERENCE) for batch in BATCHES}
    row = sorted(column.items())
    checks = []
    for rows, length in ((1, 16), (1, 32), (1, 64), (4, 16), (4, 32), (4, 64), (16, 16), (16, 32)):
        measured = timed(rows, length)
        predicted = interpolate(row, equivalent_batch(rows, length, REFERENCE))
        assert predicted is not None
        checks.append(
            {
                "rows": rows,
                "tokens": length,
                "measured_ms": round(measured, 1),
                "rule_ms": round(predicted, 1),
                "measured_over_rule": round(measured / predicted, 3),
            }
        )
    return column, checks


def table(column: dict[int, float]) -> str:
    paper = Profile.read_csv(PAPER)
    cpu = _cpu_name()
    lines = [
        f"# made by bench/length_table.py: one-thread column = built-in BERT-base at {REFERENCE} tokens, torch fp32, "
        f"measured on {cpu}; other threads = that x the Packrat paper's 16-core BERT thread scaling at the same batch "
        f"(bert-cloudlab16.csv); assumption: BERT-base at {REFERENCE} tokens scales over threads as the paper's "
        "BERT did",
        "threads,batch,latency_ms",
    ]
    for threads in range(1, 17):
        for batch in BATCHES:
            one, here = paper.latency(1, batch), paper.latency(threads, batch)
            if one is None or here is None:
                continue
            lines.append(f"{threads},{batch},{column[batch] * here / one:.3f}")
    return "\n".join(lines) + "\n"


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip().replace(",", " ")
    except OSError:
        pass
    return "this machine"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--json", type=Path, default=HERE / "results" / "length-table.json")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    column, checks = measure(args.repeats)
    args.out.write_text(table(column))
    result = {
        "load_average": load,
        "one_thread_128_tokens_ms": {b: round(v, 1) for b, v in column.items()},
        "rule_check": checks,
        "table": str(args.out.relative_to(HERE.parent)),
    }
    text = json.dumps(result, indent=2)
    print(text)
    args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
