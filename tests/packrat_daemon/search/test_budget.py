"""Budgets: a fraction of the grid or seconds, parsed with messages that say what is expected."""

from __future__ import annotations

import pytest

from packrat_daemon.search import Budget
from packrat_daemon.wire.errors import ProfileError


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0.25", Budget(fraction=0.25)),
        ("1", Budget(fraction=1.0)),
        ("300s", Budget(seconds=300.0)),
        (" 2.5S ", Budget(seconds=2.5)),
    ],
)
def test_budget_parsing(text: str, expected: Budget):
    assert Budget.parse(text) == expected


@pytest.mark.parametrize("text", ["0", "-0.1", "2", "abc", "s", "-5s", "nans"])
def test_bad_budgets_say_what_is_expected(text: str):
    with pytest.raises(ProfileError, match="fraction of the grid"):
        Budget.parse(text)


def test_a_fraction_caps_cells_at_least_one():
    assert Budget(fraction=0.25).max_cells(176) == 44
    assert Budget(fraction=0.001).max_cells(176) == 1
    assert Budget(seconds=5.0).max_cells(176) == 176
