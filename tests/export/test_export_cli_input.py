"""``rapid export`` refuses bad input in one line, ``rapid export: error: ...``, exit 2, before any
model loads (every case names a model that does not exist: without the check it fails later, on it)."""

from __future__ import annotations

import shlex
import subprocess
import sys

import pytest

from rapid.cli import build_parser
from rapid.core.errors import OptionError
from rapid.core.manifest import ManifestError, load_manifest
from rapid.core.trt_support import missing_modules
from rapid.export.export_cli import export_model

PREFIX = "rapid export: error: "


def export(tmp_path, *args):
    """``rapid export --model <missing> ...`` run in ``tmp_path`` (so a stray export lands there)."""
    r = subprocess.run([sys.executable, "-m", "rapid.cli", "export", "--model", str(tmp_path / "no-model"), *args],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    lines = r.stderr.strip().splitlines()
    return r.returncode, lines[-1].split("\r")[-1] if lines else "", lines


@pytest.mark.parametrize("out", ["", "  "])
def test_empty_out_is_refused(tmp_path, out):
    rc, err, lines = export(tmp_path, "--out", out)
    assert (rc, len(lines)) == (2, 1)
    assert err.startswith(PREFIX + "--out ") and "empty" in err
    assert list(tmp_path.iterdir()) == []  # nothing written into the current directory


def test_quant_block_without_quantize_is_refused(tmp_path):
    rc, err, lines = export(tmp_path, "--out", str(tmp_path / "o"), "--quant-block", "64")
    assert (rc, len(lines)) == (2, 1)
    assert err.startswith(PREFIX + "--quant-block needs --quantize")


@pytest.mark.skipif("tensorrt" not in missing_modules(), reason="tensorrt is installed here")
def test_trt_without_tensorrt_is_refused_before_the_export(tmp_path):
    rc, err, lines = export(tmp_path, "--out", str(tmp_path / "o"), "--trt")
    assert (rc, len(lines)) == (2, 1)
    assert err.startswith(PREFIX + "--trt: ") and "pip install tensorrt" in err and "drop --trt" in err
    assert not (tmp_path / "o").exists()


def test_export_failures_carry_the_subcommand_prefix(tmp_path):
    """A model that does not exist: its error is the only line (no progress bar or stage log before it)."""
    rc, err, lines = export(tmp_path, "--out", str(tmp_path / "o"))
    assert rc == 2 and err.startswith(PREFIX) and "no-model" in err
    assert len(lines) == 1, lines


@pytest.mark.parametrize("folder", ["default-draft", "my exports/d"])
def test_missing_export_folder_hint_is_a_valid_command(tmp_path, folder):
    with pytest.raises(ManifestError, match="does not exist") as e:
        load_manifest(tmp_path / folder)
    command = shlex.split(str(e.value).split("`")[1])
    assert command[:2] == ["rapid", "export"]
    args = build_parser().parse_args(command[1:])
    assert (args.cmd, args.out) == ("export", str(tmp_path / folder))


def test_the_model_is_named_as_an_argument_or_by_model():
    """``rapid export MODEL`` (as ``python -m rapid.export.export_cli``) and ``--model MODEL`` (the
    README's form) are one option; neither: default-draft."""
    parser = build_parser()
    for argv in (["export", "some/model", "--out", "o"], ["export", "--model", "some/model", "--out", "o"],
                 ["export", "some/model", "--model", "some/model", "--out", "o"]):
        assert export_model(parser.parse_args(argv)) == "some/model"
    assert export_model(parser.parse_args(["export", "--out", "o"])) == "default-draft"


@pytest.mark.parametrize("argv", [["", "--out", "o"], ["--model", " ", "--out", "o"]])
def test_an_empty_model_is_refused(argv):
    """An empty name is a mistake, not a request for the default model."""
    with pytest.raises(OptionError, match="must be named"):
        export_model(build_parser().parse_args(["export", *argv]))


def test_two_different_models_are_refused(tmp_path):
    rc, err, lines = export(tmp_path, "other-model", "--out", str(tmp_path / "o"))
    assert (rc, len(lines)) == (2, 1)
    assert err.startswith(PREFIX + "the model is named twice")
