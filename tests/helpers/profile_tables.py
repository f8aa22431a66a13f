"""Small random profile tables for property tests of the solver and the split."""

from __future__ import annotations

from hypothesis import strategies as st

from policies.planning.profile import Profile


@st.composite
def tables(draw: st.DrawFn) -> Profile:
    """Small random tables: sparse batches, ties (coarse latencies), non-monotone noise."""
    threads = draw(st.lists(st.integers(1, 4), min_size=1, max_size=4, unique=True))
    cells = {}
    for t in threads:
        batches = draw(st.lists(st.integers(1, 8), min_size=1, max_size=4, unique=True))
        for b in batches:
            # Small integer latencies make ties common; no monotone constraint at all.
            cells[(t, b)] = float(draw(st.integers(1, 12)))
    return Profile.from_latencies(cells)
