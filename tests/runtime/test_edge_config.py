"""One source of every edge default (rapid.runtime.edge_config): the commands, the daemon, the
bench and the Python API all take theirs from EdgeConfig."""

from __future__ import annotations

import argparse
import inspect
from dataclasses import fields
from pathlib import Path

import pytest

from rapid.bench.cli import bench_config, bench_parser
from rapid.bench.runner import BENCH_TREE, BenchConfig
from rapid.cli import build_parser
from rapid.core.errors import OptionError
from rapid.runtime.api import Edge
from rapid.runtime.daemon import build_parser as edge_parser
from rapid.runtime.edge_config import DEFAULT, EdgeConfig, add_edge_args, group_fields
from rapid.runtime.engine_pool import EdgeService
from rapid.runtime.policies import POLICIES
from rapid.runtime.session import EdgeSession

TREE = ("policy", "depth", "budget", "topk", "width", "lookup", "min_p", "coupled", "branch_roots", "branch_decay", "cost_cut")


def _parsed(parser: argparse.ArgumentParser, *argv: str) -> EdgeConfig:
    return EdgeConfig.of(parser.parse_args(list(argv)))


def test_generate_edge_and_bench_parse_to_the_default_config():
    generate = _parsed(build_parser(), "generate", "hello")
    assert generate == DEFAULT and generate.draft == "default-draft-int4"
    edge = _parsed(edge_parser())  # the daemon leaves the sampling flags unset: the request's defaults
    assert all(getattr(edge, f.name) == getattr(DEFAULT, f.name) for f in fields(EdgeConfig))
    bench = bench_parser().parse_args([])
    assert all(getattr(bench, name) == getattr(DEFAULT, name) for name in TREE[1:] + ("engine",))
    assert bench_config(bench, Path("x")).draft == DEFAULT.draft  # --draft unset: the preset's, else the edge's
    assert all(getattr(BenchConfig(out="x"), name) == getattr(DEFAULT, name) for name in TREE[1:] + ("draft",))
    assert group_fields("tree") == TREE and BENCH_TREE == TREE[1:]  # a new tree option reaches the bench too
    demo = _parsed(build_parser(), "demo")
    assert demo.tree() == DEFAULT.tree() and demo.max_tokens == 48  # the demo's shorter answers


def test_the_python_api_and_the_services_default_to_the_same_draft_policy_and_sampling():
    sig = inspect.signature(Edge.__init__).parameters
    assert sig["draft"].default == DEFAULT.draft and sig["policy"].default == DEFAULT.policy
    assert sig["capacity"].default == DEFAULT.capacity and sig["backend"].default == DEFAULT.engine
    gen = inspect.signature(Edge.agenerate).parameters
    assert [gen[n].default for n in ("max_tokens", "temperature", "top_p", "top_k", "seed")] == \
        [DEFAULT.max_tokens, DEFAULT.temperature, DEFAULT.top_p, DEFAULT.top_k, DEFAULT.seed]
    for cls in (EdgeSession, EdgeService):
        assert inspect.signature(cls.__init__).parameters["policy"].default == DEFAULT.policy


@pytest.mark.parametrize("argv, says", [
    (["--max-tokens", "0"], "--max-tokens must be >= 1"), (["--top-p", "0"], "--top-p must be in (0, 1]"),
    (["--children", "0"], "--children must be >= 1"), (["--min-p", "1"], "--min-p must be in [0, 1)"),
    (["--temperature", "nan"], "--temperature must be >= 0"),
    (["--branch-decay", "0"], "--branch-decay must be in (0, 1]"), (["--branch-decay", "nan"], "--branch-decay must be"),
])
def test_a_bad_value_is_an_option_error_naming_the_flag(argv, says):
    ap = argparse.ArgumentParser()
    add_edge_args(ap)
    with pytest.raises(OptionError) as e:
        _parsed(ap, *argv)
    assert str(e.value).startswith(says)


def test_flags_follow_the_fields_and_older_spellings_still_parse():
    ap = argparse.ArgumentParser()
    add_edge_args(ap, "draft", "tree")
    c = _parsed(ap, "--capacity", "512", "--topk", "3", "--backend", "torch", "--budget", "9", "--no-coupled")
    assert (c.capacity, c.topk, c.engine, c.coupled) == (512, 3, "torch", False)
    assert c.tree().budget == 9 and not c.tree().auto_budget and not c.tree().coupled
    assert _parsed(ap, "--branch-decay", "1").tree().branch_decay == 1.0  # reaches the drafter's TreeParams
    assert DEFAULT.tree().auto_budget and DEFAULT.sampling().greedy
    with pytest.raises(ValueError, match="unknown option groups"):
        add_edge_args(argparse.ArgumentParser(), "trees")


def test_the_slow_edge_regime_is_the_pytorch_draft_every_policy_and_three_loads():
    cfg = bench_config(bench_parser().parse_args(["--slow-edge"]), Path("x"))
    assert cfg.draft == "default-draft" and cfg.policies == list(POLICIES)
    assert cfg.schedules == ["none", "sustained", "burst:4:4"] and cfg.profiles == ["wan"] and cfg.repeats == 3
    named = bench_config(bench_parser().parse_args(["--slow-edge", "--draft", "my-export", "--branch-roots", "3"]),
                         Path("x"))
    assert named.draft == "my-export" and named.branch_roots == 3
