"""The chaos soak's cloud and network: the cloud process, a fault proxy, a rogue client, /metrics, RSS.

``Cloud`` is the ``rapid serve`` process, killed with SIGKILL and restarted on the same port.

``FaultProxy`` forwards whole websocket messages between edges and the cloud and, on a seeded
schedule, duplicates or delays messages and cuts connections (both directions aborted at the
TCP level); ``cut_all`` aborts every live connection at once; ``blackhole`` turns one connection
half-open: it stays up but nothing crosses it any more (a NAT that forgot the flow, a pulled
cable). No message is dropped otherwise: on TCP a message is only lost with its connection.

``rogue`` sends one malformed case straight to the cloud and checks the answer: every bad frame
must be answered with an ``ErrorFrame`` of the expected code (an oversized frame too: the
transport limit sits above the protocol's), and the connection must stay usable.
"""

from __future__ import annotations

import asyncio
import random
import re
import time
import urllib.request
from collections import Counter
from pathlib import Path

import msgpack
import websockets
from fuzz_wire import rand_frame
from websockets.asyncio.client import connect
from websockets.asyncio.server import serve

from rapid.core.procs import start_server, stop_server
from rapid.core.wire import (
    MAX_FRAME_BYTES,
    TRANSPORT_MAX_BYTES,
    Bye,
    ErrorFrame,
    Hello,
    Ready,
    Tree,
    WireError,
    decode,
    encode,
)

ANSWER_TIMEOUT_S = 15.0  # > the longest cloud freeze the soak injects (8 s)


class Cloud:
    """The ``rapid serve`` process; killed with SIGKILL and restarted on the same port."""

    def __init__(self, target: str, port: int, extra: list[str], logs: Path, t0: float) -> None:
        self.target, self.port, self.extra, self.logs, self.t0 = target, port, extra, logs, t0
        self.url = f"ws://127.0.0.1:{port}"
        self.proc = None
        self.up = asyncio.Event()
        self.incarnations: list[dict] = []

    async def start(self) -> None:
        n = len(self.incarnations)
        t = time.monotonic()
        self.proc = await asyncio.to_thread(start_server, self.target, self.port, self.extra, 180.0,
                                            self.logs / f"serve-{n}.log")
        self.incarnations.append({"n": n, "pid": self.proc.pid, "up_at_s": round(time.monotonic() - self.t0, 1),
                                  "start_s": round(time.monotonic() - t, 1), "killed_at_s": None})
        self.up.set()

    def uptime(self) -> float:
        """Seconds since the running incarnation listened (0 while it is down or starting)."""
        if not self.up.is_set():
            return 0.0
        return time.monotonic() - self.t0 - self.incarnations[-1]["up_at_s"]

    async def kill9(self) -> None:
        self.up.clear()
        self.proc.kill()
        await asyncio.to_thread(self.proc.wait)
        self.incarnations[-1]["killed_at_s"] = round(time.monotonic() - self.t0, 1)

    async def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            await asyncio.to_thread(stop_server, self.proc)


class FaultProxy:
    """Seeded message-level faults; probabilities are per forwarded message."""

    def __init__(self, upstream: str, rng: random.Random, cut: float, dup: float, delay: float,
                 max_delay_s: float = 0.02) -> None:
        self.upstream = upstream
        self.rng = rng
        self.p = {"cut": cut, "dup": dup, "delay": delay}
        self.max_delay_s = max_delay_s
        self.events: Counter = Counter()
        self._live: set = set()
        self._holes: set = set()  # half-open pairs: messages are read and discarded
        self._server = None
        self.url = ""

    async def start(self) -> str:
        self._server = await serve(self._handle, "127.0.0.1", 0, compression=None, max_size=None)
        self.url = f"ws://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self.url

    async def close(self) -> None:
        self.cut_all(count=False)
        self._server.close()
        await self._server.wait_closed()

    def cut_all(self, count: bool = True) -> int:
        """Abort every proxied connection now (a half-open one stays so); returns how many were cut."""
        pairs = list(self._live - self._holes) if count else list(self._live)
        for pair in pairs:
            _abort(*pair)
        if count and pairs:
            self.events["cut_all_connections"] += len(pairs)
        return len(pairs)

    def blackhole(self, rng: random.Random) -> bool:
        """Make one live connection half-open; False if none is live."""
        pairs = sorted(self._live - self._holes, key=id)
        if not pairs:
            return False
        self._holes.add(rng.choice(pairs))
        return True

    def _fault(self) -> str | None:
        r = self.rng.random()
        for name, p in self.p.items():
            if r < p:
                return name
            r -= p
        return None

    async def _handle(self, client) -> None:
        try:
            up = await connect(self.upstream, compression=None, max_size=None, open_timeout=5)
        except (OSError, TimeoutError, websockets.InvalidHandshake):
            self.events["upstream_refused"] += 1
            return  # the cloud is down: the edge sees its connection close and retries
        pair = (client, up)
        self._live.add(pair)
        done = asyncio.Event()
        tasks = [asyncio.create_task(self._pump(client, up, pair, done)),
                 asyncio.create_task(self._pump(up, client, pair, done))]
        try:
            await done.wait()
        finally:
            self._live.discard(pair)
            if pair in self._holes:  # half-open: the edge's side stays up (the cloud may be gone)
                _abort(up)
                await client.wait_closed()  # until the edge gives up on it
                self._holes.discard(pair)
            _abort(client, up)
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _pump(self, src, dst, pair: tuple, done: asyncio.Event) -> None:
        try:
            async for msg in src:
                if pair in self._holes:
                    self.events["blackholed_messages"] += 1
                    continue
                fault = self._fault()
                if fault:
                    self.events[fault] += 1
                if fault == "cut":
                    return
                if fault == "delay":
                    await asyncio.sleep(self.rng.random() * self.max_delay_s)
                await dst.send(msg)
                if fault == "dup":
                    await dst.send(msg)
        except websockets.ConnectionClosed:
            pass
        finally:
            done.set()


def _abort(*conns) -> None:
    for ws in conns:
        if ws.transport is not None and not ws.transport.is_closing():
            ws.transport.abort()


# -- the rogue client ---------------------------------------------------------------------------

def _raw(body) -> bytes:
    return msgpack.packb(body, use_bin_type=True)


def rogue_cases(rng: random.Random) -> dict[str, list]:
    """case name -> [(message, expected answer)]; an answer is an error code, "ready" or "close"."""
    prompt = [rng.randrange(33, 127) for _ in range(rng.randint(1, 8))]
    fuzz = []
    while len(fuzz) < 4:  # random garbage that the decoder refuses: the server must name the same code
        data = rand_frame(rng)
        try:
            decode(data)
        except WireError as e:
            fuzz.append((data, e.code))
    return {
        "garbage_bytes": [(b"\xc1" + rng.randbytes(rng.randint(0, 32)), "bad_frame")],
        "text_frame": [("hello", "bad_frame")],
        "not_a_map": [(_raw([1, 2, 3]), "bad_frame")],
        "unknown_type": [(_raw({"t": "nope"}), "unknown_type")],
        "unknown_field": [(_raw({"t": "bye", "bogus": 1}), "bad_frame")],
        "wrong_type": [(_raw({"t": "hello", "prompt": "abc"}), "bad_frame")],
        "bad_version": [(encode(Hello(prompt, v=99)), "bad_version")],
        "tree_before_hello": [(encode(Tree(0, [1], [-1])), "no_session")],
        "bad_sampling": [(encode(Hello(prompt, temperature=1.0, top_p=1.5)), "bad_hello")],
        "token_out_of_vocab": [(encode(Hello([10**6])), "bad_hello")],
        "client_sends_ready": [(encode(Ready("x", 259, 64, 8, 1)), "unexpected")],
        "fuzz": fuzz,
        # a session, then a tree whose parents point nowhere, then vanish without Bye:
        # the detached session must be freed when the grace period ends
        "bad_tree_then_vanish": [(encode(Hello(prompt)), "ready"), (encode(Tree(0, [1, 2], [5, 7])), "bad_tree"),
                                 (encode(Hello(prompt)), "bad_state")],
        "unknown_session": [(encode(Hello(prompt, session="0" * 16)), "ready"), (encode(Bye()), None)],
        # over the protocol limit but under the transport's: an error frame, the connection lives on
        "oversized": [(b"\x80" * (MAX_FRAME_BYTES + 1024), "too_large"), (encode(Hello(prompt)), "ready")],
    }


async def rogue(url: str, case: str, messages: list) -> dict:
    """Run one case; outcome ok | anomaly (a wrong or no answer) | refused | gone (connection lost)."""
    try:
        ws = await connect(url, open_timeout=ANSWER_TIMEOUT_S, max_size=TRANSPORT_MAX_BYTES, compression=None)
    except (OSError, TimeoutError, websockets.InvalidHandshake):
        return {"case": case, "outcome": "refused"}
    try:
        for data, want in messages:
            got = await _exchange(ws, data, want)
            if got != want:
                return {"case": case, "outcome": "anomaly", "want": want, "got": got}
        return {"case": case, "outcome": "ok"}
    except (websockets.ConnectionClosed, OSError) as e:
        return {"case": case, "outcome": "gone", "got": f"connection lost: {type(e).__name__}"}
    finally:
        _abort(ws)


async def _exchange(ws, data, want) -> str | None:
    """Send one message; the answer as an error code, "ready", "close:<code>" or "silence"."""
    try:
        await ws.send(data)
    except websockets.ConnectionClosed:
        if want == "close":
            return "close"
        raise
    if want is None:
        return None
    try:
        reply = await asyncio.wait_for(ws.recv(), ANSWER_TIMEOUT_S)
    except TimeoutError:
        return "silence"
    except websockets.ConnectionClosed as e:
        code = e.rcvd.code if e.rcvd is not None else None
        return "close" if code == 1009 else f"close:{code}"
    frame = decode(reply)
    if isinstance(frame, ErrorFrame):
        return frame.code
    return "ready" if isinstance(frame, Ready) else type(frame).__name__


# -- the cloud's own figures --------------------------------------------------------------------

def metric(port: int, name: str, timeout: float = 5.0) -> float | None:
    """One unlabelled sample of ``name`` from the cloud's /metrics; None if unreachable."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout) as r:
            text = r.read().decode()
    except OSError:
        return None
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    return float(m.group(1)) if m else None


def rss_kb(pid: int) -> int | None:
    """VmRSS of ``pid`` from /proc (None once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None
