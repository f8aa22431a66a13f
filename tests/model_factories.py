"""Model factories for `module:function` specs in tests (importable by the daemon's template)."""

from __future__ import annotations

import time

import torch
from torch import nn


class SlowMLP(nn.Module):
    """A tiny MLP that takes a while per batch, so a worker can be killed mid-batch."""

    packrat_input = "float32:16"

    def __init__(self, delay_s: float = 0.3) -> None:
        super().__init__()
        torch.manual_seed(7)
        self.body = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
        self.delay_s = delay_s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.delay_s)
        return self.body(x)


def slow_mlp() -> nn.Module:
    return SlowMLP()


class RefusesSingleInputs(nn.Module):
    """A tiny MLP that raises on a batch of one input.

    The template loads it without running it, and the daemon's workers warm up on one input, so every
    worker fails at boot: a model that cannot start. A worker warmed up on two inputs starts.
    """

    packrat_input = "float32:16"

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] == 1:
            raise ValueError("this model refuses a batch of one input")
        return self.body(x)


def refuses_single_inputs() -> nn.Module:
    return RefusesSingleInputs()


class PoisonedBy(nn.Module):
    """Doubles its input after a short pause, but raises on a batch holding a value of POISON or more: one bad
    input, as a model with an input it cannot take (warm-up's sample inputs are far below it)."""

    packrat_input = "float32:16"
    POISON = 1000.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(0.02)
        if bool((x >= self.POISON).any()):
            raise ValueError("this model cannot take an input of 1000 or more")
        return x * 2


def poisoned_by_large_values() -> nn.Module:
    return PoisonedBy()


class SlowDoubler(nn.Module):
    """Doubles wide inputs (128 KiB a sample, exactly, in float32) after a pause: tensors big enough to
    travel through shared memory, a result that can be checked bit for bit, and time to kill a worker."""

    packrat_input = "float32:32768"

    def __init__(self, delay_s: float = 0.3) -> None:
        super().__init__()
        self.delay_s = delay_s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.delay_s)
        return x * 2


def slow_doubler() -> nn.Module:
    return SlowDoubler()


def doubler() -> nn.Module:
    return SlowDoubler(delay_s=0.0)


class LosesPrecisionInBf16(nn.Module):
    """A classifier whose fp32 output is its first 4 inputs, computed as (x + 4096) - 4096.

    In float32 the detour is exact enough; in bfloat16 (8 significant bits) x + 4096 rounds to a multiple
    of 32, so the output is wiped out: the accuracy guard must refuse to serve it at bf16.
    """

    packrat_input = "float32:16"

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(16, 16)
        self.down = nn.Linear(16, 4)
        with torch.no_grad():
            self.up.weight.copy_(torch.eye(16))
            self.up.bias.fill_(4096.0)
            self.down.weight.copy_(torch.eye(16)[:4])
            self.down.bias.fill_(-4096.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.up(x))


def loses_precision_in_bf16() -> nn.Module:
    return LosesPrecisionInBf16()


def paced_mlp() -> nn.Module:
    """A tiny MLP that sleeps 25 ms a batch: queueing spreads its latency out while it leaves the CPUs
    (shared with other tests) idle, and the client's own overhead (about a millisecond on a busy machine)
    stays a small part of what it measures."""
    return SlowMLP(delay_s=0.025)


class TwoOutputs(nn.Module):
    """Returns a dict of two outputs, class scores and their softmax: the first, `scores`, is served."""

    packrat_input = "float32:16"

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(11)
        self.body = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        scores = self.body(x)
        return {"scores": scores, "probabilities": scores.softmax(-1)}


def two_outputs() -> nn.Module:
    return TwoOutputs()


def two_outputs_serving_probabilities() -> nn.Module:
    """The same model, naming the output it serves."""
    model = TwoOutputs()
    model.packrat_output = "probabilities"
    return model


class PairOutput(TwoOutputs):
    """The same two outputs as a tuple."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        outputs = super().forward(x)
        return outputs["scores"], outputs["probabilities"]


def pair_output() -> nn.Module:
    return PairOutput()


def tiny_bert_model() -> nn.Module:
    """A 2-layer transformers BertModel as it comes (random weights): it returns a model-output object."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(13)
    config = BertConfig(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64)  # fmt: skip
    model = BertModel(config)
    model.packrat_input = "int64:12"
    return model


class HangsOnMarked(nn.Module):
    """Doubles its input after a short pause, but spins for ever (a busy hang: its CPU time keeps advancing, as a
    model stuck in a loop) on a batch holding a value of MARK or less; warm-up's sample inputs are far above it."""

    packrat_input = "float32:16"
    MARK = -1000.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(0.02)
        if bool((x <= self.MARK).any()):
            while True:  # never returns: the daemon must replace this worker
                pass
        return x * 2


def hangs_on_marked_inputs() -> nn.Module:
    return HangsOnMarked()


class StallsOnMarked(nn.Module):
    """Doubles its input after a short pause, but on a batch holding a marked value stalls as that value says:
    SPIN or less, it spins for ever (a busy hang); SLEEP or less, it sleeps for ever (a sleeping hang, as a deadlock);
    SLOW or less, it answers after SLOW_S using little CPU meanwhile (as a worker on a machine loaded with other work:
    late by the wall clock, not by the work it did). Warm-up's sample inputs are far above every mark."""

    packrat_input = "float32:16"
    SPIN, SLEEP, SLOW = -3000.0, -2000.0, -1000.0
    SLOW_S = 2.5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(0.02)
        lowest = float(x.min())
        if lowest <= self.SPIN:
            while True:
                pass
        if lowest <= self.SLEEP:
            while True:
                time.sleep(60)
        if lowest <= self.SLOW:
            end = time.monotonic() + self.SLOW_S
            while time.monotonic() < end:  # at most a fifth of a CPU: 4 ms of CPU (runnable until had), 16 ms asleep
                busy = time.process_time() + 0.004
                while time.process_time() < busy:
                    pass
                time.sleep(0.016)
        return x * 2


def stalls_on_marked_inputs() -> nn.Module:
    return StallsOnMarked()


class FailsOnEveryInput(nn.Module):
    """A model that loads but raises on any input: its workers fail at their warm-up, one after another."""

    packrat_input = "float32:16"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise ValueError("this model fails on every input")


def fails_on_every_input() -> nn.Module:
    return FailsOnEveryInput()


class BusyMLP(nn.Module):
    """Tens of milliseconds of one core's arithmetic per call, whatever the batch: a model whose profile cells run
    long enough for the kernel's run-queue times to say whether other work crowded them (measure.contention)."""

    packrat_input = "float32:256"

    def __init__(self, rounds: int = 400) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.weight = nn.Parameter(torch.randn(256, 256) / 16.0, requires_grad=False)
        self.rounds = rounds

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(self.rounds):
            x = torch.tanh(x @ self.weight)
        return x


def busy_mlp() -> nn.Module:
    return BusyMLP()
