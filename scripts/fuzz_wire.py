"""Fuzz the frame decoder and the verifier's frame handling for a bounded time.

    python scripts/fuzz_wire.py --minutes 10 [--seed 1] [--no-server]

Two loops, run alternately until the time is up:

1. ``rapid.core.wire.decode`` on mutated valid frames, random msgpack structures and random bytes:
   it must return a frame or raise ``WireError`` — nothing else, within a time bound.
2. A real ``VerifierServer`` (tiny float64 target, loopback) fed the same garbage on a few
   connections interleaved with a well-behaved session: every bad frame must get an
   ``ErrorFrame``, the good session's tokens must equal target-only decoding, the server's
   memory (RSS) must stay bounded.

Prints counts as JSON at the end; exits non-zero on the first finding (and prints it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import sys
import tempfile
import time

import msgpack

from rapid.core.wire import (
    FRAMES,
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

VALID = [
    Hello([1, 2, 3], 0.7, 0.9, 20, 5, 16), Hello([7], session="abcd"), Tree(0, [1, 2, 3], [-1, 0, 1]),
    Tree(3, [], []), Bye(), Ready("s", 259, 64, 8, 3), VerdictFrame(1, [0, 1], 5, 9, 0.01),
    ErrorFrame("full", "at its limit of 8 sessions", None),
]
FIELDS = ["t", "prompt", "tokens", "parents", "path", "round", "seed", "temperature", "top_p", "top_k",
          "max_nodes", "session", "v", "bonus", "committed", "code", "reason", "bogus"]


def rand_value(rng: random.Random, depth: int = 0):
    kind = rng.randrange(11 if depth < 3 else 8)
    if kind == 0:
        return rng.randint(-(2**63), 2**64 - 1)
    if kind == 1:
        return rng.choice([0, 1, -1, 2**31, -(2**31) - 1, 10**9])
    if kind == 2:
        return rng.choice([float("nan"), float("inf"), -0.0, 1e308, rng.random()])
    if kind == 3:
        return rng.randbytes(rng.choice([0, 1, 3, 4, 8, 4 * rng.randrange(64), rng.randrange(300)]))
    if kind == 4:
        return "".join(chr(rng.randrange(0x11000)) for _ in range(rng.randrange(12))).encode("utf-8", "replace").decode("utf-8", "replace")
    if kind == 5:
        return rng.choice([None, True, False])
    if kind == 6:
        return rng.choice(list(FRAMES))
    if kind == 7:
        return b"".join(int(rng.randint(-5, 300)).to_bytes(4, "little", signed=True) for _ in range(rng.randrange(10)))
    if kind == 8:
        return [rand_value(rng, depth + 1) for _ in range(rng.randrange(5))]
    if kind == 9:
        return {rng.choice(FIELDS): rand_value(rng, depth + 1) for _ in range(rng.randrange(5))}
    return msgpack.ExtType(rng.randrange(128), rng.randbytes(rng.randrange(8)))


def rand_frame(rng: random.Random) -> bytes | str:
    """One adversarial message (bytes, occasionally text)."""
    r = rng.random()
    if r < 0.3:  # byte-level mutation of a valid frame
        data = bytearray(encode(rng.choice(VALID)))
        for _ in range(rng.randint(1, 6)):
            op = rng.randrange(4)
            i = rng.randrange(len(data) + 1)
            if op == 0 and data:
                data[min(i, len(data) - 1)] = rng.randrange(256)
            elif op == 1:
                data[i:i] = rng.randbytes(rng.randint(1, 8))
            elif op == 2 and data:
                del data[i:i + rng.randint(1, 8)]
            else:
                data = data[:i]
        return bytes(data)
    if r < 0.65:  # structure-level: a map of plausible field names with random values
        body = {rng.choice(FIELDS): rand_value(rng) for _ in range(rng.randrange(7))}
        if rng.random() < 0.8:
            body["t"] = rng.choice([*FRAMES, "x", 3])
        try:
            return msgpack.packb(body, use_bin_type=True)
        except (ValueError, OverflowError, TypeError):
            return b"\x80"
    if r < 0.8:
        return msgpack.packb(rand_value(rng), use_bin_type=True)
    if r < 0.97:
        return rng.randbytes(rng.randrange(64))
    return "text " * rng.randrange(4)


def fuzz_decoder(rng: random.Random, n: int, counts: dict) -> None:
    for _ in range(n):
        data = rand_frame(rng)
        t0 = time.perf_counter()
        try:
            frame = decode(data)
        except WireError as e:
            counts["decode_errors"] += 1
            counts.setdefault("codes", {}).setdefault(e.code, 0)
            counts["codes"][e.code] += 1
        except Exception as e:  # a finding
            raise AssertionError(f"decode raised {type(e).__name__}: {e!r} on {data!r}") from e
        else:
            counts["decode_ok"] += 1
            again = decode(encode(frame))  # whatever decodes must round-trip
            assert again == frame, (frame, again)
        dt = time.perf_counter() - t0
        if dt > 0.5:
            raise AssertionError(f"decode took {dt:.2f}s on {data[:64]!r}")
        counts["decoded"] += 1


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def fuzz_server(url: str, rng: random.Random, n: int, counts: dict, target, headers=None) -> None:
    """n garbage frames on a garbage connection while a good session keeps decoding exactly."""
    from websockets.asyncio.client import connect

    from rapid.core.sampling import SamplingParams
    from rapid.server.target import reference_decode

    prompt = [rng.randrange(256) for _ in range(rng.randint(1, 8))]
    ref = reference_decode(target, prompt, 6, SamplingParams())
    kw = {"additional_headers": headers} if headers else {}
    async with connect(url, **kw) as good, connect(url, **kw) as bad:
        await good.send(encode(Hello(prompt)))
        assert isinstance(decode(await good.recv()), Ready)
        out: list[int] = []
        for i in range(n):
            data = rand_frame(rng)
            try:
                sent = decode(data)
            except WireError:
                sent = None
            await bad.send(data)
            if isinstance(sent, Bye):  # the server closes on bye: open a new one
                counts["server_valid_frames"] += 1
                await bad.close()
                bad = await connect(url, **kw)
            else:
                reply = decode(await asyncio.wait_for(bad.recv(), 10))
                if sent is None:
                    assert isinstance(reply, ErrorFrame), f"bad frame {data!r} got {reply}"
                    counts["server_bad_frames"] += 1
                else:
                    counts["server_valid_frames"] += 1
            counts["server_frames"] += 1
            if i % max(1, n // 6) == 0 and len(out) < 6:
                await good.send(encode(Tree(len(out), [], [])))
                v = decode(await asyncio.wait_for(good.recv(), 10))
                assert isinstance(v, VerdictFrame), v
                out.append(v.bonus)
        assert out == ref[: len(out)], (out, ref)
        await bad.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-server", action="store_true", help="fuzz the decoder only")
    ap.add_argument("--max-rss-growth-mb", type=float, default=300.0)
    args = ap.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    rng = random.Random(args.seed)
    counts = {"decoded": 0, "decode_ok": 0, "decode_errors": 0, "server_frames": 0, "server_bad_frames": 0,
              "server_valid_frames": 0, "server_rounds": 0}
    deadline = time.monotonic() + args.minutes * 60
    server = bg = target = None
    if not args.no_server:
        import torch
        from transformers import AutoModelForCausalLM

        from rapid.modeling import Decoder
        from rapid.server.app import VerifierServer
        from rapid.server.background import BackgroundServer
        from rapid.server.serve_config import Limits
        from rapid.tiny import build_tiny

        folder = build_tiny(tempfile.mkdtemp() + "/t", seed=0, dtype="float64")
        target = Decoder.from_hf(AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float64))
        server = VerifierServer(target, Limits(max_sessions=8, max_context=256, max_nodes=16))
        bg = BackgroundServer(server)
    rss0 = rss_mb()
    t0 = time.monotonic()
    try:
        while time.monotonic() < deadline:
            fuzz_decoder(rng, 2000, counts)
            if bg is not None:
                asyncio.run(fuzz_server(bg.url, rng, 200, counts, target))
                counts["server_rounds"] += 1
                growth = rss_mb() - rss0
                if growth > args.max_rss_growth_mb:
                    raise AssertionError(f"RSS grew by {growth:.0f} MB")
    except AssertionError as e:
        print(json.dumps({"finding": str(e)[:2000], **counts}), flush=True)
        return 1
    finally:
        if bg is not None:
            bg.close()
    counts["seconds"] = round(time.monotonic() - t0, 1)
    counts["rss_growth_mb"] = round(rss_mb() - rss0, 1)
    print(json.dumps(counts), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
