"""Helpers of scripts/edge_check.sh (the torch-free edge install, checked end to end).

    python scripts/edge_check.py prepare DIR        (main .venv, has torch) tiny float64 target,
        tiny perturbed draft exported to ONNX in DIR/export, and DIR/expected.txt: the text the
        target alone decodes for PROMPT (what the edge must reproduce exactly)
    python scripts/edge_check.py ask URL            (edge venv) one /v1/completions request to
        a running ``rapid edge``; prints the completion text
"""

from __future__ import annotations

import json
import sys
import time
import urllib.request
from pathlib import Path

PROMPT = "def add(a, b):"
MAX_TOKENS = 16


def prepare(out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rapid.core.sampling import SamplingParams
    from rapid.export.onnx_export import export_onnx
    from rapid.modeling import Decoder
    from rapid.server.target import reference_decode
    from rapid.tiny import EOS_ID, build_tiny

    target = build_tiny(out / "target", seed=0, dtype="float64")
    draft = build_tiny(out / "draft", seed=1, base_seed=0, perturb=0.05)
    export_onnx(str(draft), out / "export", max_context=256, max_tree=16, progress=False)
    tok = AutoTokenizer.from_pretrained(target)
    model = Decoder.from_hf(AutoModelForCausalLM.from_pretrained(target, dtype=torch.float64))
    with torch.inference_mode():
        ref = reference_decode(model, tok(PROMPT)["input_ids"], MAX_TOKENS, SamplingParams(), (EOS_ID,))
    (out / "expected.txt").write_text(tok.decode(ref, skip_special_tokens=True))


def ask(url: str, timeout: float = 60.0) -> str:
    deadline = time.monotonic() + timeout
    while True:  # wait for /health
        try:
            urllib.request.urlopen(f"{url}/health", timeout=2).read()
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)
    served = json.loads(urllib.request.urlopen(f"{url}/v1/models", timeout=5).read())["data"][0]["id"]
    body = json.dumps({"model": served, "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0}).encode()
    req = urllib.request.Request(f"{url}/v1/completions", body, {"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(req, timeout=timeout).read())["choices"][0]["text"]


if __name__ == "__main__":
    if sys.argv[1] == "prepare":
        prepare(Path(sys.argv[2]))
    elif sys.argv[1] == "ask":
        sys.stdout.write(ask(sys.argv[2]))
    else:
        raise SystemExit(f"unknown command {sys.argv[1]!r}")
