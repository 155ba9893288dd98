"""Hypothesis strategies shared by the invariance tests: random token trees."""

from __future__ import annotations

from hypothesis import strategies as st


@st.composite
def trees(draw, max_nodes: int = 12):
    """(tokens, parents) of up to ``max_nodes`` nodes over a 259-token vocabulary."""
    n = draw(st.integers(0, max_nodes))
    parents = [draw(st.integers(-1, j - 1)) for j in range(n)]
    tokens = draw(st.lists(st.integers(0, 258), min_size=n, max_size=n))
    return tokens, parents
