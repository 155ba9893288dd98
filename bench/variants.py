"""Policy variants: one policy under other tree options, side by side with it in one bench run.

A spec is a policy name, optionally followed by tree options (``rapid.runtime.edge_config``'s
"tree" group, ``--`` and dashes dropped):

    rapid-cost                        the policy under the run's tree options
    rapid-cost@branch_roots=4         the same policy, 4 proactive roots
    ipdg@branch_roots=4@width=3       several options

The variant runs with its own name (the whole spec) in every table, so an option's effect is a
ratio measured in the same run, cells interleaved, not across two runs on a machine whose speed
drifts (docs/bench.md).
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field

from rapid.core.errors import OptionError
from rapid.runtime.edge_config import EdgeConfig, budget_arg, group_fields
from rapid.runtime.policies import Policy, get_policy

TREE_OPTIONS = tuple(n for n in group_fields("tree") if n != "policy")
_BOOL = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}


@dataclass(slots=True, frozen=True)
class PolicyVariant:
    policy: Policy  # named by the whole spec
    options: dict[str, object] = field(default_factory=dict)  # tree option -> value

    @property
    def name(self) -> str:
        return self.policy.name


def _value(name: str, text: str, like: object) -> object:
    try:
        if name == "budget":
            return budget_arg(text)
        if isinstance(like, bool):
            return _BOOL[text.lower()]
        return type(like)(text)
    except (ValueError, KeyError, argparse.ArgumentTypeError):
        kind = ("true or false" if isinstance(like, bool) else "a positive integer or auto" if name == "budget"
                else "an integer" if isinstance(like, int) else "a number")
        raise OptionError(f"--policies: {name} takes {kind}, got {text!r}") from None


def parse_variant(spec: str) -> PolicyVariant:
    """``name[@option=value]...`` → the policy (renamed to ``spec``) and its tree options;
    OptionError names the first bad part."""
    base, *parts = spec.strip().split("@")
    try:
        policy = get_policy(base)
    except ValueError as e:
        raise OptionError(f"--policies: {e}") from None
    defaults = EdgeConfig()
    options: dict[str, object] = {}
    for part in parts:
        key, eq, text = part.partition("=")
        key = key.strip().replace("-", "_")
        if not eq or key not in TREE_OPTIONS:
            raise OptionError(f"--policies: variant {spec!r}: {part!r} is not option=value with a tree option "
                             f"({', '.join(TREE_OPTIONS)})")
        options[key] = _value(key, text.strip(), getattr(defaults, key))
    return PolicyVariant(dataclasses.replace(policy, name=spec.strip()) if parts else policy, options)


def variant_configs(specs: list[str], tree_options: dict[str, object]) -> list[tuple[Policy, EdgeConfig]]:
    """Each spec's policy and edge options: the run's ``tree_options`` with the variant's on top,
    validated as any (OptionError)."""
    base = EdgeConfig(**tree_options)
    out = []
    for spec in specs:
        v = parse_variant(spec)
        try:
            out.append((v.policy, dataclasses.replace(base, **v.options)))
        except OptionError as e:
            raise OptionError(f"--policies: variant {spec!r}: {e}") from None
    return out
