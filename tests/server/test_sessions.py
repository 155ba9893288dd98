"""rapid.server.sessions: limits, the session table, grace periods, eviction and reaping."""

from __future__ import annotations

import pytest

from rapid.server.serve_config import CONNECTIONS_PER_SESSION, Limits
from rapid.server.sessions import VERDICT_MEMORY, Entry, SessionTable


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("bad", [dict(max_sessions=0), dict(max_context=4), dict(max_nodes=0),
                                 dict(grace_s=-1.0), dict(idle_timeout_s=0.0), dict(hello_timeout_s=0.0),
                                 dict(max_connections=-1)])
def test_nonsensical_limits_are_refused(bad):
    with pytest.raises(ValueError):
        Limits(**bad)


def test_the_connection_cap_defaults_to_a_multiple_of_the_session_limit():
    assert Limits(max_sessions=3).max_connections == CONNECTIONS_PER_SESSION * 3
    assert Limits(max_sessions=3, max_connections=5).max_connections == 5


def test_add_get_attach_detach_drop():
    clock = Clock()
    table = SessionTable(Limits(max_sessions=2, grace_s=5.0), clock)
    a, b = object(), object()
    sid = table.add("session-1", a)
    assert len(table) == 1 and table.get(sid) == "session-1" and table.get(None) is None
    table.detach(sid, b)  # not the owner: nothing happens
    assert table.entry(sid).owner is a and table.detached == 0
    table.detach(sid, a)
    assert table.entry(sid).owner is None and table.detached == 1 and table.entry(sid).detached_at == 100.0
    assert table.attach(sid, b).owner is b and table.entry(sid).detached_at is None
    table.drop(sid, a)  # not the owner
    assert len(table) == 1
    table.drop(sid)
    assert len(table) == 0 and table.attach(sid, a) is None


def test_without_grace_a_dropped_connection_frees_the_session():
    table = SessionTable(Limits(grace_s=0.0))
    owner = object()
    sid = table.add("s", owner)
    table.detach(sid, owner)
    assert len(table) == 0


def test_make_room_evicts_the_oldest_detached_session():
    clock = Clock()
    table = SessionTable(Limits(max_sessions=2), clock)
    o1, o2 = object(), object()
    s1, s2 = table.add("one", o1), table.add("two", o2)
    assert table.full and not table.make_room()
    table.detach(s2, o2)
    clock.now += 1
    table.detach(s1, o1)
    assert not table.full and table.make_room()
    assert table.get(s2) is None and table.get(s1) == "one"  # s2 was detached first
    assert table.make_room()


def test_reap_grace_and_idle_on_the_tables_clock():
    clock = Clock()
    table = SessionTable(Limits(grace_s=5.0, idle_timeout_s=60.0), clock)
    owner = object()
    idler = object()
    gone, idle = table.add("gone", owner), table.add("idle", idler)
    table.detach(gone, owner)
    clock.now += 4.9
    assert table.reap() == []
    clock.now += 0.2
    assert table.reap() == [(gone, "grace", None)]
    clock.now += 60.0
    assert table.reap() == [(idle, "idle", idler)] and len(table) == 0


def test_entry_remembers_only_the_last_verdicts():
    e = Entry("sid", "session")
    for r in range(VERDICT_MEMORY + 3):
        e.remember(r, [r], [-1], f"frame{r}")
    assert len(e.verdicts) == VERDICT_MEMORY and next(iter(e.verdicts)) == 3
    assert e.verdicts[VERDICT_MEMORY + 2] == ([VERDICT_MEMORY + 2], [-1], f"frame{VERDICT_MEMORY + 2}")
