"""Exception hierarchy shared by all RAPID packages."""

from __future__ import annotations


class RapidError(Exception):
    """Base class of every error RAPID raises on purpose (as opposed to bugs)."""


class ContextFullError(RapidError):
    """The KV cache has no room for the requested entries."""
