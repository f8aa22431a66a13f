"""A model for the Open Inference Protocol tests (a `module:function` spec the daemon's template imports).

One tiny MLP with two sentinels, so that one daemon can show every error class: an input holding 13.0 makes
the model raise (the daemon answers INTERNAL), one holding 7.0 makes it take SLOW_S (timeouts, a full queue,
a drain with work in flight). Building it takes START_S, so a test can watch the gateway before the daemon
serves.
"""

from __future__ import annotations

import time

import torch
from torch import nn

FAIL, SLOW = 13.0, 7.0
SLOW_S = 1.0
START_S = 3.0


class SentinelMLP(nn.Module):
    packrat_input = "float32:16"

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.body = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if bool((x == FAIL).any()):
            raise ValueError("the test asked this model to fail")
        if bool((x == SLOW).any()):
            time.sleep(SLOW_S)
        return self.body(x)


def sentinel_mlp() -> nn.Module:
    time.sleep(START_S)
    return SentinelMLP()
