"""Fixtures shared by every test package; the helpers they use live in `tests.helpers`."""

from __future__ import annotations

import gc
import itertools
import os
from collections.abc import Callable, Generator, Iterator
from pathlib import Path

import pytest

from tests.helpers.timing_guard import TimingGuard

# numpy's and scipy's OpenBLAS on one thread, unless the caller chose otherwise. Left alone it starts a thread per
# core and wakes them all for each call, and the suite's calls are on matrices of tens of rows (the search's
# Gaussian process, the solver's tables): on two cores shared with other work the wake-ups cost more than the
# arithmetic (the search, policy and simulation tests took 2.5 times as long, and a third more CPU). It is read when
# OpenBLAS loads, so here, before any test module imports numpy; the daemons and workers tests start inherit it
# (their models run on torch's own thread pool, which this leaves alone).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def pytest_configure(config: pytest.Config) -> None:
    """The fast suite's time guard: an unmarked test over 2 s of CPU fails (tests/helpers/timing_guard.py)."""
    config.pluginmanager.register(TimingGuard(), "packrat-timing-guard")


def _collect_and_freeze() -> None:
    """Collect the garbage, then move every object left out of the cyclic collector's way (`gc.freeze`). The test
    process holds some 600 000 objects (torch, transformers, scipy, the collected tests) that each of Python's full
    collections traversed: about 5 s of the fast suite's CPU on a loaded machine. What a module leaves is frozen
    once it has run; its own objects are collected as before, and garbage is collected first, never frozen."""
    gc.collect()
    gc.freeze()


def pytest_collection_finish(session: pytest.Session) -> None:
    _collect_and_freeze()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, None, None]:
    result = yield  # the module's fixtures are torn down by now when it was its last test
    if nextitem is None or getattr(nextitem, "module", None) is not getattr(item, "module", None):
        _collect_and_freeze()
    return result


@pytest.fixture
def daemon_log(tmp_path: Path) -> Callable[[], str]:
    return lambda: (tmp_path / "daemon.log").read_text()


@pytest.fixture(autouse=True, scope="session")
def _no_state_in_the_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A daemon keeps what it measured in a default state folder below $XDG_STATE_HOME (or the unit's
    $STATE_DIRECTORY): never the real one in a test. Session-wide first, for module-scoped daemons."""
    saved = {name: os.environ.get(name) for name in ("XDG_STATE_HOME", "STATE_DIRECTORY")}
    os.environ.pop("STATE_DIRECTORY", None)
    os.environ["XDG_STATE_HOME"] = str(tmp_path_factory.mktemp("state-home"))
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(scope="session")
def _state_homes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("state-homes")


_state_home_numbers = itertools.count()


@pytest.fixture(autouse=True)
def _own_state_home(_state_homes: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test its own $XDG_STATE_HOME: no test's daemon serves what an earlier test's learned. Numbered here, in
    one folder of the session's: `tmp_path_factory.mktemp` lists the session's whole temporary folder to number a
    new one, a few milliseconds a test once it holds a suite's worth, seconds over the suite."""
    home = _state_homes / str(next(_state_home_numbers))
    home.mkdir()
    monkeypatch.setenv("XDG_STATE_HOME", str(home))


@pytest.fixture(scope="session")
def shared_conversion_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One $PACKRAT_CACHE_DIR for the session's tests that need a model converted without testing the
    conversion or the cache itself: a built-in one module converts is a cache hit in the next, and a model's
    second runtime is converted from the first one's ONNX export. A test of converting or caching keeps a
    fresh folder of its own."""
    return tmp_path_factory.mktemp("shared-packrat-cache")


@pytest.fixture(autouse=True, scope="session")
def _no_conversions_in_the_home(shared_conversion_cache: Path) -> Iterator[None]:
    """Conversions (and their daemons, which inherit it) go to the session's shared cache, never the real
    ~/.cache/packrat: each model is converted once per run, and no run serves what an earlier one left."""
    saved = os.environ.get("PACKRAT_CACHE_DIR")
    os.environ["PACKRAT_CACHE_DIR"] = str(shared_conversion_cache)
    yield
    if saved is None:
        os.environ.pop("PACKRAT_CACHE_DIR", None)
    else:
        os.environ["PACKRAT_CACHE_DIR"] = saved
