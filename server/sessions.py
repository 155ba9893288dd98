"""The cloud's session table: admission limits, ids, resume grace, idle reaping (no model work).

A session outlives its connection: when a connection drops without ``Bye`` the session is
*detached* and kept for ``grace_s`` so the edge can reconnect and resume it (``Hello.session``).
Detached sessions are freed when the grace period ends, or earlier when a new session needs the
room. An attached session that sends nothing for ``idle_timeout_s`` is freed too, and the server
closes its connection with an error frame (``reap`` returns the owner for that).

Each entry remembers its recent verdicts by round id, so a tree re-sent after a lost verdict is
answered with the stored verdict instead of being verified (applied) a second time.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from rapid.server.serve_config import Limits
from rapid.server.target import TargetSession

VERDICT_MEMORY = 8  # rounds remembered per session


@dataclass(slots=True)
class Entry:
    sid: str
    session: TargetSession
    owner: Any = None  # the connection that currently drives it (None: detached)
    last_active: float = field(default_factory=time.monotonic)
    detached_at: float | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # one verification at a time
    verdicts: OrderedDict = field(default_factory=OrderedDict)  # round -> (tokens, parents, VerdictFrame)

    def remember(self, round_id: int, tokens, parents, frame) -> None:
        self.verdicts[round_id] = (list(tokens), list(parents), frame)
        while len(self.verdicts) > VERDICT_MEMORY:
            self.verdicts.popitem(last=False)


class SessionTable:
    def __init__(self, limits: Limits, clock=time.monotonic, id_prefix: str = "") -> None:
        self.limits = limits
        self.clock = clock
        self.id_prefix = id_prefix  # e.g. a Ray Serve replica id: ids then say where a session lives
        self._entries: dict[str, Entry] = {}

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def detached(self) -> int:
        return sum(1 for e in self._entries.values() if e.owner is None)

    @property
    def full(self) -> bool:
        """No room, even after evicting sessions that wait for a resume."""
        return len(self._entries) >= self.limits.max_sessions and not self.detached

    def make_room(self) -> bool:
        """Evict the oldest detached session if the table is full; True if there is room."""
        if len(self._entries) < self.limits.max_sessions:
            return True
        idle = [e for e in self._entries.values() if e.owner is None]
        if not idle:
            return False
        oldest = min(idle, key=lambda e: e.detached_at or 0.0)
        self._entries.pop(oldest.sid, None)
        return True

    def add(self, session: TargetSession, owner: Any = None) -> str:
        sid = self.id_prefix + secrets.token_hex(8)
        self._entries[sid] = Entry(sid, session, owner, last_active=self.clock())
        return sid

    def entry(self, sid: str | None) -> Entry | None:
        return self._entries.get(sid) if sid else None

    def get(self, sid: str | None) -> TargetSession | None:
        e = self.entry(sid)
        return e.session if e else None

    def attach(self, sid: str, owner: Any) -> Entry | None:
        e = self._entries.get(sid)
        if e is not None:
            e.owner, e.detached_at, e.last_active = owner, None, self.clock()
        return e

    def detach(self, sid: str | None, owner: Any) -> None:
        """The connection ``owner`` went away without Bye: keep the session for the grace period."""
        e = self.entry(sid)
        if e is not None and e.owner is owner:
            if self.limits.grace_s <= 0:
                self._entries.pop(e.sid, None)
            else:
                e.owner, e.detached_at = None, self.clock()

    def drop(self, sid: str | None, owner: Any = None) -> None:
        e = self.entry(sid)
        if e is not None and (owner is None or e.owner is owner):
            self._entries.pop(e.sid, None)

    def reap(self) -> list[tuple[str, str, Any]]:
        """Free sessions past their grace period or idle timeout; return [(sid, why, owner)]
        (owner: the connection an idle session was attached to, None for an expired detached one)."""
        now, out = self.clock(), []
        for e in list(self._entries.values()):
            if e.owner is None and e.detached_at is not None and now - e.detached_at >= self.limits.grace_s:
                out.append((e.sid, "grace", None))
            elif e.owner is not None and now - e.last_active >= self.limits.idle_timeout_s and not e.lock.locked():
                out.append((e.sid, "idle", e.owner))
        for sid, _, _ in out:
            self._entries.pop(sid, None)
        return out
