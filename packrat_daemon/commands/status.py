"""`packrat status`: what a running daemon is doing, read through its serving endpoint (read-only, like
`info`): the plan and why, the workers, the live batch sizes and arrival rate, the queue, where the
profile comes from, and the plan history with measured reconfiguration times (docs/status.md).

Never imports torch.
"""

from __future__ import annotations

import argparse
import datetime
import json
from typing import Any

from packrat_daemon.commands.options import add_client_options, add_command


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    summary = "show a running daemon's plan, workers, traffic, queue, profile and plan history"
    parser = add_command(subparsers, "status", summary, "Read-only, the protocol's `status` op; docs/status.md.")
    add_client_options(parser)
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for the answer (default 5)")
    parser.add_argument("--json", action="store_true", help="print the whole reply as JSON")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from packrat_daemon.wire.client import Client

    with Client(args.endpoint, timeout=args.timeout, key=args.key, server_key=args.server_key) as client:
        status = client.status()
    print(json.dumps(status, indent=2) if args.json else render(status))
    return 0


def _share(share: dict[str, Any] | None) -> list[str]:
    """This model's CPUs, who assigned them and the last move (docs/colocation.md); none for an older daemon."""
    if not share:
        return []
    by = share["assigned_by"]
    said = {"every usable CPU": "every usable CPU (no --cpus given, no coordinator)", "--cpus": "as --cpus gives"}
    line = f"  share: CPUs {share['cpus']} ({share['cores']} cores), {said.get(by, f'assigned by {by}')}"
    move = share.get("last_move")
    if move:
        gain = move.get("predicted_gain")
        line += f"; last move {move['from']} → {move['to']}" + ("" if gain is None else f", predicted gain {gain:.1%}")
    return [line]


def render(status: dict[str, Any]) -> str:
    """The human view of a status reply: a few tables."""
    from packrat_daemon.measure.runtime_choice import ms_text

    plan, planning = status["plan"], status.get("planning", {})
    lines = [f"model {status['model']} on {status['runtime']} ({status['precision']}), max batch {status['max_batch']}"]
    if status.get("emulation"):
        lines.append("EMULATED: the workers compute nothing; latencies are the profile's (docs/emulation.md)")
    layouts = [" + ".join(str(i["threads"]) for i in layout) for layout in [plan["instances"], *plan["alternatives"]]]
    predicted = plan.get("predicted_latency_ms")
    lines += [
        "",
        f"plan (generation {status.get('generation')}): {plan['policy']}, threads per instance "
        f"{' | '.join(layouts)}, split {plan['split']}"
        + ("" if predicted is None else f", predicted {ms_text(predicted)} ms"),
        f"  why: {plan['reason']}",
        f"  planning: policy {planning.get('policy')}, adapting {'yes' if planning.get('adapting') else 'no'}"
        + (f", operator asked {planning['override']}" if planning.get("override") else ""),
        *_share(status.get("share")),
        "",
        "workers:",
    ]
    rows = [["id", "pid", "runtime", "threads", "cores", "state", "batches"]]
    for w in status["workers"]:
        state = w["state"] + ("" if w.get("serving", True) else " (not serving)")
        cores = ",".join(str(c) for c in w["cores"])
        served = str(w["batches_served"])
        rows.append([str(w["id"]), str(w["pid"]), w["runtime"], str(w["threads"]), cores, state, served])
    lines += _table(rows)
    traffic, queue = status["traffic"], status["queue"]
    sizes = ", ".join(f"{b}: {w:.0%}" for b, w in traffic["batch_sizes"]) or "none yet"
    lines += [
        "",
        f"traffic (half-life {traffic['half_life_s']:.0f} s): {traffic['inputs_per_s']:.1f} inputs/s in "
        f"{traffic['batches_per_s']:.1f} batches/s; batch sizes {sizes}",
        *_tokens(traffic.get("tokens")),
        f"queue: {queue['requests']} request(s), {queue['inputs']}/{queue['max_inputs']} inputs, batch in flight: "
        f"{'yes' if queue['batch_in_flight'] else 'no'}{'' if queue['accepting'] else ', not accepting (draining)'}",
    ]
    gateway = status.get("gateway")
    if gateway:  # the Open Inference Protocol gateway beside the daemon: down means the daemon is not ready
        restarts = (
            f", {gateway['restarts']} restart(s), last exit {gateway['last_exit']}" if gateway["restarts"] else ""
        )
        lines.append(f"gateway: {gateway['describe']}{restarts}")
    adapting = bool(planning.get("adapting"))
    lines += ["", *_provenance(status["profile"], adapting), *_predictions(status.get("predictions"), adapting)]
    lines += [*_choice(status.get("runtime_choice")), "", "plan history:"]
    rows = [["time (UTC)", "reason", "from", "to", "gain", "first", "serving", "retired"]]
    for change in status["history"]:
        gain = change["predicted_gain"]
        rows.append([
            datetime.datetime.fromtimestamp(change["time"], datetime.UTC).strftime("%Y-%m-%d %H:%M:%S"),
            change["reason"],
            change["from"] or "-",
            change["to"],
            "-" if gain is None else f"{gain:+.1%}",
            *(_ms(change[key]) for key in ("first_serving_s", "serving_s", "retired_s")),
        ])  # fmt: skip
        if change["superseded"]:
            rows[-1][-1] = "superseded"
    lines += _table(rows)
    return "\n".join(lines)


def _provenance(profile: dict[str, Any], adapting: bool) -> list[str]:
    """Where the served profile's cells come from (measured at start, or while a first answer served; how
    crowded its cores were), and what production has timed since."""
    age, during = profile.get("offline_age_s"), profile.get("measured_while")
    where = "measured at start" + (f" in the background, while {during} served" if during else "")
    where += "" if age is None else f", {_age(age)} ago"
    lines = [f"profile: {profile['measured_offline']} cell(s) {where}; {profile['estimated']} estimated by the "
             "start-up search (not served on)"]  # fmt: skip
    crowding = profile.get("contention")
    if crowding:
        again = "; a start on a quiet machine measures it again" if crowding.get("contended") else ""
        lines.append(f"  {'WARNING: ' if crowding.get('contended') else ''}{crowding['describe']}{again}")
    if profile.get("restored_from"):
        lines.append(f"  restored from {profile['restored_from']}")
    if profile.get("state_file"):
        saved = profile.get("saved_age_s")
        lines.append(f"  kept in {profile['state_file']}" + ("" if saved is None else f", saved {_age(saved)} ago"))
    timed = profile.get("production", [])
    if timed:
        uses = (
            "online adaptation plans on the profile rescaled to these and merged with them"
            if adapting
            else "kept, not planned on (this daemon does not adapt)"
        )
        lines.append(f"production: {len(timed)} cell(s) timed while serving, {profile['learned_in_production']} "
                     f"with enough samples to count: {uses}")  # fmt: skip
    for cell in timed:
        age_s = cell.get("age_s")
        counts = "counts" if cell.get("counts", True) else "too few samples yet"
        lines.append(
            f"  ⟨{cell['threads']} thread(s), batch {cell['batch']}⟩: {cell['latency_ms']:.2f} ms, weight "
            f"{cell['weight']:.1f} ({counts})" + ("" if age_s is None else f", last seen {_age(age_s)} ago")
        )
    return lines


def _predictions(predictions: dict[str, Any] | None, adapting: bool) -> list[str]:
    """The profile's predicted compute per batch against the measured, per layout of this plan, and whether they
    disagree by more than the profile's noise (docs/status.md)."""
    rows = [row for row in (predictions or {}).get("layouts", []) if row["predicted_ms"] is not None]
    if not rows:
        return []
    noise = predictions["noise"] if predictions else 0.0
    lines = [f"predicted against measured (compute per batch on this plan; the profile's noise ±{noise:.0%}):"]
    for row in rows:
        verdict = "disagree beyond the noise" if row["disagrees"] else "agree within the noise"
        lines.append(f"  layout {row['layout']}: {row['batches']} batch(es), measured {row['measured_ms']:.2f} ms, "
                     f"predicted {row['predicted_ms']:.2f} ms ({row['ratio']:.2f}×): {verdict}")  # fmt: skip
    if any(row["disagrees"] for row in rows):
        lines.append(
            "  the profile's predictions do not hold on this machine now: "
            + (
                "production timings correct the plan as it serves"
                if adapting
                else "this daemon does not adapt, so "
                "its plan stays as predicted; a restart on a quiet machine measures the profile again"
            )  # fmt: skip
        )
    return lines


def _choice(choice: dict[str, Any] | None) -> list[str]:
    """Which runtime and precision candidate is served, and why each other one lost (docs/status.md)."""
    from packrat_daemon.measure.runtime_choice import ms_text

    if not choice or len(choice.get("candidates", [])) < 2:
        return []
    when = "at this start" if choice["decided_at_this_start"] else f"at a start {_age(choice['decided_age_s'])} ago"
    lines = ["", f"runtime choice ({when}): serving {choice['served']}"]
    if choice["decided_at_this_start"] and choice.get("kept_choice_not_reused"):
        lines.append(f"  every candidate measured again: {choice['kept_choice_not_reused']}")
    for c in choice["candidates"]:
        predicted = "" if c["predicted_ms"] is None else f", predicted {ms_text(c['predicted_ms'])} ms"
        lines.append(f"  {c['candidate']}: {c['verdict']}{predicted}: {c['why']}")
    return lines


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f} ms"


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _tokens(tokens: dict[str, Any] | None) -> list[str]:
    """A model of a free axis: its sequences' lengths and what padding cost, since start."""
    if not tokens:
        return []
    shares = ", ".join(f"<={bound}: {share:.0%}" for bound, share in tokens["length_shares"])
    waste = tokens["padding_waste"]
    return [
        f"sequences: {tokens['sequences']} answered, mean {tokens['mean_length']:.1f} tokens ({shares}); padding "
        + (
            "none counted yet"
            if waste is None
            else f"waste {waste:.2f}x ({tokens['padded_tokens']} tokens computed for {tokens['real_tokens']})"
        )
    ]


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(c.ljust(width) for c, width in zip(row, widths, strict=True)).rstrip() for row in rows]
