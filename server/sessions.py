"""The cloud's session table: admission limits and ids (no model work here)."""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from rapid.server.target import TargetSession


@dataclass(slots=True, frozen=True)
class Limits:
    max_sessions: int = 16
    max_context: int = 4096  # KV entries per session (prompt + generated + tree)
    max_nodes: int = 64  # tree nodes per verification

    def __post_init__(self) -> None:
        if self.max_sessions < 1 or self.max_context < 8 or self.max_nodes < 1:
            raise ValueError(f"nonsensical limits: {self}")


class SessionTable:
    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self._sessions: dict[str, TargetSession] = {}

    def __len__(self) -> int:
        return len(self._sessions)

    @property
    def full(self) -> bool:
        return len(self._sessions) >= self.limits.max_sessions

    def add(self, session: TargetSession) -> str:
        sid = secrets.token_hex(8)
        self._sessions[sid] = session
        return sid

    def get(self, sid: str) -> TargetSession | None:
        return self._sessions.get(sid)

    def drop(self, sid: str | None) -> None:
        if sid is not None:
            self._sessions.pop(sid, None)
