"""Start-up: the policy, a template per (runtime, precision) candidate, the accuracy guard for each reduced
precision, each candidate's profile (read or measured) and plan, the candidate to serve with, and the split
check. A reload (SIGHUP) re-plans in `packrat_daemon.reload`, on this package's planning inputs.

One module per role, sharing one `StartContext` (`context`): the checks before any model loads (`checks`), the
candidates' templates, profiles and plans (`candidates`), the accuracy guard (`guard`), the choice between
candidates and its split check (`choice`), the background measurement (`measuring`), and `start_up` itself, in
order (`sequence`).

What a start measures is kept in the state folder (`ops.state`: `--state-dir`, or the default one): each
candidate's cells, the guard, and each candidate's verdict. A restart whose candidates all match what the file
was decided for starts only the one chosen, on its saved profile and plan, with no guard run and no profiling.

A first start with several candidates answers early (`--first-answer auto`): the first candidate (fp32, which
needs no conversion) is prepared alone and served on a plan that needs no profile, and `Measuring` prepares and
measures every candidate (the served one's runtime included, on a template of its own) in a thread of its own,
at a lower priority, while the main loop serves. Its outcome is handed to the main loop, which switches (the
reconciler's generation on the chosen candidate's template, no request failed).

Everything else here runs before the main loop. A stop signal during the minutes of measuring is seen through
`interrupted` and ends start-up between two measurements with KeyboardInterrupt.
"""

from packrat_daemon.startup.candidates import prepare_candidates, prepare_runtime
from packrat_daemon.startup.checks import candidate_pairs, check_cores, first_answer, profiled_pairs
from packrat_daemon.startup.choice import choice_settings
from packrat_daemon.startup.context import (
    Interrupted,
    Loaded,
    RuntimeCandidate,
    StartContext,
    distribution_for,
    policy_for,
    read_profile,
)
from packrat_daemon.startup.guard import run_guard
from packrat_daemon.startup.measuring import MEASURE_NICE, Measured, Measuring
from packrat_daemon.startup.sequence import Started, start_up

__all__ = [
    "MEASURE_NICE",
    "Interrupted",
    "Loaded",
    "Measured",
    "Measuring",
    "RuntimeCandidate",
    "StartContext",
    "Started",
    "candidate_pairs",
    "check_cores",
    "choice_settings",
    "distribution_for",
    "first_answer",
    "policy_for",
    "prepare_candidates",
    "prepare_runtime",
    "profiled_pairs",
    "read_profile",
    "run_guard",
    "start_up",
]
