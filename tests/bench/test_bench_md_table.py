"""The bench reports' markdown tables (``rapid.bench.md_table``)."""

from __future__ import annotations

import pytest

from rapid.bench.md_table import TableShapeError, cell, md_table


def test_header_separator_and_one_line_per_row():
    assert md_table(["set", "tok/s", ""], [["c4", 1.5, "met"], ("oasst", "-", "")]) == [
        "| set | tok/s |  |", "|---|---|---|", "| c4 | 1.5 | met |", "| oasst | - |  |"]
    assert md_table(["a"], iter([])) == ["| a |", "|---|"]


def test_cell_formats_and_marks_missing_values():
    assert cell(0.456, ".2f") == "0.46" and cell(12, "") == "12" and cell(None, ".2f") == "-"


def test_a_row_of_another_width_is_refused():
    with pytest.raises(TableShapeError, match="2 cells under a header of 3"):
        md_table(["a", "b", "c"], [[1, 2]])
