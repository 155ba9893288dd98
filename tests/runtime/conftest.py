"""Fixtures of the edge runtime tests: the daemon stack (tests/runtime/edge_stack.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def stack(tiny_pair, tiny_dir):
    pytest.importorskip("fastapi")
    from edge_stack import make_stack  # beside this file (pytest puts this folder on sys.path)

    yield from make_stack(tiny_pair, tiny_dir)
