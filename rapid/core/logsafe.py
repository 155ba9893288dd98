"""Keep secrets out of the logs, at every level.

Two layers, both installed by ``setup_logging`` (the CLI's logging set-up):

- the websockets library's loggers stay at INFO even under ``rapid -v``: at DEBUG they print
  every HTTP header of every handshake (``Authorization: Bearer …``) and every frame;
- ``RedactSecrets``, a ``logging.Filter`` on the root handlers and on uvicorn's loggers (which have
  handlers of their own), rewrites any record before it is written: the value of an
  ``Authorization`` header, a ``Bearer`` credential, a ``token=`` / ``access_token=`` /
  ``api_key=`` query parameter, and every secret passed to ``register_secret`` (``rapid.core.auth``
  registers the token it loads) become ``[redacted]`` — in the message and in a traceback.

Standard library only (the torch-free core).
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time

REDACTED = "[redacted]"
MIN_SECRET_CHARS = 6  # shorter registered secrets are left to the patterns (they would mangle text)
QUIET_LOGGERS = ("websockets",)  # header and frame dumps at DEBUG: held at INFO
FILTERED_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access")  # own handlers: filtered at the logger

_PATTERNS = (
    # "Authorization: Bearer x", "('Authorization', 'Bearer x')", "authorization=x": the whole value
    (re.compile(r"(?i)(\b(?:proxy-)?authorization['\"]?\s*[:=,]\s*['\"]?)[^\r\n'\"]*"), r"\1" + REDACTED),
    # "Bearer x" anywhere else; prose ("a bearer token") is left alone
    (re.compile(r"(?i)(\bbearer\s+)(?!(?:tokens?|credentials?|auth\w*|scheme|header)\b)[^\s'\",;]+"),
     r"\1" + REDACTED),
    (re.compile(r"(?i)([?&;](?:token|access_token|api_key|apikey|key|auth|password)=)[^&\s'\"#]*"),
     r"\1" + REDACTED),
)
_secrets: set[str] = set()


def register_secret(secret: str | None) -> None:
    """Redact ``secret`` wherever it appears (also as UTF-8 read as Latin-1, as HTTP headers are)."""
    if not secret or len(secret) < MIN_SECRET_CHARS:
        return
    _secrets.add(secret)
    _secrets.add(secret.encode("utf-8").decode("latin-1"))


def redact(text: str) -> str:
    for secret in sorted(_secrets, key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


class RedactSecrets(logging.Filter):
    """Rewrites a record's message and traceback text with ``redact``; never drops a record."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a broken format string: let the handler report it
            return True
        clean = redact(message)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True


FILTER = RedactSecrets()


def install(root: logging.Logger | None = None) -> RedactSecrets:
    """Put the ``RedactSecrets`` filter on every handler of ``root`` and on uvicorn's loggers; hold
    the websockets loggers at INFO or above. Idempotent."""
    root = root or logging.getLogger()
    for target in (*root.handlers, *map(logging.getLogger, FILTERED_LOGGERS)):
        if FILTER not in target.filters:
            target.addFilter(FILTER)
    for name in QUIET_LOGGERS:
        logger = logging.getLogger(name)
        logger.setLevel(max(logging.INFO, logger.level))
    return FILTER


TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
LOG_FORMATS = ("text", "json")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts (ISO 8601, UTC), level, logger, message (+ exc)."""

    def format(self, record: logging.LogRecord) -> str:
        out = {"ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
               "level": record.levelname, "logger": record.name, "message": record.getMessage()}
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            out["exc"] = record.exc_text
        return json.dumps(out, ensure_ascii=False)


def setup_logging(verbose: bool = False, fmt: str = "text") -> None:
    """The CLI's logging on stderr: date, time, level and logger on every line (``fmt`` = text)
    or JSON lines (``json``); DEBUG with ``-v``; uvicorn's loggers go through the same handler;
    secrets redacted."""
    if fmt not in LOG_FORMATS:
        raise ValueError(f"log format {fmt!r} is not one of {LOG_FORMATS}")
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        formatter: logging.Formatter = JsonFormatter()
        formatter.converter = time.gmtime
    else:
        formatter = logging.Formatter(TEXT_FORMAT, datefmt="%Y-%m-%d %H:%M:%S")
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    for name in FILTERED_LOGGERS:  # uvicorn: one format, the root's handler
        logger = logging.getLogger(name)
        logger.handlers[:] = []
        logger.propagate = True
    install()
