"""``lint-imports`` for RAPID's layout: the layer contracts in pyproject.toml, checked by import-linter.

The card's folders (``export/ engines/ runtime/ server/ bench/``) are installed as ``rapid.<folder>``
through pyproject's ``package-dir``, so they are not directories under ``rapid/``. grimp (the
graph builder under import-linter) refuses a root package whose parent is a regular package
("not a top-level module"). This runs import-linter unchanged, except that such a subpackage may be a
root package: its directory comes from its own import spec, and its modules keep their
``rapid.<folder>.…`` names. Usage: ``.venv/bin/python scripts/lint_imports.py`` (exit 0: every
contract kept).
"""

from __future__ import annotations

import importlib.util
import sys

from grimp.adaptors.packagefinder import ImportLibPackageFinder
from grimp.application.config import settings
from importlinter.cli import lint_imports


class CardFolderFinder(ImportLibPackageFinder):
    """Finds ``rapid.runtime`` at ``runtime/`` (its spec), where grimp would refuse it."""

    def determine_package_directories(self, package_name, file_system):  # noqa: ANN001
        spec = importlib.util.find_spec(package_name)
        if spec is not None and "." in package_name and spec.submodule_search_locations:
            return set(spec.submodule_search_locations)
        return super().determine_package_directories(package_name, file_system)


def main() -> int:
    settings.configure(PACKAGE_FINDER=CardFolderFinder())
    return lint_imports(config_filename="pyproject.toml", no_cache=True, no_logo=True)


if __name__ == "__main__":
    sys.exit(main())
