"""Policies by name: the built-ins plus third-party ones from the `packrat.policies` entry point group."""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

from packrat_daemon.errors import PolicyError
from policies.base import Policy

ENTRY_POINT_GROUP = "packrat.policies"


def _builtin() -> dict[str, type[Policy]]:
    from policies.fixed import FixedPolicy
    from policies.packrat import PackratPolicy
    from policies.single import SinglePolicy
    from policies.torchserve import TorchServePolicy

    return {cls.name: cls for cls in (PackratPolicy, SinglePolicy, TorchServePolicy, FixedPolicy)}


def available_policies() -> dict[str, type[Policy]]:
    found = _builtin()
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        if entry.name in found:
            continue  # built-ins win: a plugin cannot silently replace `packrat` or `single`
        try:
            loaded = entry.load()
        except Exception as exc:  # a broken plugin must not break the built-ins
            raise PolicyError(f"policy plugin {entry.name!r} ({entry.value}) failed to load: {exc}") from exc
        if not (isinstance(loaded, type) and issubclass(loaded, Policy)):
            raise PolicyError(f"policy plugin {entry.name!r} ({entry.value}) is not a Policy subclass")
        found[entry.name] = loaded
    return found


def get_policy(name: str, **options: Any) -> Policy:
    policies = available_policies()
    try:
        cls = policies[name]
    except KeyError:
        raise PolicyError(f"unknown policy {name!r}; choose one of: {', '.join(sorted(policies))}") from None
    try:
        return cls(**options)
    except TypeError as exc:
        raise PolicyError(f"policy {name!r} does not take these options: {exc}") from exc
