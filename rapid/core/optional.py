"""Project modules that need an optional dependency, imported where they are first used.

    import_optional("rapid.modeling", "cloud")  → the module, imported now
    torch missing → MissingExtraError: "rapid.modeling needs torch, not installed here:
                    pip install 'rapid-spec[cloud]'"

The edge installs without torch, and ``rapid --help`` must not load the cloud: a torch-free
module that sometimes needs a torch one (``rapid.engines.select`` opening a PyTorch draft, the
exporter, the doctor) loads it through this function instead of an import inside a function.
Everything else imports at the top. The layer contracts see these edges too:
tests/test_layers.py adds every ``import_optional("…")`` call to the graph it checks.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from rapid.core.errors import RapidError


class MissingExtraError(RapidError, ImportError):
    """A part of RAPID needs a package that is not installed (one line: which, and the pip extra)."""


def import_optional(module: str, extra: str) -> ModuleType:
    """``module`` imported; a missing third-party package → :class:`MissingExtraError`."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        missing = (e.name or "").split(".")[0]
        if not missing or missing == "rapid":
            raise
        raise MissingExtraError(f"{module} needs {missing}, not installed here: "
                                f"pip install 'rapid-spec[{extra}]'") from e
