"""Exception hierarchy shared by all RAPID packages."""

from __future__ import annotations


class RapidError(Exception):
    """Base class of every error RAPID raises on purpose (as opposed to bugs)."""
