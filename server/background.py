"""A real verifier websocket server on loopback, running in a background thread (tests, scripts)."""

from __future__ import annotations

import asyncio
import threading

from rapid.server.app import VerifierServer, serve_forever


class BackgroundServer:
    def __init__(self, server: VerifierServer, host: str = "127.0.0.1") -> None:
        self.server = server
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        ready = threading.Event()

        async def main() -> None:
            self._stop = asyncio.Event()
            started = asyncio.Event()
            task = asyncio.create_task(serve_forever(server, host, 0, started, self._stop))
            await started.wait()
            ready.set()
            await task

        self._thread = threading.Thread(target=self._loop.run_until_complete, args=(main(),), daemon=True)
        self._thread.start()
        if not ready.wait(30):
            raise RuntimeError("verifier did not start")
        self.url = f"ws://{host}:{server.port}"

    def call(self, fn, timeout: float = 10.0):
        """Run ``fn()`` on the server's event-loop thread (where its session table changes)."""
        async def run():
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)
