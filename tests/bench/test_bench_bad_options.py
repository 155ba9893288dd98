"""``rapid bench`` refuses bad options in one line before any model loads: the checks run in
``bench_config`` (what the command builds first), a bad ``--prompts`` file is named, and
``--report-only`` wants a bench output folder."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rapid.bench.cli import bench_config, bench_parser
from rapid.bench.prompts import PromptSetError
from rapid.bench.report import write_report
from rapid.cli import main
from rapid.core.errors import OptionError, RapidError


def _config(out: Path, *argv: str):
    return bench_config(bench_parser().parse_args(list(argv)), out)


@pytest.mark.parametrize("argv, says", [
    (["--temperature", "-1"], "--temperature must be >= 0, got -1.0"),
    (["--temperature", "nan"], "--temperature must be >= 0, got nan"),
    (["--top-p", "0"], "--top-p must be in (0, 1], got 0.0"),
    (["--top-p", "2"], "--top-p must be in (0, 1], got 2.0"),
    (["--top-p", "nan"], "--top-p must be in (0, 1], got nan"),
    (["--seed", "-1"], "--seed must be in [0, 2**63), got -1"),
    (["--policies", ","], "--policies wants a comma list of names, got ','"),
    (["--policies", ""], "--policies wants a comma list of names, got ''"),
    (["--quick", "--sets", " , "], "--sets wants a comma list of names"),
    (["--contention", ","], "--contention wants a comma list of names"),
    (["--profiles", ","], "--profiles wants a comma list of names"),
    # one name twice: its runs would share a record key, and the report and the sim merge them
    (["--contention", "burst:4:4,none,burst:4:4"], "--contention names 'burst:4:4' twice"),
    (["--contention", "sustained,sustained:1"], "--contention names 'sustained' twice"),  # the same schedule
    (["--policies", "fixed,rapid,fixed"], "--policies names 'fixed' twice"),
    (["--sets", "c4,oasst,c4"], "--sets names 'c4' twice"),
    (["--profiles", "wan,wan"], "--profiles names 'wan' twice"),
])
def test_bad_run_options_are_option_errors(tmp_path, argv, says):
    with pytest.raises(OptionError) as e:
        _config(tmp_path / "out", *argv)
    assert says in str(e.value), str(e.value)


def test_good_sampling_and_lists_still_pass(tmp_path):
    cfg = _config(tmp_path / "out", "--temperature", "0.7", "--top-p", "0.9", "--policies", "fixed,,rapid,")
    assert cfg.policies == ["fixed", "rapid"] and (cfg.temperature, cfg.top_p) == (0.7, 0.9)


# (the --prompts file's text, what the error says); "missing": no such file
PROMPT_FILES = {
    "missing": (None, "no such file or folder"),
    "not_json": ("nope", "is not JSON"),
    "an_object": ('{"a": 1}', "a prompt set is a JSON list of [id, prompt] pairs, got an object"),
    "empty_list": ("[]", "got an empty list"),
    "short_pair": ("[[1]]", "item 0 is not an [id, prompt] pair: [1]"),
    "not_pairs": ("[1, 2]", "item 0 is not an [id, prompt] pair: 1"),
    "prompt_not_text": ('[[1, "a"], [2, null]]', "item 1 is not an [id, prompt] pair: [2, null]"),
}


@pytest.mark.parametrize("case", sorted(PROMPT_FILES))
@pytest.mark.parametrize("as_folder", [False, True])
def test_a_bad_prompts_file_is_named(tmp_path, case, as_folder):
    text, says = PROMPT_FILES[case]
    folder = tmp_path / "prompts"
    folder.mkdir()
    f = folder / "c4.json"
    if text is not None:
        f.write_text(text)
    elif as_folder:  # a folder without c4.json: the set is missing from it
        says = "prompt sets ['c4'] not found"
    source = folder if as_folder else f
    with pytest.raises(PromptSetError) as e:
        _config(tmp_path / "out", "--prompts", str(source), "--sets", "c4")
    assert says in str(e.value), str(e.value)
    assert text is None or str(f) in str(e.value)


def test_a_bad_prompts_file_through_the_real_command(tmp_path):
    f = tmp_path / "c4.json"
    f.write_text("[[1]]")
    r = subprocess.run([sys.executable, "-m", "rapid.cli", "bench", "--prompts", str(f), "--sets", "c4",
                        "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [
        f"rapid bench: error: prompt set {f}: item 0 is not an [id, prompt] pair: [1]"]
    assert not (tmp_path / "out").exists()  # refused before the run made its folder


def test_report_only_wants_a_bench_output_folder(tmp_path, capsys):
    for out in (tmp_path / "nope", tmp_path):
        assert main(["bench", "--report-only", "--out", str(out)]) == 2
        assert capsys.readouterr().err.strip() == (f"rapid bench: error: --report-only: no runs.jsonl in {out} "
                                                   "(--out names a rapid bench output folder)")


def test_report_only_names_a_malformed_trace(canned, capsys):
    lines = (canned / "runs.jsonl").read_text().splitlines()
    (canned / "runs.jsonl").write_text("\n".join([lines[0], "[1, 2]", *lines[2:]]) + "\n")
    assert main(["bench", "--report-only", "--out", str(canned)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"rapid bench: error: {canned / 'runs.jsonl'} line 2: a record must be a JSON object, "
                   "got an array")
    with pytest.raises(RapidError):  # the report's own reader, the same check
        write_report(canned, plots=False)
