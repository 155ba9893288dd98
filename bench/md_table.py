"""Markdown tables for the bench reports: a header line, a separator, one line per row."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


class TableShapeError(ValueError):
    """A row's cell count differs from the header's."""


def cell(value: object, fmt: str = "") -> str:
    """``value`` formatted with ``fmt`` (``format(value, fmt)``); "-" for None."""
    return "-" if value is None else format(value, fmt)


def md_table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> list[str]:
    """The table's lines: ``| h1 | h2 |``, ``|---|---|``, then ``| c1 | c2 |`` per row, each cell
    ``str()``-ed (format numbers before, e.g. with ``cell``)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [str(c) for c in row]
        if len(cells) != len(header):
            raise TableShapeError(f"a row of {len(cells)} cells under a header of {len(header)}: {cells}")
        lines.append("| " + " | ".join(cells) + " |")
    return lines
