"""The verify curve and the flat size edges follow with ``--budget auto``."""

from __future__ import annotations

import asyncio

import pytest

from rapid.core.sampling import SamplingParams
from rapid.engines.torch_engine import TorchEngine
from rapid.runtime.assembly import assemble
from rapid.runtime.coordinator import CoordinatorConfig
from rapid.runtime.edge_config import EdgeConfig, budget_arg
from rapid.server.app import VerifierServer
from rapid.server.background import BackgroundServer
from rapid.server.main import measured_flat_nodes, startup_curve
from rapid.server.target import reference_decode
from rapid.server.verify_curve import CurvePoint, flat_nodes, measure_curve, wire_curve
from rapid.tiny import EOS_ID


def curve(*pairs):
    return [CurvePoint(t, ms) for t, ms in pairs]


@pytest.mark.parametrize("points, want", [
    (curve((1, 305), (2, 297), (4, 299), (8, 361), (16, 518), (32, 732)), 7),  # bf16 on this CPU
    (curve((1, 431), (2, 803), (4, 818), (8, 883)), 1),  # fp32 here: T=2 already costs 1.9 steps
    (curve((1, 10), (8, 10.5), (16, 11), (32, 12)), 31),  # a GPU: flat as far as measured
    (curve((1, 100), (4, 110), (8, 150)), 4),  # crosses between 4 (1.1x) and 8 (1.5x): T = 5
    (curve((1, 229), (4, 234), (8, 241), (16, 250), (17, 279), (24, 290), (32, 315)), 15),  # AMX: a
    # second 16-row tile at T = 17 (1.22x); without the T = 17 point, 16 -> 24 read as a ramp: 19
    (curve((1, 229), (4, 234), (8, 241), (16, 250), (24, 290), (32, 315)), 19),
])
def test_flat_nodes_follows_the_curve(points, want):
    assert flat_nodes(points) == want


def test_flat_nodes_needs_the_one_token_point():
    with pytest.raises(ValueError):
        flat_nodes(curve((2, 1.0), (4, 1.0)))


def test_measure_curve_times_every_size(tiny_pair):
    target, _ = tiny_pair
    points = measure_curve(target, (1, 2, 8), prefix=16, repeats=1)
    assert [p.tokens for p in points] == [1, 2, 8] and all(p.ms > 0 for p in points)
    assert measured_flat_nodes(target, "sequential") == 0
    assert 1 <= measured_flat_nodes(target, "tree") <= 31


class StretchClock:
    """A clock under which every forward takes ``step`` seconds, except the forwards (numbered in
    the order they run) in ``slow``, which take ``slow_step``: the machine slowed for a stretch."""

    def __init__(self, slow: range, step: float = 0.1, slow_step: float = 0.3) -> None:
        self.slow, self.step, self.slow_step = slow, step, slow_step
        self.calls, self.now = 0, 0.0

    def __call__(self) -> float:
        i, self.calls = self.calls, self.calls + 1
        if i % 2:  # the second reading of forward i // 2
            self.now += self.slow_step if i // 2 in self.slow else self.step
        return self.now


def test_a_slow_stretch_lands_on_one_pass_not_on_one_size(tiny_pair):
    """Three slow forwards in a row, right after the warm-up: timed size after size, they were all
    of T=2's samples (its median 300 ms, the curve not flat past T=1); interleaved, they are one
    sample of three sizes, and every median stays 100 ms."""
    target, _ = tiny_pair
    sizes = (1, 2, 4, 8)
    clock = StretchClock(slow=range(len(sizes) + 1, len(sizes) + 4))
    points = measure_curve(target, sizes, prefix=16, repeats=3, clock=clock)
    assert clock.calls == 2 * len(sizes) * 4
    assert [p.ms for p in points] == pytest.approx([100.0] * len(sizes))
    assert flat_nodes(points) == 7
    with pytest.raises(ValueError, match="repeats"):
        measure_curve(target, sizes, prefix=16, repeats=0)


def test_the_start_up_curve_travels_in_ready_as_nodes_and_microseconds(tiny_pair):
    target, _ = tiny_pair
    assert wire_curve(curve((1, 14.0), (8, 14.6), (32, 23.0004))) == ([0, 7, 31], [14000, 14600, 23000])
    assert startup_curve(target, "sequential") == []  # no tree forward, no curve
    points = startup_curve(target, "tree")
    assert [p.tokens for p in points] == [1, 4, 8, 16, 17, 24, 32]
    assert measured_flat_nodes(target, "tree", points) == flat_nodes(points)
    assert measured_flat_nodes(target, "tree", []) == 0


def test_budget_argument():
    assert budget_arg("auto") == "auto" and budget_arg("12") == 12
    for bad in ("0", "-3", "many"):
        with pytest.raises(Exception, match="budget"):
            budget_arg(bad)
    auto = EdgeConfig(budget="auto").tree()
    assert auto.auto_budget and auto.for_cloud(64, 14).budget == 14
    assert auto.for_cloud(64, 3).budget == 11  # the floor: one 12-row tile; min_p trims unlikely nodes
    assert auto.for_cloud(64, 0).budget == 11  # no curve from the cloud: the floor
    assert auto.for_cloud(64, 500).budget == 64  # the cap
    assert auto.for_cloud(3, 5).budget == 3  # never above the cloud's limit
    assert EdgeConfig(budget=6).tree().for_cloud(64, 20).budget == 6  # an explicit budget is kept


def _auto_run(tiny_pair, capacity: int, prompt: list[int], max_new: int):
    """One `rapid` generation with --budget auto against a cloud that reports 14 flat nodes (no
    min_p floor: the budget alone shapes the trees)."""
    target, drafts = tiny_pair
    server = BackgroundServer(VerifierServer(target, flat_nodes=14))
    try:
        coord = assemble(TorchEngine(drafts["same"], capacity=capacity), EdgeConfig(budget="auto", min_p=0.0).tree(),
                         (EOS_ID,),
                         server.url, "rapid", CoordinatorConfig(depth=4))
        gen = asyncio.run(coord.generate(prompt, max_new, SamplingParams()))
    finally:
        server.close()
    assert gen.tokens == reference_decode(target, prompt, max_new, SamplingParams(), (EOS_ID,))
    return max(r.tree_nodes for r in gen.records)


def test_auto_budget_trees_follow_the_clouds_flat_size(tiny_pair):
    assert _auto_run(tiny_pair, 512, list(b"flat curve"), 24) == 14


def test_auto_budget_fits_a_small_draft_context(tiny_pair):
    assert _auto_run(tiny_pair, 64, list(b"0123456789"), 8) <= 3  # (64 - 10 - 8 - 32) // 4
