"""The one negotiation of a request's tree budget and token room (rapid.runtime.budget)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rapid.core.errors import ContextFullError
from rapid.core.wire import Ready
from rapid.runtime.budget import (
    RESERVED_AUTO_NODES,
    default_max_tokens,
    draft_need,
    settle_cloud,
    settle_draft,
)
from rapid.runtime.edge_config import EdgeConfig
from rapid.runtime.link import CloudError
from rapid.runtime.tree import AUTO_BUDGET_MIN, TreeParams

trees = st.one_of(st.builds(lambda b: EdgeConfig(budget=b).tree(), st.integers(1, 80)),
                  st.just(EdgeConfig(budget="auto").tree()))


@settings(max_examples=300, deadline=None)
@given(tree=trees, capacity=st.integers(1, 4096), prompt=st.integers(1, 3000), max_new=st.integers(1, 2000))
def test_settle_draft_either_fits_the_context_or_says_why(tree, capacity, prompt, max_new):
    try:
        fitted = settle_draft(tree, capacity, prompt, max_new)
    except ContextFullError as e:
        assert str(capacity) in str(e)
        assert draft_need(prompt, max_new, 1 if tree.auto_budget else tree.budget) > capacity
        return
    assert draft_need(prompt, max_new, fitted.budget) <= capacity
    assert fitted.budget == tree.budget or (tree.auto_budget and fitted.budget < tree.budget)


@settings(max_examples=200, deadline=None)
@given(tree=trees, capacity=st.integers(64, 4096), prompt=st.integers(1, 3000))
def test_the_default_max_tokens_leaves_an_auto_budget_its_reserve(tree, capacity, prompt):
    try:
        room = default_max_tokens(capacity, prompt, tree)
    except ContextFullError:
        return
    fitted = settle_draft(tree, capacity, prompt, room)  # never raises: the room is what fits
    assert fitted.budget == (min(tree.budget, RESERVED_AUTO_NODES) if tree.auto_budget else tree.budget)


def _ready(capacity=512, max_nodes=64, flat=14) -> Ready:
    return Ready("s", 100, capacity, max_nodes, 0, flat_nodes=flat)


def test_settle_cloud_sizes_an_auto_tree_to_the_flat_curve_and_checks_the_context():
    auto = EdgeConfig(budget="auto").tree()
    assert settle_cloud(auto, _ready(), 10, 20, True)[0].budget == 14
    assert settle_cloud(auto, _ready(flat=0), 10, 20, True)[0].budget == AUTO_BUDGET_MIN
    assert settle_cloud(auto, _ready(max_nodes=5), 10, 20, True)[0].budget == 5
    assert settle_cloud(auto, _ready(capacity=100), 10, 500, True, fit=True)[1] == 100 - 10 - 14
    with pytest.raises(ContextFullError, match="cloud context of 524"):
        settle_cloud(auto, _ready(), 10, 500, True)
    assert settle_cloud(auto, _ready(capacity=100), 10, 90, False)[1] == 90  # ar sends no nodes


def test_an_explicit_budget_over_the_clouds_limit_is_a_limits_error():
    with pytest.raises(CloudError) as e:
        settle_cloud(TreeParams(budget=32), _ready(max_nodes=16), 10, 20, True)
    assert e.value.code == "limits" and "lower --budget" in e.value.reason
    assert settle_cloud(TreeParams(budget=32), _ready(max_nodes=16), 10, 20, False)[1] == 20  # ar: no tree
