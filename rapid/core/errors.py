"""Exception hierarchy shared by all RAPID packages."""

from __future__ import annotations


class RapidError(Exception):
    """Base class of every error RAPID raises on purpose (as opposed to bugs)."""


class ContextFullError(RapidError):
    """The KV cache has no room for the requested entries."""


class OptionError(RapidError, ValueError):
    """An option's value is outside its range; the message names the option and the rule."""


class SessionClosedError(RapidError):
    """A request reached an edge session after ``close()``."""
