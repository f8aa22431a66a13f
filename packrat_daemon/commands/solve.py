"""`packrat solve`: the plan a policy picks for a profile, cores and batch sizes. Never imports torch."""

from __future__ import annotations

import argparse
import json
from typing import Any

from packrat_daemon.commands.options import add_settings, int_list, positive_int
from policies.packrat import MIN_SPLIT_GAIN
from policies.planning.distribution import BatchDistribution
from policies.planning.profile import Profile
from policies.planning.topology import Topology


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "solve",
        help="print the optimal ⟨instances, threads, batch⟩ for a profile",
        description="Solve exactly for the instances that minimise the latency of each batch size.",
    )
    parser.add_argument("--profile", required=True, help="profile CSV (header threads,batch,latency_ms)")
    parser.add_argument("--cores", type=positive_int, help="usable cores (default: detected on this machine)")
    parser.add_argument("--batch", type=int_list, required=True, help="batch size(s), e.g. 8 or 1,8,64")
    add_settings(parser, ["policy", "plan", "min_split_gain"])  # as `serve` takes them
    parser.add_argument("--runtime", help="which runtime's rows to use when the profile holds several")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.set_defaults(run=run)


def solve_plans(
    profile: Profile,
    topology: Topology,
    batches: list[int],
    policy_name: str,
    plan: str | None = None,
    min_split_gain: float = MIN_SPLIT_GAIN,
) -> list[dict[str, Any]]:
    from policies.base import PolicySettings
    from policies.registry import policy_from_settings

    policy = policy_from_settings(policy_name, PolicySettings(plan, min_split_gain))
    plans = []
    for batch in batches:
        result = policy.plan(profile, topology, BatchDistribution.single(batch))
        latency = result.predicted_latency_ms
        if latency is None and not result.oversubscribed:
            lhats = [profile.lhat(i.threads, i.batch) for i in result.instances]
            latency = None if None in lhats else max(x for x in lhats if x is not None)
        plans.append(
            {
                "batch": batch,
                "latency_ms": None if latency is None else round(float(latency), 6),
                "instances": [{"threads": i.threads, "batch": i.batch} for i in result.instances],
            }
        )
    return plans


def run(args: argparse.Namespace) -> int:
    profile = Profile.read_csv(args.profile, runtime=args.runtime)
    topology = Topology.synthetic(args.cores) if args.cores else Topology.detect()
    plans = solve_plans(profile, topology, args.batch, args.policy, args.plan, args.min_split_gain)
    if args.json:
        print(json.dumps({"cores": topology.usable_cores, "plans": plans}))
        return 0
    print(f"{args.policy} plans on {topology.usable_cores} cores ({args.profile})")
    print(f"{'batch':>7}  {'latency ms':>11}  instances (threads×inputs)")
    for plan in plans:
        ms = plan["latency_ms"]
        latency = "shared" if ms is None else f"{ms:.2f}" if ms >= 1 else f"{ms:.3g}"  # a small model is not "0.00"
        groups: dict[tuple[int, int], int] = {}
        for inst in plan["instances"]:
            key = (inst["threads"], inst["batch"])
            groups[key] = groups.get(key, 0) + 1
        text = ", ".join(f"{n}× {t}t×{b}" for (t, b), n in groups.items())
        print(f"{plan['batch']:>7}  {latency:>11}  {len(plan['instances'])} instance(s): {text}")
    if any(plan["latency_ms"] is None for plan in plans):
        print("note: latency 'shared': the instances share cores, so their cells do not predict it")
    if args.cores and args.cores > (usable := Topology.detect().usable_cores):
        print(f"note: planned for {args.cores} cores; this machine has {usable} usable")
    return 0
