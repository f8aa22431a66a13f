"""The control channel's messages: a request checked and parsed before it is queued (`parse`), an assign's plan
(`plan_from_request`), a request in words, and an error as the reply carries it.
"""

from __future__ import annotations

import json
from typing import Any

from packrat_daemon.wire.errors import PackratError, PolicyError
from policies.base import Plan
from policies.planning.topology import format_cpulist

# A request is a few fields, an assign's CPU list and plan (Plan.to_json of up to MAX_LAYOUTS layouts) included;
# anything bigger is not one.
MAX_REQUEST_BYTES = 16384
MAX_DEPTH = 8  # nesting of `[` and `{`: a plan is 5 deep; deeper is refused before parsing
OPS = ("reconfigure", "assign", "demand")


class ControlError(PackratError):
    """A control request that was refused, or a control endpoint that cannot be used."""


def parse(body: bytes, frames: int) -> dict[str, Any]:
    if frames != 2:
        raise ControlError(f"a control request is one JSON frame; got {frames - 1}")
    # Bounded before parsing: json's parser recurses once per nesting level, and 4 000 `[` raised RecursionError
    # into the loop. A request is one flat object, so a few brackets are all it can hold (MAXMSGSIZE bounds size).
    if len(body) > MAX_REQUEST_BYTES or depth(body) > MAX_DEPTH:
        raise ControlError(
            f"a control request is one flat JSON object (an assign's plan nested at most {MAX_DEPTH} deep) of at "
            f"most {MAX_REQUEST_BYTES} bytes"
        )
    try:
        request = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ControlError(f"a control request is a JSON object: {exc}") from None
    if not isinstance(request, dict) or request.get("op") not in OPS:
        raise ControlError('a control request is {"op": "reconfigure", ...}, {"op": "assign", ...} or {"op": "demand"}')
    if request["op"] == "demand":
        return request
    if request["op"] == "assign":
        return check_assign(request)
    asked = [key for key in ("plan", "policy", "auto") if key in request]
    if len(asked) != 1:
        raise ControlError("ask for exactly one of: a plan (--plan), a policy (--policy), or automatic (--auto)")
    key = asked[0]
    if (key == "auto" and request[key] is not True) or (key != "auto" and not isinstance(request[key], str)):
        raise ControlError(f"{key!r} must be {'true' if key == 'auto' else 'a string'}")
    return request


def depth(body: bytes) -> int:
    """The deepest nesting of `[` and `{` (those inside strings counted too: an upper bound)."""
    level = deepest = 0
    for byte in body:
        if byte in b"[{":
            level += 1
            deepest = max(deepest, level)
        elif byte in b"]}":
            level -= 1
    return deepest


def check_assign(request: dict[str, Any]) -> dict[str, Any]:
    cpus = request.get("cpus")
    if not isinstance(cpus, list) or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in cpus):
        raise ControlError("an assign's 'cpus' is a list of CPU numbers, e.g. [0, 1, 2, 3]")
    if not cpus:
        raise ControlError("an assign's 'cpus' is empty: give this model at least one usable CPU")
    if "plan" in request and not isinstance(request["plan"], dict):
        raise ControlError(
            "an assign's 'plan' is a plan as Plan.to_json writes it; leave it out to let the policy plan"
        )
    if not isinstance(request.get("reason", ""), str):
        raise ControlError("an assign's 'reason' is a string")
    gain = request.get("gain")
    if gain is not None and (isinstance(gain, bool) or not isinstance(gain, int | float)):
        raise ControlError("an assign's 'gain' is a number (the predicted gain of the move) or absent")
    return request


def plan_from_request(data: dict[str, Any]) -> Plan:
    """An assign's plan (`Plan.from_json`; a coordinator may leave out its policy and reason); PolicyError naming
    what is wrong with it."""
    try:
        return Plan.from_json(data, policy="coordinate", reason="assigned by the coordinator")
    except ValueError as exc:
        raise PolicyError(f"the assign's plan is not a plan as Plan.to_json writes it ({exc}); leave it out "
                          "to let the daemon's policy plan inside the CPUs") from None  # fmt: skip


def describe(request: dict[str, Any]) -> str:
    if request["op"] == "assign":
        return f"assign CPUs {format_cpulist(request['cpus'])}"
    if request["op"] == "demand":
        return "demand"
    if request.get("auto"):
        return "--auto"
    return f"--plan {request['plan']}" if "plan" in request else f"--policy {request['policy']}"


def error_reply(exc: PackratError) -> dict[str, Any]:
    return {"ok": False, "error": {"type": type(exc).__name__, "message": str(exc)}}
