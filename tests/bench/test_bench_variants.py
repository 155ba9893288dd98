"""rapid.bench.variants: a policy under other tree options, side by side with it in one run."""

from __future__ import annotations

import json

import pytest

from rapid.bench.variants import parse_variant, variant_configs
from rapid.core.errors import OptionError
from rapid.runtime.edge_config import DEFAULT
from rapid.runtime.policies import get_policy

BASE = {"depth": 4, "branch_roots": 1, "budget": "auto"}


def test_a_plain_name_is_the_policy_itself():
    v = parse_variant("rapid-cost")
    assert v.policy is get_policy("rapid-cost") and v.options == {}


def test_a_variant_is_the_policy_renamed_by_its_spec_with_typed_options():
    v = parse_variant("ipdg@branch_roots=4@cost-cut=false@budget=12")
    assert v.name == "ipdg@branch_roots=4@cost-cut=false@budget=12"
    assert (v.policy.proactive, v.policy.interruptible, v.policy.adaptive_depth) == (True, True, False)
    assert v.options == {"branch_roots": 4, "cost_cut": False, "budget": 12}


def test_each_spec_gets_the_runs_options_with_its_own_on_top():
    (p0, c0), (p1, c1) = variant_configs(["ipdg", "ipdg@branch_roots=4"], BASE)
    assert (p0.name, c0.branch_roots, c0.depth) == ("ipdg", 1, 4)
    assert (p1.name, c1.branch_roots, c1.depth, c1.min_p) == ("ipdg@branch_roots=4", 4, 4, DEFAULT.min_p)


@pytest.mark.parametrize("spec, says", [
    ("nope", "unknown policy 'nope'"),
    ("ipdg@roots=2", "is not option=value with a tree option"),
    ("ipdg@branch_roots", "is not option=value"),
    ("ipdg@policy=fixed", "is not option=value"),  # the policy is the name, not an option
    ("ipdg@branch_roots=two", "branch_roots takes an integer, got 'two'"),
    ("ipdg@cost_cut=maybe", "cost_cut takes true or false"),
    ("ipdg@budget=-3", "budget takes a positive integer or auto"),
    ("ipdg@branch_roots=0", "variant 'ipdg@branch_roots=0': --branch-roots must be >= 1"),
])
def test_bad_specs_are_one_line_option_errors(spec, says):
    with pytest.raises(OptionError) as e:
        variant_configs([spec], BASE)
    assert says in str(e.value) and "\n" not in str(e.value)


@pytest.mark.slow
def test_a_variant_runs_beside_its_policy_in_one_bench(tmp_path):
    from rapid.bench.cli import main_bench

    out = tmp_path / "variants"
    assert main_bench(["--smoke", "--out", str(out), "--no-progress", "--policies", "fixed,fixed@depth=1",
                       "--contention", "none", "--repeats", "1", "--max-tokens", "12"]) == 0
    rounds = [json.loads(line) for line in (out / "rounds.jsonl").read_text().splitlines()]
    depth = {p: {r["depth"] for r in rounds if r["policy"] == p} for p in ("fixed", "fixed@depth=1")}
    # (depth 0: a last round with one token left drafts nothing, runtime.depth_control.round_depth)
    assert depth["fixed@depth=1"] - {0} == {1} and max(depth["fixed"]) > 1
    runs = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    assert {r["policy"] for r in runs} == {"fixed", "fixed@depth=1"}
    assert len({r["digest"] for r in runs}) == 1  # the same tokens: options change the drafting only
    assert "fixed@depth=1" in (out / "report.md").read_text()
