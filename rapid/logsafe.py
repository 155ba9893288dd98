"""Keep secrets out of the logs, at every level.

Two layers, both installed by ``setup_logging`` (the CLI's logging set-up):

- the websockets library's loggers stay at INFO even under ``rapid -v``: at DEBUG they print
  every HTTP header of every handshake (``Authorization: Bearer …``) and every frame;
- ``RedactSecrets``, a ``logging.Filter`` on the root handlers and on uvicorn's loggers (which have
  handlers of their own), rewrites any record before it is written: the value of an
  ``Authorization`` header, a ``Bearer`` credential, a ``token=`` / ``access_token=`` /
  ``api_key=`` query parameter, and every secret passed to ``register_secret`` (``rapid.auth``
  registers the token it loads) become ``[redacted]`` — in the message and in a traceback.

Standard library only (the torch-free core).
"""

from __future__ import annotations

import logging
import re
import sys

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


def setup_logging(verbose: bool = False) -> None:
    """The CLI's logging: timestamped lines on stderr, DEBUG with ``-v``, secrets redacted."""
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S", stream=sys.stderr)
    install()
