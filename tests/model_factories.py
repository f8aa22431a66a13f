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
