"""The edge's websocket link to the cloud verifier.

A receiver task reads frames as they arrive. When a verdict lands it sets ``feedback`` (a
``threading.Event``) *before* handing the frame to the coordinator, so a drafting thread that
checks the flag between expansion steps learns about it at the next step boundary.
"""

from __future__ import annotations

import asyncio
import threading
import time

import websockets
from websockets.asyncio.client import ClientConnection, connect

from rapid.errors import RapidError
from rapid.wire import MAX_FRAME_BYTES, Bye, ErrorFrame, Hello, Ready, Tree, VerdictFrame, WireError, decode, encode


class CloudError(RapidError):
    """The cloud answered with an error frame, or could not be reached."""

    def __init__(self, code: str, reason: str) -> None:
        super().__init__(f"cloud error [{code}]: {reason}")
        self.code = code
        self.reason = reason


class CloudLink:
    def __init__(self, url: str, open_timeout: float = 10.0, delay_s: float = 0.0) -> None:
        self.url = url
        self.open_timeout = open_timeout
        self.delay_s = delay_s  # optional one-way delay added to each sent tree (labelled in reports)
        self.feedback = threading.Event()
        self.ready: Ready | None = None
        self._ws: ClientConnection | None = None
        self._inbox: asyncio.Queue = asyncio.Queue()
        self._reader: asyncio.Task | None = None
        self._arrivals: dict[int, float] = {}

    async def open(self, hello: Hello) -> Ready:
        try:
            self._ws = await connect(self.url, open_timeout=self.open_timeout, max_size=MAX_FRAME_BYTES,
                                     compression=None)
        except (OSError, TimeoutError, websockets.InvalidURI, websockets.InvalidHandshake) as e:
            raise CloudError("unreachable", f"cannot connect to {self.url}: {e}") from None
        self._reader = asyncio.create_task(self._read())
        await self._ws.send(encode(hello))
        frame = await self._next()
        if not isinstance(frame, Ready):
            raise CloudError("protocol", f"expected ready, got {frame.T}")
        self.ready = frame
        return frame

    async def _read(self) -> None:
        assert self._ws is not None
        try:
            async for message in self._ws:
                try:
                    frame = decode(message)
                except WireError as e:
                    frame = ErrorFrame(e.code, f"undecodable frame from the cloud: {e.reason}")
                if isinstance(frame, VerdictFrame):
                    self._arrivals[frame.round] = time.perf_counter()
                    self.feedback.set()
                self._inbox.put_nowait(frame)
        except websockets.ConnectionClosed:
            pass
        finally:
            self._inbox.put_nowait(None)

    async def _next(self):
        frame = await self._inbox.get()
        if frame is None:
            raise CloudError("closed", "the connection to the cloud closed")
        if isinstance(frame, ErrorFrame):
            raise CloudError(frame.code, frame.reason)
        return frame

    async def send_tree(self, round_id: int, tokens: list[int], parents: list[int]) -> None:
        assert self._ws is not None, "open() first"
        self.feedback.clear()
        data = encode(Tree(round_id, tokens, parents))
        if self.delay_s > 0:
            asyncio.get_running_loop().call_later(self.delay_s, lambda: asyncio.ensure_future(self._ws.send(data)))
        else:
            await self._ws.send(data)

    async def verdict(self, round_id: int) -> VerdictFrame:
        while True:
            frame = await self._next()
            if isinstance(frame, VerdictFrame) and frame.round == round_id:
                return frame
            # a verdict for an older round (abandoned) is ignored, never applied twice

    def arrival(self, round_id: int) -> float:
        """perf_counter() time at which the verdict of ``round_id`` was received."""
        return self._arrivals.pop(round_id, time.perf_counter())

    async def close(self) -> None:
        if self._ws is not None:
            try:
                await self._ws.send(encode(Bye()))
            except websockets.ConnectionClosed:
                pass
            await self._ws.close()
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)
