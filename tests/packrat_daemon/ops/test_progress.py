"""The progress line: one line per step where nobody watches a terminal, one redrawn line where someone does;
the bar, the counts, elapsed time and ETA; nothing at all when disabled."""

from __future__ import annotations

import io
import time

from packrat_daemon.ops.progress import Progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def started_ago(progress: Progress, seconds: float) -> Progress:
    """`progress` as if it had started `seconds` ago (the clock is not what these tests check)."""
    progress.started = time.monotonic() - seconds
    return progress


def test_off_a_terminal_each_step_is_a_line_of_its_own() -> None:
    stream = io.StringIO()
    progress = started_ago(Progress(4, "profiling", stream), 65.2)
    progress.advance("cell (1, 8)")
    progress.advance("cell (2, 8)", steps=2)
    progress.close()
    assert stream.getvalue().splitlines() == [
        "profiling [######------------------] 1/4 elapsed 1:05 eta 3:16 cell (1, 8)",
        "profiling [##################------] 3/4 elapsed 1:05 eta 0:22 cell (2, 8)",
    ]


def test_before_the_first_step_the_eta_is_unknown() -> None:
    stream = io.StringIO()
    started_ago(Progress(10, "start-up", stream), 0.2).note("loading the model")
    assert stream.getvalue() == "start-up [------------------------] 0/10 elapsed 0:00 eta ? loading the model\n"


def test_on_a_terminal_the_line_is_redrawn_and_closed_with_a_newline() -> None:
    stream = Terminal()
    progress = Progress(2, "x", stream)
    progress.advance()
    progress.advance()
    progress.close()
    text = stream.getvalue()
    assert text.count("\r\x1b[2K") == 2 and text.endswith("\n") and text.count("\n") == 1
    assert "[########################] 2/2" in text.rsplit("\r\x1b[2K", 1)[1]


def test_more_steps_than_announced_keep_the_bar_full_and_a_total_of_zero_counts_as_one() -> None:
    stream = io.StringIO()
    progress = Progress(0, "x", stream)
    assert progress.total == 1
    progress.advance(steps=3)
    assert "[########################] 3/1" in stream.getvalue()


def test_disabled_it_writes_nothing() -> None:
    stream = Terminal()
    progress = Progress(3, "x", stream, enabled=False)
    progress.advance("a")
    progress.note("b")
    progress.close()
    assert stream.getvalue() == "" and progress.done == 1
