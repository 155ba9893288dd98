"""Every option of ``rapid serve``, written once (torch-free: the CLI imports it for ``--help``).

    ServeConfig          the flags: ``rapid serve --max-sessions 16 …`` ⇄ ``ServeConfig(max_sessions=16, …)``
      (validated when made: OptionError names the flag and its rule, before anything loads)
      .limits()  → Limits           what the session table admits (validated: ValueError names the rule)
      .verifier() → VerifierSpec    what a verifier loads and serves (a process or a Ray replica)
    add_serve_args(p)    argparse flags made from ServeConfig's fields: name, type, default, help
    ServeConfig.of(ns)   the config from parsed flags (unknown attributes ignored)

The single-process server (``rapid.server.main.run_serve``), the Ray replicas
(``rapid.server.scale_config.VerifierSpec``) and the bench's cloud take their defaults from here.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field, fields
from typing import Any

from rapid.core.device import check_device_name
from rapid.core.errors import OptionError
from rapid.core.precision import DTYPES

CONNECTIONS_PER_SESSION = 4  # default connection cap per session slot (resumes overlap dying connections)
VERIFY_MODES = ("auto", "tree", "sequential")


def _opt(default: Any, help: str | None = None, choices: tuple[str, ...] | None = None) -> Any:  # noqa: A002
    return field(default=default, metadata={"help": help, "choices": choices})


@dataclass(slots=True, frozen=True)
class ServeConfig:
    """``rapid serve``'s options; each field is one flag (``max_sessions`` → ``--max-sessions``)."""

    target: str = _opt("default-target", "HF id, local folder, .gguf, or default-target")
    host: str = _opt("127.0.0.1")
    port: int = _opt(8765)
    threads: int = _opt(1)
    dtype: str = _opt("auto", "auto = bfloat16 where the CPU/GPU computes it natively, else float32", DTYPES)
    verify: str = _opt("auto", "auto = one forward per tree where the kernels are row-invariant, else "
                       "sequential (exact)", VERIFY_MODES)
    device: str = _opt("auto", "auto|cpu|cuda|cuda:N (auto = the first CUDA device, else the CPU)")
    max_sessions: int = _opt(16, "sessions holding target KV; a new one beyond it gets ErrorFrame(full)")
    max_connections: int = _opt(0, "open websocket connections; beyond it the upgrade gets HTTP 503 "
                                f"(0 = {CONNECTIONS_PER_SESSION} x --max-sessions)")
    hello_timeout: float = _opt(10.0, "close a connection that holds no session this many s after connecting")
    max_context: int = _opt(4096, "KV entries per session (prompt + generated + tree)")
    max_nodes: int = _opt(64, "tree nodes per verification")
    token_file: str | None = _opt(None, "shared secret for the websocket handshake (else $RAPID_TOKEN; "
                                  "none = open, dev only)")
    cert: str | None = _opt(None, "TLS certificate (PEM): serve wss://")
    key: str | None = _opt(None, "TLS private key (PEM)")
    batch_window_ms: float = _opt(2.0, "collect trees of several sessions this long")
    max_batch: int = _opt(8, "trees per target forward (1 = no batching)")
    idle_timeout: float = _opt(600.0, "free a silent session's KV after this many s (its connection gets "
                               "ErrorFrame(timeout))")
    grace: float = _opt(30.0, "keep a dropped session's KV this long for a resume")

    def __post_init__(self) -> None:
        """Every flag's range, checked once here: the rules of the session limits are Limits' own
        (one source), re-raised under the flag's name."""
        rules = (("port", 0 <= self.port <= 65535, "in [0, 65535] (0 = any free port)"),
                 ("threads", self.threads >= 1, ">= 1"), ("max_batch", self.max_batch >= 1, ">= 1"),
                 ("batch_window_ms", math.isfinite(self.batch_window_ms) and self.batch_window_ms >= 0, ">= 0"))
        for name, ok, rule in rules:
            if not ok:
                raise OptionError(f"{_flag(name)} must be {rule}, got {getattr(self, name)}")
        check_device_name(self.device)  # the name only: whether it exists is known once torch loads
        try:
            self.limits()
        except LimitError as e:
            raise OptionError(f"{_flag(_LIMIT_FLAGS.get(e.name, e.name))} must be {e.rule}, got {e.value}") from None

    @classmethod
    def of(cls, namespace: argparse.Namespace | dict) -> ServeConfig:
        values = namespace if isinstance(namespace, dict) else vars(namespace)
        return cls(**{f.name: values[f.name] for f in fields(cls) if values.get(f.name) is not None})

    def limits(self) -> Limits:
        return Limits(self.max_sessions, self.max_context, self.max_nodes, self.grace, self.idle_timeout,
                      self.hello_timeout, self.max_connections)

    def verifier(self) -> VerifierSpec:
        return VerifierSpec(self.target, self.limits(), self.threads, self.dtype, self.device, self.verify,
                            self.batch_window_ms, self.max_batch)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


class LimitError(ValueError):
    """A session limit outside its range (``name`` the Limits field, ``rule`` its range)."""

    def __init__(self, name: str, rule: str, value: Any) -> None:
        super().__init__(f"limit {name} must be {rule}, got {value}")
        self.name, self.rule, self.value = name, rule, value


_LIMIT_FLAGS = {"grace_s": "grace", "idle_timeout_s": "idle_timeout", "hello_timeout_s": "hello_timeout"}
_SERVE = {f.name: f.default for f in fields(ServeConfig)}  # the flags' defaults, before DEFAULT can be made


@dataclass(slots=True, frozen=True)
class Limits:
    """What the session table admits; defaults are ``rapid serve``'s."""

    max_sessions: int = _SERVE["max_sessions"]
    max_context: int = _SERVE["max_context"]  # KV entries per session (prompt + generated + tree)
    max_nodes: int = _SERVE["max_nodes"]  # tree nodes per verification
    grace_s: float = _SERVE["grace"]  # a detached session is kept this long for a resume
    idle_timeout_s: float = _SERVE["idle_timeout"]  # an attached session silent this long is freed
    hello_timeout_s: float = _SERVE["hello_timeout"]  # a connection without a session within this long is closed
    max_connections: int = _SERVE["max_connections"]  # open websocket connections (0 = CONNECTIONS_PER_SESSION × max_sessions)

    def __post_init__(self) -> None:
        if self.max_connections == 0:
            object.__setattr__(self, "max_connections", CONNECTIONS_PER_SESSION * self.max_sessions)
        rules = (("max_sessions", self.max_sessions >= 1, ">= 1"), ("max_context", self.max_context >= 8, ">= 8"),
                 ("max_nodes", self.max_nodes >= 1, ">= 1"), ("grace_s", self.grace_s >= 0, ">= 0"),
                 ("idle_timeout_s", self.idle_timeout_s > 0, "> 0"), ("hello_timeout_s", self.hello_timeout_s > 0, "> 0"),
                 ("max_connections", self.max_connections >= 1, ">= 1 (0 = the default)"))
        for name, ok, rule in rules:
            if not ok:
                raise LimitError(name, rule, getattr(self, name))


DEFAULT = ServeConfig()


@dataclass(slots=True, frozen=True)
class VerifierSpec:
    """What a verifier loads and serves: the single-process server and every Ray replica."""

    target: str = DEFAULT.target
    limits: Limits = Limits()
    threads: int = DEFAULT.threads
    dtype: str = DEFAULT.dtype
    device: str = DEFAULT.device
    verify: str = DEFAULT.verify
    batch_window_ms: float = DEFAULT.batch_window_ms
    max_batch: int = DEFAULT.max_batch


def add_serve_args(parser: argparse.ArgumentParser) -> None:
    """One flag per ServeConfig field, its default and help from the field."""
    for f in fields(ServeConfig):
        kind = type(f.default) if f.default is not None else str
        parser.add_argument(f"--{f.name.replace('_', '-')}", type=kind, default=f.default,
                            choices=f.metadata["choices"], help=f.metadata["help"])
