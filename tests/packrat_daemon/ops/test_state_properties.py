"""A state file with any value in any field: the start either serves from it or sets it aside saying why, quickly,
and never raises (docs/state.md, "What is read back, and when it is set aside").

Each example takes a file a daemon wrote (every part present: entries with a guard, the choice, production's
estimates, the live sizes, a plan with a spare layout) and puts arbitrary JSON in some of its fields: ages of
years, NaN, infinities, negative numbers, integers of hundreds of digits, wrong types, fields missing. Then it
runs what a start runs on the file (read, restore, the warm choice, the saved plan, production's estimates
handed back), serves a while (production learns, the tuner looks) and saves, and reads what it saved.
"""

from __future__ import annotations

import json
import logging
import math
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packrat_daemon.measure.runtime_choice import REFUSED, SERVED, Verdict
from packrat_daemon.ops.state import STATE_FILE, Choice, Entry, StateKeeper, identity
from policies.base import InstancePlan
from tests.packrat_daemon.ops.test_state import CONFIG, PLAN, PROFILE, TOPOLOGY, Serving

YEAR = 366 * 86400.0
DELETE = object()  # the field is left out
SETTINGS = {"policy": "packrat", "max_batch": 4, "batches": []}
IDENTITIES = {
    "torch": identity(CONFIG, "torch", "fp32", TOPOLOGY),
    "torch/bf16": identity(CONFIG, "torch", "bf16", TOPOLOGY),
}
GUARD = {"result": {"max_rel_error": 0.01}, "settings": {"max_rel_error": 0.05}}


def written(folder: Path) -> dict[str, Any]:
    """The document a daemon that chose torch over torch/bf16 writes after serving a while."""
    keeper = StateKeeper(str(folder))
    keeper.record("torch", Entry(IDENTITIES["torch"], PROFILE, {(1, 1): 0.5}))
    keeper.record("torch/bf16", Entry(IDENTITIES["torch/bf16"], PROFILE, guard=GUARD))
    keeper.served_key = "torch"
    keeper.choice = Choice([Verdict("torch", SERVED, 1.5, "the fastest"),
                            Verdict("torch/bf16", REFUSED, None, "accuracy guard: failed")], IDENTITIES,
                           SETTINGS)  # fmt: skip
    serving = Serving(PLAN.__class__(PLAN.instances, "packrat", "a split", 1.5, alternatives=((InstancePlan(2, 4),),)))
    now = time.monotonic()
    for k in range(6):
        serving.adaptation.production.observe(1, 2, 1.6, now - 10 + k)
        serving.adaptation.production.observe(2, 4, 2.2, now - 5 + k)
        serving.adaptation.estimator.observe(2, now - 5 + k)
    keeper.save(serving, "stop")
    return json.loads((folder / STATE_FILE).read_text())


with tempfile.TemporaryDirectory() as _folder:
    BASE = written(Path(_folder))


def _paths(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every field of the document, inner ones included (a whole entry, a whole row, one number of a row)."""
    if path:
        yield path
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _paths(item, (*path, index))


PATHS = sorted(_paths(BASE), key=repr)
NUMBERS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(),
    st.sampled_from([10**400, -(10**400), 2**63, 5e-324, 1e308, -1.0, 0, 5 * YEAR, -YEAR, 1e11, 1e12]),
)
JSON = st.recursive(
    st.none() | st.booleans() | NUMBERS | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=10,
)
CHANGES = st.lists(st.tuples(st.sampled_from(PATHS), st.just(DELETE) | JSON), min_size=1, max_size=4)


def changed(changes: list[tuple[tuple[Any, ...], Any]]) -> dict[str, Any]:
    document = json.loads(json.dumps(BASE))
    for path, value in changes:
        parent, *steps = [document, *path[:-1]]
        for step in steps:  # an earlier change may have replaced what held the field: then nothing changes
            held = isinstance(parent, dict) and step in parent or isinstance(step, int) and _indexes(parent, step)
            parent = parent[step] if held else None
        last = path[-1]
        if isinstance(parent, dict) and value is DELETE:
            parent.pop(last, None)
        elif isinstance(parent, dict) or (isinstance(last, int) and _indexes(parent, last)):
            if value is DELETE:
                del parent[last]
            else:
                parent[last] = value
    return document


def _indexes(value: Any, index: int) -> bool:
    return isinstance(value, list) and index < len(value)


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def start_and_serve(folder: Path) -> StateKeeper:
    """What a start does with the file, then a while of serving, then the stop's save."""
    keeper = StateKeeper(str(folder))
    warm = keeper.warm_choice(IDENTITIES, SETTINGS)
    for key in ("torch", "torch/bf16"):
        entry = keeper.restore(key, IDENTITIES[key])
        if entry is None:  # measured again
            entry = Entry(IDENTITIES[key], PROFILE)
        else:
            assert entry.profile and all(0 < c.latency_ms < math.inf for _, c in entry.profile.items())
            keeper.restored_from = str(keeper.path)
        keeper.record(key, entry)
    keeper.served_key = warm or "torch"
    plan = keeper.resumed_plan(keeper.served_key, "packrat", TOPOLOGY, 4)
    serving = Serving(plan or PLAN)
    keeper.attach(serving.adaptation)
    now = time.monotonic()
    adaptation = serving.adaptation
    for k in range(20):
        adaptation.production.observe(1, 2, 1.5, now + k * 0.1)
        adaptation.estimator.observe(2, now + k * 0.1)
    adaptation.propose(serving.plan, PROFILE, now + 2.0)
    json.dumps([keeper.provenance(serving, now + 2.0), keeper.choice_status()], allow_nan=False)  # `packrat status`
    keeper.save(serving, "stop")
    return keeper


@settings(max_examples=100, derandomize=True, database=None, deadline=None)
@given(CHANGES)
def test_any_value_in_any_field_is_served_or_set_aside_saying_why(changes: list[tuple[tuple[Any, ...], Any]]) -> None:
    served_or_set_aside(changes)


@pytest.mark.slow
@settings(max_examples=1000, derandomize=True, database=None, deadline=None)
@given(CHANGES)
def test_any_value_in_any_field_over_many_more_files(changes: list[tuple[tuple[Any, ...], Any]]) -> None:
    served_or_set_aside(changes)


def served_or_set_aside(changes: list[tuple[tuple[Any, ...], Any]]) -> None:
    records = Records()
    logger = logging.getLogger("packrat.daemon")
    logger.addHandler(records)
    level, logger.level = logger.level, logging.INFO
    started = time.monotonic()
    try:
        with tempfile.TemporaryDirectory() as name:
            folder = Path(name)
            folder.chmod(0o700)
            (folder / STATE_FILE).write_text(json.dumps(changed(changes)))
            start_and_serve(folder)
            aside = [p for p in folder.iterdir() if ".set-aside-" in p.name]
            if aside:  # and the log says why
                said = [line for line in records.lines if line.startswith("state: set ") and " aside as " in line]
                assert len(said) == 1 and said[0].split(": ", 2)[-1].strip(), records.lines
            # Whatever it kept, it wrote a file the next start serves from as it is.
            records.lines.clear()
            again = StateKeeper(str(folder))
            assert not any("aside" in line for line in records.lines), records.lines
            assert again.restore("torch", IDENTITIES["torch"]) is not None and again.resumed is not None
    finally:
        logger.removeHandler(records)
        logger.level = level
    assert time.monotonic() - started < 1.0


def test_the_unchanged_file_is_served_as_it_is(tmp_path: Path) -> None:
    (tmp_path / STATE_FILE).write_text(json.dumps(BASE))
    keeper = start_and_serve(tmp_path)
    assert keeper.choice_restored and keeper.restored_from is not None
    assert not any(".set-aside-" in p.name for p in tmp_path.iterdir())


def test_a_file_saved_a_year_ago_with_a_cell_unseen_for_a_week_is_served() -> None:
    """The finding, in the file: weights underflowed to a denormal, ages of a week and of years, a saved_unix
    in 1970 and one in the far future: served (the estimates decayed to nothing), never set aside."""
    for saved_unix in (0, time.time() - YEAR, 1e11, 1e300):
        document = json.loads(json.dumps(BASE))
        document["saved_unix"] = saved_unix
        rows = document["served"]["production"]
        rows[0][3:] = [5e-324, 8 * 86400.0]
        rows[1][3:] = [1e9, 30 * YEAR]
        with tempfile.TemporaryDirectory() as name:
            folder = Path(name)
            (folder / STATE_FILE).write_text(json.dumps(document))
            keeper = start_and_serve(folder)
            assert keeper.restored_from is not None and sorted(p.name for p in folder.iterdir()) == [STATE_FILE]
