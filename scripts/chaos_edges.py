"""The chaos soak's edges: tiny models, a job pool with target-only references, run outcomes.

Every edge is a real ``rapid generate`` process. Its draft folders carry a *lossless* tokenizer:
each of the 259 token ids renders as its own printable character (``ALPHABET``), so the text a
run streams to stdout identifies its tokens one for one and a finished run is checked token for
token against ``reference_decode`` on the same tiny target (the byte-level tokenizer of
``rapid.tiny`` renders different invalid bytes alike as U+FFFD, so text equality would be weaker).

A run ends as exactly one of:

    identical      exit 0, tokens equal target-only decoding, the summary line counts them
    mismatch       exit 0 but other tokens (exactness broken)
    clean_error    exit 2, no traceback, one last line ``rapid generate: error: ...``; classified
                   by its cloud error code (``cloud_deadline``, ``cloud_unreachable``, ...)
    unclean_error  anything else (a traceback, a signal, a multi-line error)
    killed         killed with SIGKILL by the soak (an edge-kill fault)
    hang           still running after the run bound (killed then)
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from pathlib import Path

from rapid.tiny import bytes_to_unicode

EOS = 256
# token id -> the one character it renders as: printable ASCII as itself, every other id a CJK
# ideograph (valid 3-byte UTF-8), so no two ids render alike and no id renders as U+FFFD
ALPHABET = [chr(i) if 33 <= i <= 126 else chr(0x4E00 + i) for i in range(259)]
CHAR_TO_ID = {c: i for i, c in enumerate(ALPHABET)}
PROMPT_CHARS = ALPHABET[33:127]  # what the tokenizer encodes one id per character
POLICIES = ("rapid", "npdg", "fixed", "edgellm", "ar", "ipdg", "caac")
SAMPLINGS = ({"temperature": 0.0, "top_p": 1.0, "top_k": 0},
             {"temperature": 0.9, "top_p": 0.95, "top_k": 0},
             {"temperature": 1.3, "top_p": 1.0, "top_k": 20})
DRAFTS = ("same", "partial", "unrelated")
ERROR_LINE = "rapid generate: error: "


def write_lossless_tokenizer(folder: Path) -> None:
    """Replace ``folder``'s tokenizer by a byte-level one whose decode is injective (``ALPHABET``).

    Token i is the byte-level spelling of ``ALPHABET[i]``'s UTF-8 bytes; every sequence of ids then
    decodes to valid UTF-8, one character per id. (transformers 5 loads a qwen2 folder's tokenizer as
    ``Qwen2Tokenizer`` and imposes its ByteLevel pre-tokenizer and decoder: this vocabulary survives it.)
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    spell = bytes_to_unicode()
    vocab = {"".join(spell[b] for b in c.encode()): i for i, c in enumerate(ALPHABET) if i != EOS}
    vocab["<|endoftext|>"] = EOS
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>",
                            pad_token="<|endoftext|>").save_pretrained(folder)
    loaded = AutoTokenizer.from_pretrained(folder)  # as the edge loads it
    ids = [i for i in range(len(ALPHABET)) if i != EOS]
    if loaded.decode(ids + [EOS], skip_special_tokens=True) != "".join(ALPHABET[i] for i in ids) or \
            list(loaded("".join(PROMPT_CHARS))["input_ids"]) != list(range(33, 127)):
        raise RuntimeError(f"the tokenizer written to {folder} does not render one character per id")


def build_models(root: Path) -> dict[str, str]:
    """The float64 tiny target and three drafts of it (equal, perturbed, unrelated)."""
    from rapid.tiny import build_tiny

    specs = {"target": dict(seed=0), "partial": dict(seed=1, base_seed=0, perturb=0.03),
             "unrelated": dict(seed=7)}
    out = {}
    for name, kw in specs.items():
        folder = build_tiny(root / name, dtype="float64", **kw)
        write_lossless_tokenizer(folder)
        out[name] = str(folder)
    out["same"] = out["target"]
    return out


@dataclass(slots=True)
class Job:
    prompt: str
    max_new: int
    sampling: dict
    seed: int
    expected: list[int] | None = None  # target-only decoding (filled by ``add_references``)


def make_jobs(rng: random.Random, n: int) -> list[Job]:
    jobs = []
    for i in range(n):
        head = rng.choice("abcdefghijklmnopqrstuvwxyz")  # never a leading '-' (argparse)
        body = "".join(rng.choice(PROMPT_CHARS) for _ in range(rng.randint(0, 15)))
        jobs.append(Job(head + body, rng.randint(24, 240), SAMPLINGS[i % len(SAMPLINGS)], rng.randrange(1 << 16)))
    return jobs


def add_references(jobs: list[Job], target_dir: str) -> None:
    """Fill ``expected`` with target-only decoding, prompts encoded by the edge's own tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rapid.core.sampling import SamplingParams
    from rapid.modeling import Decoder
    from rapid.server.target import reference_decode

    tok = AutoTokenizer.from_pretrained(target_dir)
    model = Decoder.from_hf(AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float64))
    with torch.inference_mode():
        for job in jobs:
            ids = list(tok(job.prompt)["input_ids"])
            if ids != [CHAR_TO_ID[c] for c in job.prompt]:
                raise RuntimeError(f"the lossless tokenizer does not encode {job.prompt!r} one id per character")
            params = SamplingParams(seed=job.seed, **job.sampling)
            job.expected = reference_decode(model, ids, job.max_new, params, (EOS,))


@dataclass(slots=True)
class RunSpec:
    index: int
    job: int
    policy: str
    draft: str
    route: str  # "direct" (to the cloud) or "proxy" (through the fault proxy)
    tree: list[str]


def make_run(rng: random.Random, index: int, n_jobs: int) -> RunSpec:
    tree = ["--depth", str(rng.randint(1, 6)), "--topk", str(rng.randint(1, 3)), "--width", str(rng.randint(1, 3)),
            "--budget", rng.choice(["auto", str(rng.randint(2, 24))])]
    return RunSpec(index, rng.randrange(n_jobs), POLICIES[index % len(POLICIES)], rng.choice(DRAFTS),
                   rng.choice(["direct", "proxy"]), tree)


def generate_argv(spec: RunSpec, job: Job, draft_dir: str, cloud: str) -> list[str]:
    s = job.sampling
    return ["generate", job.prompt, "--draft", draft_dir, "--engine", "torch", "--cloud", cloud,
            "--policy", spec.policy, "--max-tokens", str(job.max_new), "--temperature", str(s["temperature"]),
            "--top-p", str(s["top_p"]), "--top-k", str(s["top_k"]), "--seed", str(job.seed), *spec.tree]


def classify(rc: int | None, stdout: str, stderr: str, job: Job, policy: str, *, killed: bool = False,
             hung: bool = False) -> tuple[str, str]:
    """(outcome, detail) of one finished process (see the module docstring)."""
    if hung:
        return "hang", _tail(stderr)
    if killed:
        return "killed", ""
    if rc == 0:
        return _check_tokens(stdout, stderr, job, policy)
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    errors = [i for i, ln in enumerate(lines) if ln.startswith(ERROR_LINE)]
    clean = (rc == 2 and "Traceback" not in stderr and len(errors) == 1 and errors[0] == len(lines) - 1)
    if not clean:
        return "unclean_error", f"exit {rc}: {_tail(stderr)}"
    line = lines[-1][len(ERROR_LINE):]
    m = re.match(r"cloud error \[(\w+)\]", line)
    return "clean_error", f"cloud_{m.group(1)}" if m else "rapid_" + re.sub(r"\W+", "_", line[:24]).strip("_")


def _check_tokens(stdout: str, stderr: str, job: Job, policy: str) -> tuple[str, str]:
    text = stdout[:-1] if stdout.endswith("\n") else stdout
    want = [t for t in job.expected if t != EOS]  # the stop token is not rendered
    got = [CHAR_TO_ID.get(c, -1) for c in text]
    if got != want:
        at = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), min(len(got), len(want)))
        return "mismatch", f"first difference at token {at} of {len(want)} (got {len(got)} tokens)"
    if f"[{policy}] {len(job.expected)} tokens" not in stderr:
        return "mismatch", f"the summary line does not count {len(job.expected)} tokens: {_tail(stderr)}"
    return "identical", ""


def _tail(text: str, n: int = 3) -> str:
    return " | ".join(text.strip().splitlines()[-n:])[-600:]
