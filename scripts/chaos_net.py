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

``Secure`` (``--secure``) is the production shape: a self-signed certificate for 127.0.0.1 and a
token. The cloud then serves ``wss://`` and wants the token; the proxy terminates TLS on its side
and opens its own TLS connection upstream, forwarding the edge's ``Authorization`` header (a
wrong token is refused by the cloud, not by the proxy); the rogue client brings the token, and
one more rogue case (``no_token``) must be refused with HTTP 401 before any frame is read.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import re
import secrets
import shutil
import signal
import ssl
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import msgpack
import websockets
from fuzz_wire import rand_frame
from websockets.asyncio.client import connect
from websockets.asyncio.server import serve

from rapid.core.auth import bearer, write_self_signed
from rapid.core.procs import start_listening, start_server, stop_server
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


@dataclass(slots=True)
class Secure:
    """TLS (a self-signed certificate for localhost / 127.0.0.1) and a token, written under ``folder``."""

    cert: str
    key: str
    token_file: str
    token: str

    @classmethod
    def make(cls, folder: Path) -> Secure:
        cert, key = write_self_signed(folder)
        token_file = folder / "token"
        token = secrets.token_urlsafe(24)
        token_file.write_text(token + "\n")
        return cls(cert, key, str(token_file), token)

    def serve_flags(self) -> list[str]:
        return ["--cert", self.cert, "--key", self.key, "--token-file", self.token_file]

    def edge_flags(self) -> list[str]:
        return ["--cafile", self.cert, "--token-file", self.token_file]

    def client_ssl(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=self.cert)

    def server_ssl(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(self.cert, self.key)
        return ctx


def _tls(secure: Secure | None, url: str) -> dict:
    """connect() keywords for ``url``: TLS (trusting the soak's certificate) and the token."""
    if secure is None:
        return {}
    return {"ssl": secure.client_ssl() if url.startswith("wss://") else None,
            "additional_headers": bearer(secure.token)}


class Cloud:
    """The ``rapid serve`` process; killed with SIGKILL and restarted on the same port."""

    def __init__(self, target: str, port: int, extra: list[str], logs: Path, t0: float,
                 secure: Secure | None = None, replicas: int = 0) -> None:
        self.target, self.port, self.logs, self.t0, self.secure = target, port, logs, t0, secure
        self.extra = extra + (secure.serve_flags() if secure else []) + (["--replicas", str(replicas)] if replicas else [])
        self.replicas = replicas
        # RAY_TMPDIR: this soak's cluster only; short, as Ray's socket paths must fit 107 bytes
        self.ray_dir = tempfile.mkdtemp(prefix="rs", dir="/tmp") if replicas else ""
        self.url = f"{'wss' if secure else 'ws'}://127.0.0.1:{port}"
        self.proc = None
        self.up = asyncio.Event()
        self.incarnations: list[dict] = []

    async def start(self) -> None:
        n = len(self.incarnations)
        t = time.monotonic()
        log_path = self.logs / f"serve-{n}.log"
        if self.replicas:
            cmd = [sys.executable, "-m", "rapid.cli", "serve", "--target", self.target, "--port", str(self.port),
                   *self.extra]
            env = {**os.environ, "RAY_TMPDIR": self.ray_dir}
            self.proc = await asyncio.to_thread(start_listening, cmd, "127.0.0.1", self.port, 300.0, log_path, env)
            await self._deployed(log_path)
        else:
            self.proc = await asyncio.to_thread(start_server, self.target, self.port, self.extra, 180.0, log_path)
        self.incarnations.append({"n": n, "pid": self.proc.pid, "up_at_s": round(time.monotonic() - self.t0, 1),
                                  "start_s": round(time.monotonic() - t, 1), "killed_at_s": None})
        self.up.set()

    async def _deployed(self, log_path: Path, timeout: float = 300.0) -> None:
        """Ray Serve's proxy listens before the application is deployed: wait for its log line."""
        t = time.monotonic()
        while "rapid on Ray Serve:" not in log_path.read_text(errors="replace"):
            if time.monotonic() - t > timeout or self.proc.poll() is not None:
                raise RuntimeError(f"rapid serve --replicas did not deploy; see {log_path}")
            await asyncio.sleep(0.5)

    def replica_pids(self) -> list[int]:
        """Processes of this soak's Ray cluster that serve a verifier replica."""
        pids = []
        for d in filter(str.isdigit, os.listdir("/proc")):
            try:
                cmd = Path(f"/proc/{d}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if "ServeReplica" in cmd and "Verifier" in cmd and (not self.ray_dir or self._ours(int(d))):
                pids.append(int(d))
        return sorted(pids)

    def _ours(self, pid: int) -> bool:
        try:
            return self.ray_dir in Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
        except OSError:
            return False

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

    async def drain(self) -> float:
        """SIGTERM (the server's graceful shutdown: sessions told to move); seconds until it exited."""
        self.up.clear()
        t = time.monotonic()
        await asyncio.to_thread(stop_server, self.proc)
        self.incarnations[-1]["killed_at_s"] = round(time.monotonic() - self.t0, 1)
        self.incarnations[-1]["drained"] = True
        return time.monotonic() - t

    async def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            await asyncio.to_thread(stop_server, self.proc)
        for pid in self._cluster_pids():  # a Ray process that outlived its driver's shutdown
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        if self.ray_dir:
            shutil.rmtree(self.ray_dir, ignore_errors=True)

    def _cluster_pids(self) -> list[int]:
        if not self.ray_dir:
            return []
        out = []
        for d in filter(str.isdigit, os.listdir("/proc")):
            with contextlib.suppress(OSError):
                if self.ray_dir in Path(f"/proc/{d}/cmdline").read_bytes().decode(errors="replace"):
                    out.append(int(d))
        return out


class FaultProxy:
    """Seeded message-level faults; probabilities are per forwarded message."""

    def __init__(self, upstream: str, rng: random.Random, cut: float, dup: float, delay: float,
                 max_delay_s: float = 0.02, secure: Secure | None = None) -> None:
        self.upstream, self.secure = upstream, secure
        self.rng = rng
        self.p = {"cut": cut, "dup": dup, "delay": delay}
        self.max_delay_s = max_delay_s
        self.events: Counter = Counter()
        self._live: set = set()
        self._holes: set = set()  # half-open pairs: messages are read and discarded
        self._server = None
        self.url = ""

    async def start(self) -> str:
        tls = {"ssl": self.secure.server_ssl()} if self.secure else {}
        self._server = await serve(self._handle, "127.0.0.1", 0, compression=None, max_size=None, **tls)
        self.url = f"{'wss' if self.secure else 'ws'}://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
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
            auth = client.request.headers.get("Authorization")  # the edge's own: forwarded as it came
            tls = {"ssl": self.secure.client_ssl()} if self.secure else {}
            up = await connect(self.upstream, compression=None, max_size=None, open_timeout=5,
                               additional_headers={"Authorization": auth} if auth else {}, **tls)
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


def rogue_cases(rng: random.Random, secure: bool = False) -> dict[str, list]:
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
        **({"no_token": []} if secure else {}),  # refused at the upgrade: HTTP 401
    }


async def rogue(url: str, case: str, messages: list, secure: Secure | None = None) -> dict:
    """Run one case; outcome ok | anomaly (a wrong or no answer) | refused | gone (connection lost).
    ``no_token`` (secure only) connects without the token: ok when the upgrade gets HTTP 401."""
    tls = _tls(secure, url)
    if case == "no_token":
        tls.pop("additional_headers", None)
    try:
        ws = await connect(url, open_timeout=ANSWER_TIMEOUT_S, max_size=TRANSPORT_MAX_BYTES, compression=None, **tls)
    except websockets.InvalidStatus as e:
        ok = case == "no_token" and e.response.status_code == 401
        return {"case": case, "outcome": "ok" if ok else "refused", "got": f"HTTP {e.response.status_code}"}
    except (OSError, TimeoutError, websockets.InvalidHandshake):
        return {"case": case, "outcome": "refused"}
    if case == "no_token":
        _abort(ws)
        return {"case": case, "outcome": "anomaly", "want": "HTTP 401", "got": "accepted without a token"}
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

def metric(port: int, name: str, timeout: float = 5.0, secure: Secure | None = None) -> float | None:
    """One unlabelled sample of ``name`` from the cloud's /metrics; None if unreachable."""
    scheme, tls = ("https", secure.client_ssl()) if secure else ("http", None)
    request = urllib.request.Request(f"{scheme}://127.0.0.1:{port}/metrics", headers=bearer(secure.token if secure else None))
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=tls) as r:
            text = r.read().decode()
    except OSError:
        return None
    values = re.findall(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$", text, re.MULTILINE)
    return sum(float(v) for v in values) if values else None  # replicas label theirs: the sum


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
