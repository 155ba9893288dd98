"""Shared-secret auth on the websocket handshake (HTTP 401 before any model work) and wss://."""

from __future__ import annotations

import asyncio
import socket
import ssl
import sys
import urllib.error
import urllib.request

import pytest
import websockets
from websockets.asyncio.client import connect

from rapid.core.auth import (
    AuthConfigError,
    bearer,
    check_authorization,
    check_authorization_headers,
    client_ssl_context,
    load_token,
    write_self_signed,
)
from rapid.core.procs import free_port, start_listening, stop_server
from rapid.core.sampling import SamplingParams
from rapid.core.wire import Bye, Hello, Ready, Tree, VerdictFrame, decode, encode
from rapid.server.app import VerifierServer, serve_forever
from rapid.server.background import BackgroundServer
from rapid.server.target import reference_decode

TOKEN = "s3cret-token-\u00e9"


@pytest.fixture(scope="module")
def cloud(tiny_pair):
    target, _ = tiny_pair
    server = BackgroundServer(VerifierServer(target, token=TOKEN))
    yield server
    server.close()


def test_check_authorization():
    assert check_authorization(None, None) and check_authorization("junk", None)
    assert check_authorization(f"Bearer {TOKEN}", TOKEN) and check_authorization(f"bearer  {TOKEN} ", TOKEN)
    for bad in (None, "", "Bearer", "Bearer wrong", f"Basic {TOKEN}", TOKEN, f"Bearer {TOKEN}x"):
        assert not check_authorization(bad, TOKEN), bad
    good = f"Bearer {TOKEN}"
    assert check_authorization_headers([good], TOKEN) and check_authorization_headers([good, good], None)
    for bad in ([], [good, good], [good, "Bearer wrong"], ["Bearer wrong"]):
        assert not check_authorization_headers(bad, TOKEN), bad


def test_load_token(tmp_path, monkeypatch):
    monkeypatch.delenv("RAPID_TOKEN", raising=False)
    assert load_token(None) is None
    monkeypatch.setenv("RAPID_TOKEN", " from-env ")
    assert load_token(None) == "from-env"
    f = tmp_path / "tok"
    f.write_text("from-file\n")
    assert load_token(str(f)) == "from-file"
    f.write_text("\n")
    with pytest.raises(Exception, match="empty"):
        load_token(str(f))


def test_a_token_that_cannot_travel_in_a_header_is_one_typed_line(tmp_path, monkeypatch):
    """Random bytes (not UTF-8), a token outside Latin-1 (an HTTP header's charset) or with a
    control character: AuthConfigError naming the source, not a UnicodeDecodeError from the file
    or an encoding error at the first connection. Latin-1 letters pass."""
    monkeypatch.delenv("RAPID_TOKEN", raising=False)
    f = tmp_path / "tok"
    f.write_bytes(bytes(range(128, 256)))
    with pytest.raises(AuthConfigError, match=f"token file {f} is not text: a token is one line of printable Latin-1"):
        load_token(str(f))
    f.write_text("price-\u20ac5\n", encoding="utf-8")
    with pytest.raises(AuthConfigError, match="printable Latin-1"):
        load_token(str(f))
    f.write_text("caf\u00e9\n", encoding="utf-8")
    assert load_token(str(f)) == "caf\u00e9"
    monkeypatch.setenv("RAPID_TOKEN", "tab\there")
    with pytest.raises(AuthConfigError, match="RAPID_TOKEN: a token is one line of printable Latin-1"):
        load_token(None)


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer nope"}, {"Authorization": f"Basic {TOKEN}"}])
def test_wrong_or_missing_token_gets_401_before_any_work(cloud, headers):
    before = dict(cloud.server.stats)

    async def run():
        with pytest.raises(websockets.InvalidStatus) as e:
            async with connect(cloud.url, additional_headers=headers):
                pass
        return e.value.response.status_code

    assert asyncio.run(run()) == 401
    assert cloud.server.stats["connections"] == before["connections"]  # the handler never ran
    assert len(cloud.server.sessions) == 0


def raw_upgrade(url: str, header_lines: list[str]) -> bytes:
    """Send a websocket upgrade request by hand (any headers, repeated ones too); the status line."""
    host, port = url.removeprefix("ws://").split(":")
    request = "\r\n".join(["GET / HTTP/1.1", f"Host: {host}:{port}", "Upgrade: websocket", "Connection: Upgrade",
                            "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Version: 13",
                            *header_lines, "", ""])
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(request.encode("latin-1"))  # as websockets reads and writes headers
        return sock.recv(4096).split(b"\r\n", 1)[0]


@pytest.mark.parametrize("second", [f"Bearer {TOKEN}", "Bearer wrong"])
def test_two_authorization_headers_get_401_and_are_counted(cloud, second):
    before = cloud.server.metrics.auth_failures._value.get()
    status = raw_upgrade(cloud.url, [f"Authorization: Bearer {TOKEN}", f"Authorization: {second}"])
    assert status == b"HTTP/1.1 401 Unauthorized"
    assert cloud.server.metrics.auth_failures._value.get() == before + 1
    assert raw_upgrade(cloud.url, [f"Authorization: Bearer {TOKEN}"]) == b"HTTP/1.1 101 Switching Protocols"


def test_right_token_decodes(cloud, tiny_pair):
    target, _ = tiny_pair

    async def run():
        async with connect(cloud.url, additional_headers=bearer(TOKEN)) as ws:
            await ws.send(encode(Hello([5, 6, 7])))
            assert isinstance(decode(await ws.recv()), Ready)
            out = []
            for r in range(4):
                await ws.send(encode(Tree(r, [], [])))
                v = decode(await ws.recv())
                assert isinstance(v, VerdictFrame)
                out.append(v.bonus)
            return out

    assert asyncio.run(run()) == reference_decode(target, [5, 6, 7], 4, SamplingParams())


def test_health_is_open_metrics_need_the_token(cloud):
    http = cloud.url.replace("ws://", "http://")
    assert urllib.request.urlopen(f"{http}/health", timeout=5).read() == b"ok\n"
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(f"{http}/metrics", timeout=5)
    assert e.value.code == 401
    req = urllib.request.Request(f"{http}/metrics", headers=bearer(TOKEN))
    text = urllib.request.urlopen(req, timeout=5).read().decode()
    assert "rapid_auth_failures_total" in text and "rapid_spec_decode_num_accepted_tokens_total" in text


def _self_signed(tmp_path):
    pytest.importorskip("cryptography.x509")
    return write_self_signed(tmp_path)


def test_tls_and_token_end_to_end(tmp_path, tiny_pair):
    """wss:// with a self-signed certificate: the edge link decodes exactly; a client that does
    not trust the certificate cannot connect."""
    from rapid.core.auth import server_ssl_context
    from rapid.engines.torch_engine import TorchEngine
    from rapid.runtime.coordinator import Coordinator, CoordinatorConfig
    from rapid.runtime.drafter import Drafter
    from rapid.runtime.link import CloudError, CloudLink
    from rapid.runtime.policies import POLICIES
    from rapid.runtime.tree import TreeParams
    from rapid.tiny import EOS_ID

    target, drafts = tiny_pair
    cert, key = _self_signed(tmp_path)
    server = VerifierServer(target, token=TOKEN)

    async def run():
        stop, ready = asyncio.Event(), asyncio.Event()
        task = asyncio.create_task(serve_forever(server, "127.0.0.1", 0, ready, stop, ssl=server_ssl_context(cert, key)))
        await ready.wait()
        url = f"wss://127.0.0.1:{server.port}"
        try:
            link = CloudLink(url, token=TOKEN, ssl=client_ssl_context(url, cert))
            drafter = Drafter(TorchEngine(drafts["partial"], capacity=512), TreeParams(3, 6, 2, 2), (EOS_ID,))
            gen = await Coordinator(drafter, link, POLICIES["rapid"], CoordinatorConfig(depth=3)).generate(
                [1, 2, 3], 12, SamplingParams())
            untrusted = CloudLink(url, token=TOKEN, ssl=ssl.create_default_context())
            with pytest.raises(CloudError):
                await untrusted.open(Hello([1]))
            wrong = CloudLink(url, token="wrong", ssl=client_ssl_context(url, cert))
            with pytest.raises(CloudError) as e:
                await wrong.open(Hello([1]))
            assert e.value.code == "unauthorized"
            return gen.tokens
        finally:
            stop.set()
            await task

    assert asyncio.run(run()) == reference_decode(target, [1, 2, 3], 12, SamplingParams(), (EOS_ID,))


@pytest.mark.slow
def test_verbose_serve_never_logs_the_token(tiny_dir, tmp_path):
    """``rapid -v serve`` (root logger at DEBUG) with a token: an authenticated client decodes, a
    wrong token and a missing one get 401, /metrics is read; the whole log never shows either
    token, and it does record the refusals."""
    token, wrong = "log-secret-Zq8x31", "wrong-secret-Pw0c77"
    (tmp_path / "token").write_text(token + "\n")
    port = free_port()
    log_path = tmp_path / "serve.log"
    cmd = [sys.executable, "-m", "rapid.cli", "-v", "serve", "--target", tiny_dir("target", seed=0, dtype="float64"),
           "--dtype", "float64", "--port", str(port), "--token-file", str(tmp_path / "token")]
    proc = start_listening(cmd, "127.0.0.1", port, timeout=120, log_path=log_path)
    url = f"ws://127.0.0.1:{port}"

    async def clients():
        async with connect(f"{url}/?token={token}", additional_headers=bearer(token)) as ws:
            await ws.send(encode(Hello([5, 6, 7])))
            assert isinstance(decode(await ws.recv()), Ready)
            await ws.send(encode(Tree(0, [], [])))
            assert isinstance(decode(await ws.recv()), VerdictFrame)
            await ws.send(encode(Bye()))
        for headers in (bearer(wrong), {}):
            with pytest.raises(websockets.InvalidStatus) as e:
                async with connect(url, additional_headers=headers):
                    pass
            assert e.value.response.status_code == 401

    try:
        asyncio.run(clients())
        req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers=bearer(token))
        assert "rapid_auth_failures_total 2.0" in urllib.request.urlopen(req, timeout=5).read().decode()
    finally:
        stop_server(proc)
    text = log_path.read_text()
    assert "Using selector" in text  # asyncio's DEBUG line: -v really was in effect
    assert token not in text and wrong not in text
    assert text.count("missing or wrong bearer token (HTTP 401)") == 2 and "session" in text
