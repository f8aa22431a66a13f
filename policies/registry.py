"""Policies by name: the built-ins plus third-party ones from the `packrat.policies` entry point group."""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

from packrat_daemon.wire.errors import PolicyError
from policies.base import Policy, PolicySettings

ENTRY_POINT_GROUP = "packrat.policies"


def _builtin() -> dict[str, type[Policy]]:
    from policies.fixed import FixedPolicy
    from policies.packrat import PackratPolicy
    from policies.paper_estimator import PaperEstimatorPolicy
    from policies.single import SinglePolicy
    from policies.torchserve import TorchServePolicy

    return {cls.name: cls for cls in (PackratPolicy, SinglePolicy, TorchServePolicy, FixedPolicy, PaperEstimatorPolicy)}


def _load_plugins() -> tuple[dict[str, type[Policy]], dict[str, str]]:
    """Third-party policies, and why each broken one failed (reported only when it is asked for)."""
    builtin = _builtin()
    found: dict[str, type[Policy]] = {}
    broken: dict[str, str] = {}
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        if entry.name in builtin:
            continue  # built-ins win: a plugin cannot silently replace `packrat` or `single`
        try:
            loaded = entry.load()
        except Exception as exc:  # a broken plugin must not break the built-ins
            broken[entry.name] = f"policy plugin {entry.name!r} ({entry.value}) failed to load: {exc}"
            continue
        if not (isinstance(loaded, type) and issubclass(loaded, Policy)):
            broken[entry.name] = f"policy plugin {entry.name!r} ({entry.value}) is not a Policy subclass"
            continue
        found[entry.name] = loaded
    return found, broken


def available_policies() -> dict[str, type[Policy]]:
    return {**_builtin(), **_load_plugins()[0]}


def policy_class(name: str) -> type[Policy]:
    """The class registered under `name`; a PolicyError names the available ones or why a plugin failed."""
    plugins, broken = _load_plugins()
    policies = {**_builtin(), **plugins}
    if name in broken and name not in policies:
        raise PolicyError(broken[name])
    try:
        return policies[name]
    except KeyError:
        raise PolicyError(f"unknown policy {name!r}; choose one of: {', '.join(sorted(policies))}") from None


def get_policy(name: str, **options: Any) -> Policy:
    try:
        return policy_class(name)(**options)
    except TypeError as exc:
        raise PolicyError(f"policy {name!r} does not take these options: {exc}") from exc


def policy_from_settings(name: str, settings: PolicySettings) -> Policy:
    """The policy `name` as the serve options configure it (each policy reads the options it declares)."""
    cls = policy_class(name)
    try:
        return cls.from_settings(settings)
    except TypeError as exc:  # a plugin whose constructor needs arguments but reads no serve option
        raise PolicyError(
            f"policy {name!r} cannot be built from the serve options ({exc}); its class should override "
            "Policy.from_settings to say which options it reads"
        ) from exc
