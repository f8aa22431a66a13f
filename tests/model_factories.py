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
