"""rapid.core.wire: round trips, and decode never raising anything but WireError."""

from __future__ import annotations

import math

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rapid.core import wire
from rapid.core.wire import (
    MAX_FRAME_BYTES,
    PROTOCOL_VERSION,
    Bye,
    ErrorFrame,
    Hello,
    Ready,
    Tree,
    VerdictFrame,
    WireError,
    decode,
    encode,
)

FAST = settings(max_examples=60, deadline=None)

i32 = st.integers(-(2**31), 2**31 - 1)
i32_lists = st.lists(i32, max_size=40)
i64 = st.integers(-(2**63), 2**63 - 1)
finite = st.floats(allow_nan=False, allow_infinity=False)
text = st.text(max_size=30)
f32 = st.floats(max_value=0.0, width=32, allow_nan=False)  # log-probabilities, -inf included

frames = st.one_of(
    st.builds(Hello, prompt=i32_lists, temperature=finite, top_p=finite, top_k=i64,
              seed=st.integers(0, 2**64 - 1), max_nodes=i64, session=st.none() | text),
    st.builds(Ready, session=text, vocab_size=i64, capacity=i64, max_nodes=i64, committed=i64),
    st.lists(st.tuples(i32, i32), max_size=8).map(
        lambda pts: Ready("s", 259, 64, 8, 1, 7, "", [n for n, _ in pts], [us for _, us in pts])),
    st.builds(Tree, round=i64, tokens=i32_lists, parents=i32_lists),
    st.builds(VerdictFrame, round=i64, path=i32_lists, bonus=i64, committed=i64, verify_s=finite),
    st.integers(0, 6).flatmap(lambda k: st.lists(i32, max_size=10).flatmap(lambda path: st.builds(
        VerdictFrame, round=i64, path=st.just(path), bonus=i64, committed=i64,
        logprobs=st.lists(f32, min_size=len(path) + 1, max_size=len(path) + 1),
        top_ids=st.just([7] * (k * (len(path) + 1))),
        top_logprobs=st.lists(f32, min_size=k * (len(path) + 1), max_size=k * (len(path) + 1))))),
    st.builds(Hello, prompt=i32_lists, logprobs=st.integers(-1, wire.MAX_TOP_LOGPROBS)),
    st.builds(ErrorFrame, code=text, reason=text, round=st.none() | i64),
    st.just(Bye()),
)


def pack(body: dict) -> bytes:
    return msgpack.packb(body, use_bin_type=True)


def ints(values) -> bytes:
    return b"".join(int(v).to_bytes(4, "little", signed=True) for v in values)


def code_of(data) -> str:
    with pytest.raises(WireError) as e:
        decode(data)
    return e.value.code


GOOD = {
    "hello": {"t": "hello", "prompt": ints([1, 2]), "temperature": 0.5, "top_p": 1.0, "top_k": 0,
              "seed": 1, "max_nodes": 8, "session": None, "v": PROTOCOL_VERSION},
    "ready": {"t": "ready", "session": "s", "vocab_size": 10, "capacity": 100, "max_nodes": 8,
              "committed": 3},
    "tree": {"t": "tree", "round": 1, "tokens": ints([5, 6]), "parents": ints([-1, 0])},
    "verdict": {"t": "verdict", "round": 1, "path": ints([0]), "bonus": 4, "committed": 5,
                "verify_s": 0.01},
    "error": {"t": "error", "code": "bad_tree", "reason": "x", "round": 2},
    "bye": {"t": "bye"},
}


# ---------------------------------------------------------------- round trips


@FAST
@given(frame=frames)
def test_round_trip_every_frame_type(frame):
    data = encode(frame)
    assert isinstance(data, bytes)
    back = decode(data)
    assert type(back) is type(frame)
    assert back == frame


@pytest.mark.parametrize("name", sorted(GOOD))
def test_hand_built_frames_decode(name):
    frame = decode(pack(GOOD[name]))
    assert frame.T == name
    assert decode(encode(frame)) == frame


def test_arrays_travel_as_int32_bytes():
    body = msgpack.unpackb(encode(Tree(round=3, tokens=[1, -1, 2**31 - 1], parents=[-1, 0, 1])), raw=False)
    assert body["t"] == "tree"
    assert body["tokens"] == ints([1, -1, 2**31 - 1])
    assert isinstance(body["parents"], bytes) and len(body["parents"]) == 12


def test_ready_carries_the_verify_curve_as_int32_arrays():
    ready = Ready("s", 259, 64, 8, 1, flat_nodes=7, curve_nodes=[0, 3, 7], curve_us=[14000, 14500, 15200])
    body = msgpack.unpackb(encode(ready), raw=False)
    assert body["curve_nodes"] == ints([0, 3, 7]) and body["curve_us"] == ints([14000, 14500, 15200])
    assert decode(encode(ready)) == ready
    assert decode(pack(GOOD["ready"])).curve_nodes == []  # a cloud that measured nothing


def test_ready_curve_arrays_must_pair_up():
    body = dict(GOOD["ready"], curve_nodes=ints([0, 3]), curve_us=ints([14000]))
    assert code_of(pack(body)) == "bad_frame"


def test_hello_defaults_and_optional_fields():
    frame = decode(pack({"t": "hello", "prompt": ints([7])}))
    assert frame == Hello(prompt=[7])
    assert frame.v == PROTOCOL_VERSION and frame.session is None
    err = decode(pack({"t": "error", "code": "c", "reason": "r"}))
    assert err == ErrorFrame("c", "r", None)
    # ints are accepted where floats are expected
    assert decode(pack({"t": "hello", "prompt": b"", "temperature": 1})).temperature == 1


@pytest.mark.parametrize("bad", [2**31, -(2**31) - 1, 2**40])
def test_encode_rejects_ints_outside_int32(bad):
    with pytest.raises(WireError) as e:
        encode(Tree(round=0, tokens=[0, bad], parents=[-1, 0]))
    assert e.value.code == "bad_value"


# ---------------------------------------------------------------- fuzzing: only WireError


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=200))
def test_decode_of_arbitrary_bytes_raises_only_wire_error(data):
    try:
        decode(data)
    except WireError as e:
        assert e.code in {"bad_frame", "unknown_type", "bad_value", "bad_version", "too_large"}


scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(),
                    st.text(max_size=10), st.binary(max_size=12))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(st.text(max_size=6), inner, max_size=4), max_leaves=10)
FIELD_NAMES = sorted({f for c in wire.FRAMES.values() for f in c.__dataclass_fields__} | {"x", "T"})


@settings(max_examples=300, deadline=None)
@given(t=st.sampled_from([*wire.FRAMES, "nope"]) | values,
       body=st.dictionaries(st.sampled_from(FIELD_NAMES), values | st.binary(max_size=16), max_size=8),
       top=values)
def test_decode_of_random_msgpack_raises_only_wire_error(t, body, top):
    for data in (pack({"t": t, **body}), pack(top)):
        try:
            frame = decode(data)
        except WireError:
            continue
        assert type(frame) in wire.FRAMES.values()


@settings(max_examples=100, deadline=None)
@given(frame=frames, cut=st.integers(0, 64), flip=st.integers(0, 255))
def test_corrupted_frames_raise_only_wire_error(frame, cut, flip):
    data = bytearray(encode(frame))
    variants = [bytes(data[:max(0, len(data) - 1 - cut)])]
    if data:
        data[cut % len(data)] ^= flip
        variants.append(bytes(data))
    for v in variants:
        try:
            decode(v)
        except WireError:
            pass


# ---------------------------------------------------------------- specific errors


def test_text_frames_are_rejected():
    assert code_of("hello") == "bad_frame"
    assert code_of(encode(Bye()).decode("latin-1")) == "bad_frame"


@pytest.mark.parametrize("data", [b"", b"\xc1", b"\x92\x01\x02", pack([1, 2]), pack("tree"), pack({}),
                                  pack({"t": 5}), pack({"x": "tree"}), pack({b"t": "tree"})])
def test_not_a_frame(data):
    assert code_of(data) == "bad_frame"


def test_unknown_type():
    assert code_of(pack({"t": "gossip"})) == "unknown_type"
    assert code_of(pack({"t": "Tree", "round": 1, "tokens": b"", "parents": b""})) == "unknown_type"


@pytest.mark.parametrize("name", sorted(GOOD))
def test_unknown_fields(name):
    assert code_of(pack({**GOOD[name], "extra": 1})) == "bad_frame"
    assert code_of(pack({**GOOD[name], "T": name})) == "bad_frame"


@pytest.mark.parametrize("name,field", [
    ("hello", "prompt"), ("ready", "session"), ("tree", "round"), ("tree", "parents"),
    ("verdict", "bonus"), ("error", "code"),
])
def test_missing_required_fields(name, field):
    body = dict(GOOD[name])
    del body[field]
    assert code_of(pack(body)) == "bad_frame"


@pytest.mark.parametrize("name,field,value", [
    ("hello", "prompt", [1, 2]),  # a msgpack array, not int32 bytes
    ("hello", "prompt", "abcd"),
    ("hello", "temperature", "0.5"),
    ("hello", "top_k", 1.0),
    ("hello", "seed", None),
    ("hello", "session", 5),
    ("hello", "v", "1"),
    ("ready", "vocab_size", 1.5),
    ("ready", "committed", [3]),
    ("tree", "round", "1"),
    ("tree", "round", 1.0),
    ("verdict", "verify_s", "fast"),
    ("verdict", "path", None),
    ("error", "reason", b"bytes"),
    ("error", "round", "2"),
])
def test_wrong_types(name, field, value):
    assert code_of(pack({**GOOD[name], field: value})) == "bad_frame"


@pytest.mark.parametrize("name,field", [
    ("hello", "top_k"), ("hello", "seed"), ("hello", "max_nodes"), ("hello", "v"),
    ("hello", "temperature"), ("ready", "capacity"), ("tree", "round"), ("verdict", "bonus"),
    ("verdict", "verify_s"), ("error", "round"),
])
@pytest.mark.parametrize("value", [True, False])
def test_bool_is_not_an_int(name, field, value):
    assert code_of(pack({**GOOD[name], field: value})) == "bad_frame"


@pytest.mark.parametrize("field", ["temperature", "top_p"])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_non_finite_floats(field, value):
    assert code_of(pack({**GOOD["hello"], field: value})) == "bad_value"
    assert code_of(pack({**GOOD["verdict"], "verify_s": value})) == "bad_value"


@pytest.mark.parametrize("v", [0, 1, PROTOCOL_VERSION + 1, -1])
def test_bad_version(v):
    assert code_of(pack({**GOOD["hello"], "v": v})) == "bad_version"
    assert code_of(encode(Hello(prompt=[1], v=v))) == "bad_version"


@pytest.mark.parametrize("nbytes", [1, 2, 3, 5, 7])
@pytest.mark.parametrize("field", ["tokens", "parents"])
def test_array_bytes_not_a_multiple_of_four(nbytes, field):
    assert code_of(pack({**GOOD["tree"], field: b"\x00" * nbytes})) == "bad_frame"


def test_oversize_frame():
    data = pack({**GOOD["tree"], "tokens": b"\x00" * MAX_FRAME_BYTES})
    assert len(data) > MAX_FRAME_BYTES
    assert code_of(data) == "too_large"
    assert code_of(b"\x00" * (MAX_FRAME_BYTES + 1)) == "too_large"


def test_the_largest_legal_frames_fit_the_protocol_limit():
    """A tree with two arrays at MAX_ARRAY, and a Hello with a full prompt and the longest session
    string, encode within MAX_FRAME_BYTES and decode; the transport limit sits above it."""
    n = wire.MAX_ARRAY
    tree = Tree(2**40, [7] * n, [-1] * n)
    data = encode(tree)
    assert len(data) <= MAX_FRAME_BYTES < wire.TRANSPORT_MAX_BYTES
    back = decode(data)
    assert isinstance(back, Tree) and back.round == tree.round and len(back.tokens) == len(back.parents) == n
    assert back.tokens[-1] == 7 and back.parents[0] == -1
    hello = Hello([1] * n, session="s" * wire.MAX_STR, max_nodes=2**40, seed=2**63)
    assert len(encode(hello)) <= MAX_FRAME_BYTES and decode(encode(hello)).session == hello.session


def test_array_longer_than_max_array():
    n = wire.MAX_ARRAY + 1
    assert code_of(pack({**GOOD["tree"], "tokens": b"\x00" * (4 * n)})) == "bad_frame"


def test_wire_error_carries_code_and_reason():
    e = WireError("bad_frame", "why")
    assert e.code == "bad_frame" and e.reason == "why" and "bad_frame" in str(e)


@pytest.mark.parametrize("name", ["tree", "verdict"])
def test_round_nil_rejected_where_round_is_required(name):
    assert code_of(pack({**GOOD[name], "round": None})) == "bad_frame"


def test_ready_session_nil_rejected():
    assert code_of(pack({**GOOD["ready"], "session": None})) == "bad_frame"


def test_encode_never_produces_a_frame_decode_rejects():
    # an over-long error reason is cut (an error must still be deliverable) ...
    back = decode(encode(ErrorFrame("internal", "x" * 70_000)))
    assert isinstance(back, ErrorFrame) and back.reason.startswith("x" * 1000) and back.reason.endswith(" …")
    # ... any other over-long string is refused at encode time, never sent undecodable
    with pytest.raises(WireError):
        encode(Ready("s" * 70_000, 10, 10, 10, 1))


# ---------------------------------------------------------------- log-probabilities (protocol v2)


def floats(values) -> bytes:
    return np.asarray(values, dtype="<f4").tobytes()


def test_logprobs_travel_as_float32_bytes():
    frame = VerdictFrame(1, [0, 2], 9, 5, logprobs=[-0.5, -1.25, -math.inf], top_ids=[9, 3, 4, 5, 6, 7],
                         top_logprobs=[-0.1, -0.2, -0.3, -0.4, -0.5, -0.6])
    body = msgpack.unpackb(encode(frame), raw=False)
    assert body["logprobs"] == floats([-0.5, -1.25, -math.inf]) and body["top_ids"] == ints([9, 3, 4, 5, 6, 7])
    back = decode(encode(frame))
    assert back.logprobs == [-0.5, -1.25, -math.inf]
    assert back.top_logprobs == np.asarray(frame.top_logprobs, dtype=np.float32).tolist()  # float32 on the wire


@pytest.mark.parametrize("logprobs,top_ids,top_lp", [
    ([-1.0], [], []),  # path [0] + bonus = 2 emitted tokens, 1 log-probability
    ([-1.0, -2.0, -3.0], [], []),
    ([-1.0, -2.0], [1, 2, 3], [-1.0, -2.0, -3.0]),  # 3 alternatives for 2 tokens
    ([-1.0, -2.0], [1, 2], [-1.0]),
    ([], [1, 2], [-1.0, -2.0]),
])
def test_verdict_logprob_lengths_must_match_the_emitted_tokens(logprobs, top_ids, top_lp):
    body = {**GOOD["verdict"], "logprobs": floats(logprobs), "top_ids": ints(top_ids), "top_logprobs": floats(top_lp)}
    assert code_of(pack(body)) == "bad_value"
    with pytest.raises(WireError):
        encode(VerdictFrame(1, [0], 4, 5, logprobs=logprobs, top_ids=top_ids, top_logprobs=top_lp))


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_verdict_logprobs_refuse_nan_and_plus_inf(bad):
    body = {**GOOD["verdict"], "logprobs": floats([-1.0, bad])}
    assert code_of(pack(body)) == "bad_value"
    with pytest.raises(WireError):
        encode(VerdictFrame(1, [0], 4, 5, logprobs=[-1.0, bad]))


@pytest.mark.parametrize("value", [b"\x00" * 3, [1.0, 2.0], -1.0])
def test_verdict_logprobs_must_be_float32_bytes(value):
    assert code_of(pack({**GOOD["verdict"], "logprobs": value})) == "bad_frame"


@pytest.mark.parametrize("k", [-2, wire.MAX_TOP_LOGPROBS + 1, 1000])
def test_hello_logprobs_range(k):
    assert code_of(pack({**GOOD["hello"], "logprobs": k})) == "bad_value"
    with pytest.raises(WireError):
        encode(Hello([1], logprobs=k))
    assert code_of(pack({**GOOD["hello"], "logprobs": 1.0})) == "bad_frame"
    assert code_of(pack({**GOOD["hello"], "logprobs": floats([1.0])})) == "bad_frame"


def test_a_version_mismatch_is_named_before_unknown_fields():
    """A peer of another version sends fields this side does not know: the error says versions."""
    with pytest.raises(WireError) as e:
        decode(pack({**GOOD["hello"], "v": 3, "new_field": 1}))
    assert e.value.code == "bad_version" and "version 3" in e.value.reason and "\n" not in e.value.reason


def test_the_arrays_of_one_verdict_together_fit_the_protocol_limit():
    n = wire.MAX_ARRAY // 2  # four arrays of n values (path n - 1): 2 x MAX_ARRAY values in all
    big = VerdictFrame(1, [0] * (n - 1), 4, 5, logprobs=[-1.0] * n, top_ids=[1] * n, top_logprobs=[-1.0] * n)
    assert len(encode(big)) <= MAX_FRAME_BYTES and decode(encode(big)).bonus == 4
    over = {**GOOD["verdict"], "path": ints([0] * (n - 1)), "logprobs": floats([-1.0] * n),
            "top_ids": ints([1] * 2 * n), "top_logprobs": floats([-1.0] * 2 * n)}  # 2 alternatives each
    assert code_of(pack(over)) in {"bad_value", "too_large"}
