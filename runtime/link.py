"""The edge's websocket link to the cloud verifier, with reconnect and resume.

A receiver task reads frames as they arrive. When the verdict of the pending round lands it sets
``feedback`` (a ``threading.Event``) *before* handing the frame to the coordinator, so a drafting
thread that checks the flag between expansion steps learns about it at the next step boundary.

Fault tolerance lives here, so the coordinator is unaware of it. The link reads the request's
committed tokens from its ``Transcript`` (rapid.runtime.transcript: the prompt, then ``path
tokens + bonus`` of every verdict, which the drafter appends) and keeps the one tree in flight. When the connection drops, or no verdict comes for ``retry_timeout`` (first it
re-sends the tree on the same connection, then it reconnects), it reconnects with exponential
backoff and sends ``Hello(session=id, prompt=committed)``:

- the cloud still has the session (grace period): it resumes; if the lost verdict had already
  been applied there, the re-sent tree is answered with the *stored* verdict (never verified twice);
- the cloud lost it (restart, expiry): it prefills the committed tokens into a new session; the
  re-sent tree is verified there, and since every pick depends only on the prefix (greedy) or on
  (seed, absolute position) (sampling), the verdict is the same.

No verdict waits forever: one round, re-sends and reconnects included, may take at most

    deadline = clamp(VERDICT_FACTOR × slowest verdict of this session, min(VERDICT_FLOOR_S, cap), cap)

(cap = ``verdict_timeout_s``), after which ``verdict`` raises ``CloudError("deadline")``.

A cloud that answers but is full (``ErrorFrame("full")`` at its session limit, HTTP 503 at its
connection limit) is retried only for ``full_retry_s`` (a few seconds, for a slot that is being
freed), then the open or reconnect fails with ``CloudError("full")``: the cloud is reachable, and
``max_retry_s`` of retries ending in "unreachable" would misreport it.

Each connection has a generation number; frames of an older connection are dropped unread, and a
verdict is applied only for the pending round with the expected committed length, so a late or
duplicated result is never applied twice.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import random
import threading
import time

import websockets
from websockets.asyncio.client import ClientConnection, connect

from rapid.core.auth import bearer
from rapid.core.errors import OptionError, RapidError
from rapid.core.wire import (
    PROTOCOL_VERSION,
    TRANSPORT_MAX_BYTES,
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
from rapid.runtime.transcript import Transcript

log = logging.getLogger("rapid.edge.link")

RETRYABLE = {"no_session", "closed", "timeout"}
FULL = {"full", "busy"}  # the cloud is at its session limit ("busy": what older clouds sent)
FULL_RETRY_S = 3.0  # a full cloud is retried this long, then the open fails with CloudError("full")
VERDICT_FACTOR = 10.0  # a round may take this many times the session's slowest verdict so far
VERDICT_FLOOR_S = 30.0  # ... but at least this (the first round includes the cloud's prefill)


def checked_seconds(name: str, value: float, zero_ok: bool = False) -> float:
    """``value`` when it is a finite number of seconds > 0 (>= 0 with ``zero_ok``), else an
    ``OptionError`` naming ``name``: the one rule for a timeout, read by ``CloudLink`` for its own and
    by ``rapid edge``'s start-up check of its flags (the link's two and ``--shutdown-timeout``)."""
    if not (math.isfinite(value) and (value >= 0 if zero_ok else value > 0)):
        raise OptionError(f"{name} must be a finite number {'>= 0' if zero_ok else '> 0'}, got {value}")
    return value


class CloudError(RapidError):
    """The cloud answered with an error frame, or could not be reached."""

    def __init__(self, code: str, reason: str) -> None:
        super().__init__(f"cloud error [{code}]: {reason}")
        self.code = code
        self.reason = reason


class _Lost(Exception):
    """The current connection is gone or silent (internal: triggers a reconnect)."""


class _Full(_Lost):
    """The cloud answered but is at its limit (ErrorFrame full, or HTTP 503 at its connection cap)."""


class _CannotConnect(_Lost):
    """Dialling failed: nothing answered at the URL (internal: the first open fails fast)."""


class CloudLink:
    def __init__(self, url: str, open_timeout: float = 10.0, delay_s: float = 0.0, *, token: str | None = None,
                 ssl=None, retry_timeout: float = 30.0, max_retry_s: float = 60.0, backoff_s: float = 0.05,
                 backoff_max_s: float = 2.0, reconnect: bool = True, rng: random.Random | None = None,
                 verdict_timeout_s: float = 120.0, tokenizer: str = "",
                 full_retry_s: float = FULL_RETRY_S) -> None:
        checked_seconds("verdict_timeout_s", verdict_timeout_s)
        checked_seconds("retry_timeout", retry_timeout)
        self.url = url
        self.open_timeout = open_timeout
        self.delay_s = delay_s  # optional one-way delay added to each sent tree (labelled in reports)
        self.token = token
        self.ssl = ssl
        self.retry_timeout = retry_timeout  # silence before re-sending / reconnecting
        self.max_retry_s = max_retry_s  # give up reconnecting after this long
        self.full_retry_s = full_retry_s  # give up waiting for a full cloud after this long
        self.backoff_s, self.backoff_max_s = backoff_s, backoff_max_s
        self.reconnect = reconnect
        self.verdict_timeout_s = verdict_timeout_s  # hard cap on one round's wait (module docstring)
        self.tokenizer = tokenizer  # rapid.core.vocab.fingerprint of the edge's tokenizer ("" = unchecked)
        self._slowest = 0.0  # slowest verdict of this session (seconds from send_tree)
        self._sent_at = 0.0
        self._rng = rng or random.Random()
        self.feedback = threading.Event()
        self.ready: Ready | None = None
        self.session: str | None = None
        self.transcript = Transcript.of([])  # the committed tokens: read here, appended by the drafter
        self.stats = {"reconnects": 0, "resumed": 0, "reprefilled": 0, "resent": 0, "stale": 0}
        self._hello: Hello | None = None
        self._pending: Tree | None = None
        self._ws: ClientConnection | None = None
        self._gen = 0
        self._inbox: asyncio.Queue = asyncio.Queue()
        self._readers: list[asyncio.Task] = []
        self._arrivals: dict[int, float] = {}
        self._closed = False

    # -- connections ---------------------------------------------------------------------------

    async def _dial(self) -> None:
        """Open a new connection (generation ``_gen + 1``); the old one is abandoned."""
        kw = {"ssl": self.ssl} if self.ssl is not None else {}
        try:
            ws = await connect(self.url, open_timeout=self.open_timeout, max_size=TRANSPORT_MAX_BYTES,
                               compression=None, additional_headers=bearer(self.token), **kw)
        except websockets.InvalidStatus as e:
            status = e.response.status_code
            if status == 401:
                raise CloudError("unauthorized", "the cloud rejected the token (HTTP 401)") from None
            if status == 503:
                raise _Full("the cloud is at its connection limit (HTTP 503)") from None
            raise _Lost(f"handshake answered HTTP {status}") from None
        except (OSError, TimeoutError, websockets.InvalidHandshake, websockets.ConnectionClosed) as e:
            raise _CannotConnect(f"cannot connect to {self.url}: {e}") from None
        await self._abandon()
        self._gen += 1
        self._ws = ws
        self._readers = [t for t in self._readers if not t.done()]
        self._readers.append(asyncio.create_task(self._read(ws, self._gen)))

    async def _abandon(self) -> None:
        if self._ws is not None:
            ws, self._ws = self._ws, None
            if ws.transport is not None:
                ws.transport.abort()

    async def _read(self, ws: ClientConnection, gen: int) -> None:
        try:
            async for message in ws:
                try:
                    frame = decode(message)
                except WireError as e:
                    frame = ErrorFrame(e.code, f"undecodable frame from the cloud: {e.reason}")
                if gen != self._gen:
                    continue  # a late frame of an abandoned connection
                if isinstance(frame, VerdictFrame):
                    self._arrivals[frame.round] = time.perf_counter()
                    if self._pending is not None and frame.round == self._pending.round:
                        self.feedback.set()
                self._inbox.put_nowait((gen, frame))
        except websockets.ConnectionClosed:
            pass
        finally:
            self._inbox.put_nowait((gen, None))

    async def _next(self, timeout: float | None):
        """The next frame of the current connection; ``_Lost`` when it closed or stayed silent."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError
            gen, frame = await asyncio.wait_for(self._inbox.get(), left)
            if gen != self._gen:
                continue
            if frame is None:
                raise _Lost("the connection to the cloud closed")
            return frame

    async def _handshake(self, session: str | None) -> Ready:
        """Dial, send Hello for the committed tokens, wait for Ready (raises _Lost / CloudError)."""
        await self._dial()
        assert self._hello is not None
        hello = dataclasses.replace(self._hello, prompt=list(self.transcript.tokens), session=session)
        await self._send(encode(hello))
        while True:
            try:
                frame = await self._next(self.retry_timeout if self.reconnect else self.open_timeout)
            except TimeoutError:
                raise _Lost("no ready frame") from None
            if isinstance(frame, Ready):
                break
            if isinstance(frame, ErrorFrame):
                if frame.code in FULL:
                    raise _Full(frame.reason)
                if frame.code in RETRYABLE:
                    raise _Lost(f"{frame.code}: {frame.reason}")
                if frame.code == "bad_frame" and "unknown fields" in frame.reason:  # a v1 cloud
                    raise CloudError("bad_version", f"the cloud speaks an older RAPID protocol than this edge "
                                                    f"(v{PROTOCOL_VERSION}; it said: {frame.reason}); run the same "
                                                    "RAPID version on edge and cloud")
                raise CloudError(frame.code, frame.reason)
            # anything else (a stray duplicate) is ignored
        if self.tokenizer and frame.tokenizer and frame.tokenizer != self.tokenizer:
            await self._send(encode(Bye()))
            raise CloudError("incompatible", f"the cloud's target speaks another tokenizer (fingerprint {frame.tokenizer}, "
                                             f"the draft's is {self.tokenizer}): use a draft of the target's family")
        ahead = frame.committed - len(self.transcript)
        pending_room = 0 if self._pending is None else len(self._pending.tokens) + 1
        if ahead < 0 or ahead > pending_room:  # the cloud's session disagrees with us: start afresh
            await self._send(encode(Bye()))
            return await self._handshake(None)
        self.ready, self.session = frame, frame.session
        return frame

    async def _send(self, data: bytes) -> None:
        ws = self._ws
        if ws is None:
            return
        try:
            await ws.send(data)
        except websockets.ConnectionClosed:
            pass  # the reader reports the loss; the next wait reconnects

    async def _recover(self, why: str) -> None:
        """Reconnect with backoff, resume (or re-establish) the session, re-send the pending tree."""
        if not self.reconnect or self._hello is None:
            raise CloudError("closed", why)
        log.info("cloud link lost (%s): reconnecting", why)
        t0, attempt, full_since = time.monotonic(), 0, None
        while True:
            if attempt:
                delay = min(self.backoff_max_s, self.backoff_s * 2 ** (attempt - 1))
                await asyncio.sleep(delay * (0.5 + self._rng.random()))
            attempt += 1
            self.stats["reconnects"] += 1
            try:
                old = self.session
                ready = await self._handshake(old)
            except _Full as e:  # reachable but full: a short wait for a slot, not the long reconnect budget
                full_since = full_since or time.monotonic()
                if time.monotonic() - full_since >= self.full_retry_s:
                    raise CloudError("full", f"the cloud is full ({e}); gave up after {attempt} tries "
                                             f"in {time.monotonic() - full_since:.1f}s") from None
                continue
            except _Lost as e:
                if time.monotonic() - t0 > self.max_retry_s:
                    raise CloudError("unreachable", f"gave up reconnecting after {attempt} tries: {e}") from None
                continue
            self.stats["resumed" if ready.session == old else "reprefilled"] += 1
            if self._pending is not None:
                self.stats["resent"] += 1
                await self._send(encode(self._pending))
            return

    # -- the coordinator's interface -----------------------------------------------------------

    async def open(self, hello: Hello, transcript: Transcript | None = None) -> Ready:
        """Open a session for ``hello.prompt``. ``transcript``: the request's committed tokens,
        which the caller extends by each verdict's path + bonus before the next tree (the
        Coordinator's drafter does); without one the link keeps ``hello.prompt`` alone."""
        self._hello = dataclasses.replace(hello, tokenizer=self.tokenizer) if self.tokenizer else hello
        self._closed = False
        self.transcript = transcript if transcript is not None else Transcript.of(hello.prompt)
        if self.transcript.tokens != list(hello.prompt):
            raise ValueError("the transcript must begin as the hello's prompt")
        self._pending = None
        self.session = None
        try:
            return await self._first_handshake()
        except CloudError:
            await self._abandon()  # a failed open leaves no connection behind (the cloud would hold it)
            raise

    async def _first_handshake(self) -> Ready:
        try:
            return await self._handshake(None)
        except _Lost as e:
            if not self.reconnect:
                raise CloudError("full" if isinstance(e, _Full) else "unreachable", str(e)) from None
            if isinstance(e, _CannotConnect):  # nothing listens there: fail fast on the first open
                raise CloudError("unreachable", str(e)) from None
            await self._recover(str(e))
            assert self.ready is not None
            return self.ready

    async def send_tree(self, round_id: int, tokens: list[int], parents: list[int]) -> None:
        assert self._hello is not None, "open() first"
        self.feedback.clear()
        self._sent_at = time.perf_counter()
        self._pending = Tree(round_id, list(tokens), list(parents))
        data = encode(self._pending)
        if self.delay_s > 0:
            asyncio.get_running_loop().call_later(self.delay_s, lambda: asyncio.ensure_future(self._send(data)))
        else:
            await self._send(data)

    def verdict_deadline_s(self) -> float:
        """How long the next verdict may take in all (see the module docstring)."""
        cap = self.verdict_timeout_s
        return min(cap, max(min(VERDICT_FLOOR_S, cap), VERDICT_FACTOR * self._slowest))

    async def verdict(self, round_id: int) -> VerdictFrame:
        """The verdict of ``round_id``, re-sending and reconnecting as needed, within the deadline."""
        budget = self.verdict_deadline_s()
        try:
            frame = await asyncio.wait_for(self._await_verdict(round_id, min(self.retry_timeout, budget / 3)), budget)
        except TimeoutError:
            raise CloudError("deadline", f"no verdict for round {round_id} within {budget:.1f}s "
                                         f"(re-sends and reconnects included)") from None
        self._slowest = max(self._slowest, self._arrivals.get(round_id, time.perf_counter()) - self._sent_at)
        return frame

    async def _await_verdict(self, round_id: int, silence_s: float) -> VerdictFrame:
        """Wait for the verdict; after ``silence_s`` without a frame re-send the tree, after
        another ``silence_s`` reconnect (a third of the deadline at most, so a half-open
        connection is recovered before the deadline fires)."""
        silent = 0
        while True:
            try:
                frame = await self._next(silence_s if self.reconnect else None)
            except TimeoutError:
                silent += 1
                if silent == 1 and self._pending is not None:  # maybe a message was lost: re-send first
                    self.stats["resent"] += 1
                    await self._send(encode(self._pending))
                    continue
                silent = 0
                await self._recover("no verdict in time")
                continue
            except _Lost as e:
                silent = 0
                await self._recover(str(e))
                continue
            if isinstance(frame, ErrorFrame):
                if frame.round is not None and frame.round != round_id:
                    continue  # about an older round
                if frame.code == "bad_state" and frame.round is None:
                    continue  # a duplicated hello on this connection
                if frame.code in RETRYABLE and self.reconnect:
                    await self._recover(f"{frame.code}: {frame.reason}")
                    continue
                raise CloudError(frame.code, frame.reason)
            if not isinstance(frame, VerdictFrame):
                continue
            p = self._pending
            if p is None or frame.round != round_id or p.round != round_id:
                self.stats["stale"] += 1
                continue  # a verdict for an older round (abandoned or duplicated): never applied twice
            if frame.committed != len(self.transcript) + len(frame.path) + 1 or any(
                    not 0 <= j < len(p.tokens) for j in frame.path):
                raise CloudError("protocol", f"verdict of round {round_id} does not fit the committed tokens "
                                             f"({frame.committed} vs {len(self.transcript)} + {len(frame.path)} + 1)")
            self._pending = None
            return frame

    def arrival(self, round_id: int) -> float:
        """perf_counter() time at which the verdict of ``round_id`` was received."""
        return self._arrivals.pop(round_id, time.perf_counter())

    async def close(self) -> None:
        """Say Bye (the cloud frees the session at once) and close; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        ws, self._ws = self._ws, None
        self._gen += 1
        if ws is not None:
            try:
                await ws.send(encode(Bye()))
            except websockets.ConnectionClosed:
                pass
            try:
                await asyncio.wait_for(ws.close(), 2.0)
            except (TimeoutError, websockets.ConnectionClosed):
                pass
        for task in self._readers:
            task.cancel()
        await asyncio.gather(*self._readers, return_exceptions=True)
        self._readers.clear()
