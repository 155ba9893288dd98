"""``rapid sim`` refuses bad traces and bad options with one line, ``rapid sim: error: ...``, exit
status 2, before it simulates anything (and before it makes the output folder)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from rapid.bench.gpu_profile import load_gpu_profile
from rapid.cli import main
from rapid.core.errors import OptionError


def _sim(capsys, *argv: str) -> tuple[int, str]:
    rc = main(["sim", *argv])
    return rc, capsys.readouterr().err


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rapid sim: error: "), err
    return lines[0]


def _edit_line(path, n: int, edit) -> None:
    """Replace line ``n`` (1-based) of a JSON-lines file by ``edit(record)`` (a string: the raw line)."""
    lines = path.read_text().splitlines()
    new = edit(json.loads(lines[n - 1]))
    lines[n - 1] = new if isinstance(new, str) else json.dumps(new)
    path.write_text("\n".join(lines) + "\n")


def _drop(key: str):
    return lambda r: {k: v for k, v in r.items() if k != key}


# (file, how it is broken, what the error says besides the file's name)
BROKEN = {
    "rounds_not_json": ("rounds.jsonl", lambda f: _edit_line(f, 2, lambda r: "garbage"), "line 2: not JSON"),
    "runs_not_json": ("runs.jsonl", lambda f: _edit_line(f, 3, lambda r: "{"), "line 3: not JSON"),
    "runs_line_a_list": ("runs.jsonl", lambda f: _edit_line(f, 1, lambda r: [1, 2]),
                         "line 1: a record must be a JSON object, got an array"),
    "runs_without_policy": ("runs.jsonl", lambda f: _edit_line(f, 2, _drop("policy")),
                            "line 2: the record has no 'policy' field"),
    "rounds_draft_s_null": ("rounds.jsonl", lambda f: _edit_line(f, 1, lambda r: r | {"draft_s": None}),
                            "line 1: 'draft_s' must be a number, got null"),
    "rounds_load_text": ("rounds.jsonl", lambda f: _edit_line(f, 4, lambda r: r | {"load": "high"}),
                         "line 4: 'load' must be a number, got a string"),
    "rounds_set_a_number": ("rounds.jsonl", lambda f: _edit_line(f, 3, lambda r: r | {"set": 4}),
                            "line 3: 'set' must be text, got a number"),
    "rounds_binary": ("rounds.jsonl", lambda f: f.write_bytes(b"\x00\xcb\xff\xfe\n" * 10), "line 1: not UTF-8"),
    "meta_not_json": ("meta.json", lambda f: f.write_text("{\n"), "not JSON"),
    "meta_a_list": ("meta.json", lambda f: f.write_text("[1, 2]"), "must hold a JSON object, got an array"),
    "rounds_empty": ("rounds.jsonl", lambda f: f.write_text(""), "no rounds in"),
    "runs_blank": ("runs.jsonl", lambda f: f.write_text("\n\n"), "no runs in"),
    "runs_a_folder": ("runs.jsonl", lambda f: (f.unlink(), f.mkdir()), "no runs.jsonl file there"),
    "rounds_missing": ("rounds.jsonl", lambda f: f.unlink(), "no rounds.jsonl file there"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_malformed_traces_are_one_line_naming_the_file(canned, tmp_path, capsys, case):
    name, breaks, says = BROKEN[case]
    breaks(canned / name)
    rc, err = _sim(capsys, "--traces", str(canned), "--out", str(tmp_path / "sim"))
    line = _one_line(err)
    assert rc == 2 and says in line and str(canned) in line, line
    assert not (tmp_path / "sim").exists()  # refused before the output folder is made


def test_two_generations_under_one_key_are_refused(canned, tmp_path, capsys):
    """A bench that listed a schedule twice (``--contention burst:4:4,none,burst:4:4``, refused by
    the bench since) wrote two generations under one key: the replay would interleave their
    rounds, so the sim names the key instead of simulating garbage."""
    lines = (canned / "rounds.jsonl").read_text().splitlines()
    (canned / "rounds.jsonl").write_text("\n".join(lines + lines[:3]) + "\n")  # fixed's first rounds again
    rc, err = _sim(capsys, "--traces", str(canned), "--out", str(tmp_path / "sim"))
    line = _one_line(err)
    assert rc == 2 and "two generations share the key ('wan', 'none', 'c4', '0', 0, 'fixed')" in line, line


def test_a_malformed_trace_through_the_real_command(canned, tmp_path):
    _edit_line(canned / "rounds.jsonl", 5, lambda r: r | {"draft_s": None})
    r = subprocess.run([sys.executable, "-m", "rapid.cli", "sim", "--traces", str(canned), "--out",
                        str(tmp_path / "sim")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [
        f"rapid sim: error: {canned / 'rounds.jsonl'} line 5: 'draft_s' must be a number, got null"]


def _gpu(tmp_path, text: str) -> str:
    f = tmp_path / "gpu.json"
    f.write_text(text)
    return str(f)


# (extra arguments, with {tmp} the test's folder; what the error says)
BAD_OPTIONS = {
    "preset_unknown": (["--preset", "bogus"], "--preset: unknown sim preset 'bogus'"),
    "preset_empty": (["--preset", ","], "--preset wants all or a comma list"),
    "policies_empty": (["--policies", ","], "--policies wants a comma list of names, got ','"),
    "policies_blank": (["--policies", ""], "--policies wants a comma list of names"),
    "contention_empty": (["--contention", " , "], "--contention wants a comma list of names"),
    "profiles_empty": (["--profiles", ","], "--profiles wants a comma list of names"),
    "profile_unknown": (["--profiles", "wan,bogus"], "--profiles: unknown network profile 'bogus'"),
    "tokens_huge": (["--tokens", "100000000"], "--tokens must be <= 8192, got 100000000"),
    "ingress_nan": (["--ingress-ms", "nan", "--replicas", "2"], "--ingress-ms must be a finite number >= 0, got nan"),
    "ingress_inf": (["--ingress-ms", "inf", "--replicas", "2"], "--ingress-ms must be a finite number >= 0, got inf"),
    "traces_missing": (["--traces", "{tmp}/nope"], "--traces {tmp}/nope: no such folder"),
    "traces_empty_folder": (["--traces", "{tmp}/emptydir"], "--traces {tmp}/emptydir: no runs.jsonl file there"),
    "traces_twice": (["--traces", "{canned}/"], "--traces names {canned}/ twice"),  # pooled with itself
    "gpu_missing": (["--gpu-profile", "{tmp}/nope.json"], "--gpu-profile {tmp}/nope.json: cannot read it"),
    "out_is_a_file": (["--out", "{tmp}/afile"], "cannot create the output folder {tmp}/afile"),
}


@pytest.mark.parametrize("case", sorted(BAD_OPTIONS))
def test_bad_sim_options_are_one_line(canned, tmp_path, capsys, case):
    argv, says = BAD_OPTIONS[case]
    (tmp_path / "emptydir").mkdir()
    (tmp_path / "afile").write_text("x")
    argv = [a.replace("{tmp}", str(tmp_path)).replace("{canned}", str(canned)) for a in argv]
    out = [] if "--out" in argv else ["--out", str(tmp_path / "sim")]
    rc, err = _sim(capsys, "--traces", str(canned), *out, *argv)
    line = _one_line(err)
    assert rc == 2 and says.replace("{tmp}", str(tmp_path)).replace("{canned}", str(canned)) in line, line


@pytest.mark.parametrize("text, says", [
    ("nope", "not a JSON file"),
    ("[1, 2]", 'must be a JSON object {"nodes": [...], "seconds": [...]}'),
    ('{"nodes": [1, 8]}', "must be a JSON object"),
    ('{"nodes": [1, 8], "seconds": [0.1]}', "equally long and not empty, got 2 and 1"),
    ('{"nodes": [], "seconds": []}', "equally long and not empty, got 0 and 0"),
    ('{"nodes": [1, null], "seconds": [0.1, 0.2]}', "every 'nodes' value must be a finite number >= 0, got null"),
    ('{"nodes": [1, 8], "seconds": [0.1, NaN]}', "every 'seconds' value must be a finite number > 0, got NaN"),
    ('{"nodes": [1, 8], "seconds": [0.1, 0]}', "every 'seconds' value must be a finite number > 0, got 0"),
])
def test_a_bad_gpu_profile_is_an_option_error(tmp_path, capsys, canned, text, says):
    path = _gpu(tmp_path, text)
    with pytest.raises(OptionError, match="--gpu-profile") as e:
        load_gpu_profile(path)
    assert says in str(e.value)
    rc, err = _sim(capsys, "--traces", str(canned), "--out", str(tmp_path / "sim"), "--gpu-profile", path)
    assert rc == 2 and says in _one_line(err)


def test_a_good_gpu_profile_is_sorted_by_nodes(tmp_path):
    path = _gpu(tmp_path, '{"nodes": [64, 1, 8], "seconds": [0.03, 0.01, 0.02]}')
    assert load_gpu_profile(path) == ([1.0, 8.0, 64.0], [0.01, 0.02, 0.03])
