"""rapid.runtime.session.EdgeSession: its worker threads end with the session (real verifier on loopback)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from rapid.core.errors import SessionClosedError
from rapid.core.sampling import SamplingParams
from rapid.runtime.generate import open_edge_model
from rapid.runtime.session import EdgeSession
from rapid.runtime.tree import TreeParams
from rapid.server.app import VerifierServer
from rapid.server.background import BackgroundServer
from rapid.server.target import reference_decode


def test_close_ends_the_worker_threads_and_refuses_later_calls(tiny_pair, tiny_dir):
    target, _ = tiny_pair
    cloud = BackgroundServer(VerifierServer(target, token="session-token"))
    try:
        model = open_edge_model(tiny_dir("target", seed=0, dtype="float64"), "torch", 256)
        ids = list(model.tokenizer("worker threads")["input_ids"])
        before = set(threading.enumerate())
        with EdgeSession(model, cloud.url, policy="rapid", tree=TreeParams(3, 8, 2, 2), token="session-token") as s:
            gen = asyncio.run(s.generate(ids, 12))
            mine = [t for t in threading.enumerate() if t not in before and t.name.startswith("rapid-draft")]
        assert gen.tokens == reference_decode(target, ids, 12, SamplingParams(), model.stop_ids)
        assert mine, "the session drafted on its own workers"
        assert not any(t.is_alive() for t in mine)
        with pytest.raises(SessionClosedError, match="is closed"):
            asyncio.run(s.generate(ids, 4))
        s.close()  # idempotent
    finally:
        cloud.close()
