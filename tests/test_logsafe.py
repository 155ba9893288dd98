"""rapid.core.logsafe: no secret reaches a log line, whatever shape the library logging it uses."""

from __future__ import annotations

import io
import logging

import pytest

from rapid.core import logsafe
from rapid.core.auth import load_token

SECRET = "tok-\u00e9-0123456789"


@pytest.fixture()
def captured():
    """A private logger whose one handler carries the filter (as the CLI's root handlers do)."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    root = logging.getLogger("logsafe-test")
    root.handlers, root.propagate = [handler], False
    root.setLevel(logging.DEBUG)
    logsafe.install(root)
    yield root, stream
    root.handlers = []


@pytest.mark.parametrize(("fmt", "args"), [
    ("< %s: %s", ("Authorization", f"Bearer {SECRET}")),  # websockets' header dump
    ("> %s: %s", ("authorization", f"bearer  {SECRET} and more")),
    ("headers %r", ([("Authorization", f"Basic {SECRET}")],)),
    ("GET %s", (f"/metrics?token={SECRET}&x=1",)),
    ("GET %s", (f"/v1/models?access_token={SECRET}",)),
    ("sent Bearer %s to the cloud", (SECRET,)),
])
def test_credential_shapes_are_redacted(captured, fmt, args):
    logger, stream = captured
    logger.debug(fmt, *args)
    out = stream.getvalue()
    assert SECRET not in out and logsafe.REDACTED in out


def test_a_registered_secret_is_redacted_anywhere_even_in_a_traceback(captured, monkeypatch):
    logger, stream = captured
    monkeypatch.setenv("RAPID_TOKEN", SECRET)
    assert load_token(None) == SECRET  # load_token registers what it loads
    latin1 = SECRET.encode().decode("latin-1")  # how an HTTP header of it reads
    try:
        raise ValueError(f"bad header value {SECRET!r} / {latin1}")
    except ValueError:
        logger.exception("handshake of %s failed", SECRET)
    out = stream.getvalue()
    assert SECRET not in out and latin1 not in out
    assert "ValueError" in out and "handshake of [redacted] failed" in out


def test_other_text_is_left_alone_and_short_secrets_are_not_registered(captured):
    logger, stream = captured
    logsafe.register_secret("ab")
    logger.info("session %s: prompt of %d tokens (about 'ab')", "abc123", 12)
    logger.warning("refused /: missing or wrong bearer token (HTTP 401)")
    assert stream.getvalue() == ("logsafe-test: session abc123: prompt of 12 tokens (about 'ab')\n"
                                 "logsafe-test: refused /: missing or wrong bearer token (HTTP 401)\n")


def test_install_holds_websockets_at_info_and_filters_uvicorn():
    ws = logging.getLogger("websockets")
    saved = ws.level
    try:
        ws.setLevel(logging.DEBUG)
        logsafe.install(logging.getLogger("logsafe-empty"))
        assert ws.level == logging.INFO and not logging.getLogger("websockets.server").isEnabledFor(logging.DEBUG)
        assert logsafe.FILTER in logging.getLogger("uvicorn.access").filters
    finally:
        ws.setLevel(saved)
