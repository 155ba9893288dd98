"""Bounded fuzzing in the suite (the long run is ``scripts/fuzz_wire.py --minutes N``)."""

from __future__ import annotations

import asyncio
import importlib.util
import random
from pathlib import Path

import msgpack
from hypothesis import given, settings
from hypothesis import strategies as st

from rapid.core.wire import WireError, decode, encode
from rapid.server.app import VerifierServer
from rapid.server.background import BackgroundServer
from rapid.server.serve_config import Limits

_spec = importlib.util.spec_from_file_location("fuzz_wire", Path(__file__).parents[2] / "scripts" / "fuzz_wire.py")
fuzz_wire = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fuzz_wire)

values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**64), 2**64 - 1) | st.floats(allow_nan=True) | st.binary(max_size=64)
    | st.text(max_size=16),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(fuzz_wire.FIELDS), inner, max_size=5),
    max_leaves=12,
)


def _check(data):
    try:
        frame = decode(data)
    except WireError as e:
        assert e.code and e.reason
    else:
        assert decode(encode(frame)) == frame


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=256))
def test_decode_random_bytes(data):
    _check(data)


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(st.sampled_from(fuzz_wire.FIELDS), values, max_size=7))
def test_decode_random_structures(body):
    try:
        data = msgpack.packb(body, use_bin_type=True)
    except (ValueError, OverflowError, TypeError):
        return
    _check(data)


def test_decoder_mutations_short_run():
    counts = {"decoded": 0, "decode_ok": 0, "decode_errors": 0}
    fuzz_wire.fuzz_decoder(random.Random(5), 3000, counts)
    assert counts["decoded"] == 3000


def test_server_answers_every_bad_frame_and_good_session_is_untouched(tiny_pair):
    target, _ = tiny_pair
    cloud = BackgroundServer(VerifierServer(target, Limits(max_sessions=8, max_context=256, max_nodes=16)))
    counts = {"server_frames": 0, "server_bad_frames": 0, "server_valid_frames": 0}
    try:
        for seed in range(3):
            asyncio.run(fuzz_wire.fuzz_server(cloud.url, random.Random(seed), 150, counts, target))
    finally:
        cloud.close()
    assert counts["server_frames"] == 450 and counts["server_bad_frames"] > 300
