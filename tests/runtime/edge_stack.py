"""The edge daemon stack the API tests share: a real verifier on loopback, ``rapid edge``'s
FastAPI app under uvicorn in a thread, and the official ``openai`` client pointed at it."""

from __future__ import annotations

import threading
import time

import openai
import uvicorn

from rapid.core.procs import free_port
from rapid.core.sampling import SamplingParams
from rapid.runtime.engine_pool import EdgeService
from rapid.runtime.generate import open_edge_model
from rapid.runtime.openai_api import create_app
from rapid.runtime.openai_schema import RequestDefaults
from rapid.runtime.tree import TreeParams
from rapid.server.app import VerifierServer
from rapid.server.background import BackgroundServer
from rapid.server.target import reference_decode

TOKEN = "edge-test-token"


class Daemon:
    def __init__(self, service: EdgeService, defaults: RequestDefaults | None = None, api_key: str | None = None) -> None:
        self.port = free_port()
        # keep-alive past any pause between a module's tests: with uvicorn's 5 s, a client with
        # max_retries=0 could send on a connection the server was closing ("Server disconnected
        # without sending a response": seen once in a full run under the AVX2 kernels)
        self.server = uvicorn.Server(uvicorn.Config(create_app(service, defaults, api_key), host="127.0.0.1", port=self.port,
                                                    log_level="warning", timeout_keep_alive=300))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        t0 = time.time()
        while not self.server.started:
            assert time.time() - t0 < 20, "daemon did not start"
            time.sleep(0.05)
        self.base = f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


def make_stack(tiny_pair, tiny_dir):
    """Yields (target, tokenizer, cloud, daemon, openai client); model name "tiny"."""
    target, _ = tiny_pair
    folder = tiny_dir("target", seed=0, dtype="float64")
    cloud = BackgroundServer(VerifierServer(target, token=TOKEN))
    edges = [open_edge_model(folder, "torch", 1024) for _ in range(2)]
    service = EdgeService(edges, cloud.url, token=TOKEN, tree=TreeParams(3, 8, 2, 2), model_name="tiny")
    daemon = Daemon(service)
    client = openai.OpenAI(base_url=f"{daemon.base}/v1", api_key="unused", max_retries=0, timeout=60)
    yield target, edges[0].tokenizer, cloud, daemon, client
    daemon.close()
    cloud.close()


def expected_text(target, tok, ids, max_tokens, sampling=None):
    out = reference_decode(target, ids, max_tokens, sampling or SamplingParams(), (256,))
    return tok.decode(out, skip_special_tokens=True), out


