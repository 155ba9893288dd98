"""Frames exchanged by the edge runtime and the cloud verifier (both import this module).

Every websocket message is one binary msgpack map with a type tag ``t``; integer arrays travel
as little-endian int32 bytes, float arrays as little-endian float32 bytes. A tree is its tokens and parent indices (-1 = the root, the last
committed token), never a dense mask.

    edge → cloud   Hello(v, prompt, sampling, max_nodes, session?, tokenizer, logprobs)  open or resume
                   Tree(round, tokens, parents)                        verify these drafts
                   Bye()
    cloud → edge   Ready(session, vocab_size, capacity, max_nodes, committed, flat_nodes, tokenizer,
                         curve_nodes, curve_us)                  the verify curve measured at start-up
                   VerdictFrame(round, path, bonus, committed, verify_s, logprobs, top_ids, top_logprobs)
                   ErrorFrame(code, reason, round?)                    the round / session failed

``curve_nodes`` / ``curve_us`` are the cloud's verify curve (``rapid.server.verify_curve``): one
tree forward of ``curve_nodes[i]`` nodes after the root took ``curve_us[i]`` microseconds (int32
arrays like the others: whole microseconds reach 35 min, and a verify is timed to no better than
that; empty = not measured). The edge's cost-aware depth policy starts from it.

``tokenizer`` is ``rapid.core.vocab.fingerprint`` of each side's tokenizer ("" = not known); a side
that knows both refuses a mismatch (``incompatible``).

Log-probabilities. ``Hello.logprobs`` = -1 asks for none, k in 0..``MAX_TOP_LOGPROBS`` for the
target's log-probability of every emitted token plus its k most likely alternatives. Each
``VerdictFrame`` then carries, for its E = len(path) + 1 emitted tokens (path tokens, then the
bonus), ``logprobs`` [E] and, row-major, ``top_ids`` / ``top_logprobs`` [E·k]
(``rapid.server.scores``); all three are empty when none were asked for.

Versions. ``PROTOCOL_VERSION`` 2 (v1 had no ``tokenizer``/``flat_nodes``/``logprobs``). A Hello of
another version is refused with ``bad_version`` before its fields are looked at, so the error
names the versions rather than unknown fields.

``decode`` never raises anything but ``WireError`` (with a machine-readable ``code``), whatever
bytes it is given.

Size limits. An array holds at most ``MAX_ARRAY`` (2^20) values, the arrays of one frame at
most ``2·MAX_ARRAY`` together, and a string at most ``MAX_STR`` bytes. The largest legal frame is
thus 2 × 4 MiB of array bytes (a ``Tree`` with two full arrays, or a verdict's four arrays) plus
a few dozen bytes of msgpack keys and scalars, so ``MAX_FRAME_BYTES`` (the protocol limit
``decode`` enforces) is 8 MiB + ``MAX_STR``: every frame whose fields are within their limits
fits. The websocket transport accepts messages up to ``TRANSPORT_MAX_BYTES``, 1 MiB
above the protocol limit, so a frame that is a little too large reaches ``decode`` and is
answered with ``ErrorFrame("too_large")`` on a connection that stays usable; only a message
beyond the transport limit closes the connection (websocket close code 1009). Both ends use
these constants.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import msgpack
import numpy as np

PROTOCOL_VERSION = 2
MAX_ARRAY = 1 << 20  # values in one array (int32 / float32 on the wire)
MAX_FRAME_VALUES = 2 * MAX_ARRAY  # values in all arrays of one frame together
MAX_TOP_LOGPROBS = 20  # alternatives per token (OpenAI's top_logprobs limit)
MAX_STR = 1 << 16  # bytes in one string
MAX_FRAME_BYTES = 2 * 4 * MAX_ARRAY + MAX_STR  # a Tree with two full arrays, and room to spare
TRANSPORT_MAX_BYTES = MAX_FRAME_BYTES + (1 << 20)  # websocket max_size: too-large frames reach decode


class WireError(Exception):
    """A frame that cannot be accepted; ``code`` is sent back in an ErrorFrame."""

    def __init__(self, code: str, reason: str) -> None:
        super().__init__(f"{code}: {reason}")
        self.code = code
        self.reason = reason


@dataclass(slots=True)
class Hello:
    prompt: list[int]
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0
    max_nodes: int = 64
    session: str | None = None  # resume this session id when given
    tokenizer: str = ""  # rapid.core.vocab.fingerprint of the edge's tokenizer ("" = not checked)
    logprobs: int = -1  # -1: none; k >= 0: each emitted token's log-probability and its top k
    v: int = PROTOCOL_VERSION
    T = "hello"


@dataclass(slots=True)
class Ready:
    session: str
    vocab_size: int
    capacity: int
    max_nodes: int
    committed: int
    flat_nodes: int = 0  # tree nodes the cloud verifies at about one step's cost (0 = not measured)
    tokenizer: str = ""  # rapid.core.vocab.fingerprint of the target's tokenizer ("" = not known)
    curve_nodes: list[int] = field(default_factory=list)  # verify curve: tree nodes after the root ...
    curve_us: list[int] = field(default_factory=list)  # ... and the forward's microseconds (same length)
    T = "ready"

    def __post_init__(self) -> None:
        if len(self.curve_nodes) != len(self.curve_us):
            raise WireError("bad_frame", "curve_nodes and curve_us must have the same length")


@dataclass(slots=True)
class Tree:
    round: int
    tokens: list[int]
    parents: list[int]
    T = "tree"


@dataclass(slots=True)
class VerdictFrame:
    round: int
    path: list[int]
    bonus: int
    committed: int  # committed length on the cloud after this verdict
    verify_s: float = 0.0
    logprobs: list[float] = field(default_factory=list)  # [E] per emitted token (path, then bonus)
    top_ids: list[int] = field(default_factory=list)  # [E·k] each token's k most likely alternatives
    top_logprobs: list[float] = field(default_factory=list)  # [E·k] their log-probabilities
    T = "verdict"


@dataclass(slots=True)
class ErrorFrame:
    code: str
    reason: str
    round: int | None = None
    T = "error"


@dataclass(slots=True)
class Bye:
    T = "bye"


FRAMES: dict[str, type] = {c.T: c for c in (Hello, Ready, Tree, VerdictFrame, ErrorFrame, Bye)}
_ARRAYS = {"prompt", "tokens", "parents", "path", "top_ids", "curve_nodes", "curve_us"}  # int32 on the wire
_FLOATS = {"logprobs", "top_logprobs"}  # float32 on the wire (in a VerdictFrame; an int in a Hello)
Frame = Hello | Ready | Tree | VerdictFrame | ErrorFrame | Bye

# field name -> accepted python types (after msgpack decoding)
_TYPES: dict[str, tuple[type, ...]] = {
    "prompt": (list,), "tokens": (list,), "parents": (list,), "path": (list,), "top_ids": (list,),
    "temperature": (float, int), "top_p": (float, int), "verify_s": (float, int),
    "top_k": (int,), "seed": (int,), "max_nodes": (int,), "v": (int,), "round": (int,),
    "bonus": (int,), "committed": (int,), "flat_nodes": (int,), "vocab_size": (int,), "capacity": (int,),
    "session": (str,), "code": (str,), "reason": (str,), "tokenizer": (str,),
}
_FIELD_TYPES = {(Hello, "logprobs"): (int,), (VerdictFrame, "logprobs"): (list,)}  # one name, two meanings


def _pack_ints(values: list[int]) -> bytes:
    arr = np.asarray(values, dtype=np.int64)
    if arr.size and (arr.min() < -(2**31) or arr.max() >= 2**31):
        raise WireError("bad_value", "integer outside int32")
    return arr.astype("<i4").tobytes()


def _nan_or_posinf(arr: np.ndarray) -> bool:
    """A log-probability array holds NaN or +inf (-inf is a legal log-probability)."""
    return bool(np.isnan(arr).any() or np.isposinf(arr).any())


def _pack_floats(values: list[float]) -> bytes:
    arr = np.asarray(values, dtype=np.float32)
    if _nan_or_posinf(arr):
        raise WireError("bad_value", "a log-probability is NaN or +inf")
    return arr.astype("<f4").tobytes()


def _is_array(frame_cls: type, name: str) -> str | None:
    """"i" for an int32 array field, "f" for a float32 one, None for a scalar."""
    if name in _ARRAYS:
        return "i"
    if name in _FLOATS and frame_cls is VerdictFrame:
        return "f"
    return None


def encode(frame: Frame) -> bytes:
    body: dict[str, Any] = {"t": frame.T}
    values = 0
    for k, v in asdict(frame).items():
        if isinstance(v, str) and len(v.encode()) > MAX_STR:
            if not (isinstance(frame, ErrorFrame) and k == "reason"):
                raise WireError("bad_value", f"field {k!r} is longer than {MAX_STR} bytes")
            v = v.encode()[: MAX_STR - 4].decode(errors="ignore") + " …"  # an error reason is cut, never refused
        kind = _is_array(type(frame), k)
        if kind is not None:
            values += len(v)
            v = _pack_ints(v) if kind == "i" else _pack_floats(v)
        body[k] = v
    if values > MAX_FRAME_VALUES:
        raise WireError("bad_value", f"the arrays of one frame hold more than {MAX_FRAME_VALUES} values")
    _check_fields(frame)
    return msgpack.packb(body, use_bin_type=True)


def _check_fields(frame: Frame) -> None:
    """Cross-field rules ``decode`` enforces (and ``encode``, so it never sends what is refused)."""
    if isinstance(frame, Hello) and not -1 <= frame.logprobs <= MAX_TOP_LOGPROBS:
        raise WireError("bad_value", f"hello logprobs must be -1 (none) or 0..{MAX_TOP_LOGPROBS}, got {frame.logprobs}")
    if isinstance(frame, VerdictFrame) and (frame.logprobs or frame.top_ids or frame.top_logprobs):
        e = len(frame.path) + 1
        if len(frame.logprobs) != e or len(frame.top_ids) != len(frame.top_logprobs) or len(frame.top_ids) % e:
            raise WireError("bad_value", f"verdict log-probabilities need {e} values and top arrays of equal "
                                         f"length, a multiple of {e}")


def decode(data: bytes | str) -> Frame:
    """Parse one frame; raise ``WireError`` for anything malformed."""
    if isinstance(data, str):
        raise WireError("bad_frame", "text frames are not accepted; send binary msgpack")
    if len(data) > MAX_FRAME_BYTES:
        raise WireError("too_large", f"frame of {len(data)} bytes exceeds {MAX_FRAME_BYTES}")
    try:
        body = msgpack.unpackb(data, raw=False, strict_map_key=True, max_bin_len=MAX_FRAME_BYTES,
                               max_str_len=MAX_STR, max_array_len=1 << 10, max_map_len=64)
    except Exception as e:  # msgpack raises many types on garbage
        raise WireError("bad_frame", f"not a msgpack frame ({type(e).__name__})") from None
    if not isinstance(body, dict) or not isinstance(body.get("t"), str):
        raise WireError("bad_frame", "a frame is a map with a string type tag 't'")
    cls = FRAMES.get(body.pop("t"))
    if cls is None:
        raise WireError("unknown_type", "unknown frame type")
    if cls is Hello and type(body.get("v")) is int and body["v"] != PROTOCOL_VERSION:  # before the fields
        raise WireError("bad_version", f"protocol version {body['v']} is not supported (this side speaks "
                                       f"{PROTOCOL_VERSION}); run the same RAPID version on edge and cloud")
    names = set(cls.__dataclass_fields__)
    unknown = set(body) - names
    if unknown:
        raise WireError("bad_frame", f"unknown fields {sorted(map(str, unknown))[:5]}")
    kwargs: dict[str, Any] = {}
    values = 0
    for k, v in body.items():
        kind = _is_array(cls, k)
        if kind is not None:
            if not isinstance(v, bytes) or len(v) % 4 or len(v) // 4 > MAX_ARRAY:
                raise WireError("bad_frame", f"field {k!r} must be {'int32' if kind == 'i' else 'float32'} bytes")
            values += len(v) // 4
            if kind == "i":
                v = np.frombuffer(v, dtype="<i4").astype(np.int64).tolist()
            else:
                arr = np.frombuffer(v, dtype="<f4")
                if _nan_or_posinf(arr):
                    raise WireError("bad_value", f"field {k!r} holds NaN or +inf")
                v = arr.tolist()
        elif v is None and cls.__dataclass_fields__[k].default is None:
            pass  # optional field left empty
        elif v is None or not isinstance(v, _FIELD_TYPES.get((cls, k)) or _TYPES[k]) or isinstance(v, bool):
            raise WireError("bad_frame", f"field {k!r} has the wrong type")
        elif isinstance(v, float) and not np.isfinite(v):
            raise WireError("bad_value", f"field {k!r} is not finite")
        kwargs[k] = v
    if values > MAX_FRAME_VALUES:
        raise WireError("bad_value", f"the arrays of one frame hold more than {MAX_FRAME_VALUES} values")
    try:
        frame = cls(**kwargs)
    except TypeError:
        raise WireError("bad_frame", f"{cls.T} frame is missing fields") from None
    _check_fields(frame)  # (a Hello's version was checked before its fields)
    return frame
