"""rapid.core.manifest: the export folder's contract (names, I/O spec, atomic write, strict load)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rapid.core import manifest as m


def valid(**over) -> dict:
    data = {"format": m.FORMAT, "format_version": m.FORMAT_VERSION, "present_kv": m.PRESENT_KV_CONVENTION,
            "model": "tiny", "dtype": "fp32", "max_context": 128, "max_tree": 16,
            "io": m.io_spec(2, 2, 16, 300, "fp32"), "architecture": {"layers": 2, "kv_heads": 2, "head_dim": 16},
            "files": {"onnx": m.ONNX_FILE}}
    data.update(over)
    return data


def test_names_and_io_spec_agree():
    assert m.input_names(2) == ["input_ids", "position_ids", "attn_mask",
                                "past_key_0", "past_value_0", "past_key_1", "past_value_1"]
    assert m.output_names(1) == ["logits", "present_key_0", "present_value_0"]
    spec = m.io_spec(3, 2, 16, 300, "fp16")
    assert [i["name"] for i in spec["inputs"]] == m.input_names(3)
    assert [o["name"] for o in spec["outputs"]] == m.output_names(3)
    assert spec["outputs"][0] == {"name": "logits", "shape": [1, "T", 300], "dtype": "float16"}
    assert spec["inputs"][3]["shape"] == [1, 2, "P", 16] and spec["outputs"][1]["shape"] == [1, 2, "T", 16]


def test_numpy_dtype():
    assert m.numpy_dtype({"dtype": "fp16"}) is np.float16
    assert m.numpy_dtype({"dtype": "fp32"}) is np.float32


def test_write_then_load_round_trips(tmp_path):
    assert not m.is_export_dir(tmp_path)
    path = m.write_manifest(tmp_path, valid())
    assert path == tmp_path / m.MANIFEST_FILE and m.is_export_dir(tmp_path)
    assert m.load_manifest(tmp_path) == valid()
    assert oct(path.stat().st_mode & 0o777) == "0o644"
    assert [p.name for p in tmp_path.iterdir()] == [m.MANIFEST_FILE]  # no temporary left behind


@pytest.mark.parametrize("data,needle", [
    (valid(format="other"), "is not a rapid-draft-export manifest"),
    (valid(format_version=m.FORMAT_VERSION + 1), "upgrade RAPID"),
    (valid(present_kv="past+new"), "present-KV convention"),
    ({k: v for k, v in valid().items() if k != "max_tree"}, "lacks the field 'max_tree'"),
    ({k: v for k, v in valid().items() if k != "architecture"}, "lacks the field 'architecture'"),  # engines read it
    ([valid()], "is not a JSON object"),  # was an AttributeError
])
def test_load_rejects_incompatible_manifests(tmp_path, data, needle):
    (tmp_path / m.MANIFEST_FILE).write_text(json.dumps(data))
    with pytest.raises(m.ManifestError, match=needle):
        m.load_manifest(tmp_path)


def test_load_rejects_missing_and_unreadable(tmp_path):
    with pytest.raises(m.ManifestError, match="does not exist"):
        m.load_manifest(tmp_path / "nope")
    with pytest.raises(m.ManifestError, match="not a RAPID export folder"):
        m.load_manifest(tmp_path)
    (tmp_path / m.MANIFEST_FILE).write_text("{not json")
    with pytest.raises(m.ManifestError, match="cannot read"):
        m.load_manifest(tmp_path)
