"""Option parsers shared by several commands."""

from __future__ import annotations

import argparse


def int_list(text: str) -> list[int]:
    """'1,2,4' or '1-4' or '1,2,8-16' → sorted unique positive ints."""
    values: set[int] = set()
    try:
        for part in text.split(","):
            part = part.strip()
            if "-" in part:
                low, high = (int(x) for x in part.split("-", 1))
                values.update(range(low, high + 1))
            elif part:
                values.add(int(part))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers like 1,2,4 or 1-8, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive numbers, got {text!r}")
    return sorted(values)


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value
