"""A bench folder's round traces (``rounds.jsonl``) by generation: one run is one policy's
generation of one prompt, in one profile, schedule and repeat; its rounds walked in order, each
with the round before it (what that round's proactive branch left to this one). Reading a
trace file checks each record is a JSON object with the fields ``rapid sim`` and the report
read (``TraceError`` naming the file and line otherwise); ``make_output_folder`` creates the
folder a bench or sim run writes (``--out``), one line if it cannot."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator, Mapping
from pathlib import Path

from rapid.core.errors import OptionError, RapidError

_NUM: tuple[type, ...] = (int, float)
_NUM_OR_NULL: tuple[type, ...] = (int, float, type(None))
_TEXT: tuple[type, ...] = (str,)
# the fields a record must have (name -> the JSON types allowed), checked on every line
ROUND_FIELDS: dict[str, tuple[type, ...]] = {
    "round": _NUM, "policy": _TEXT, "depth": _NUM, "accepted": _NUM, "draft_steps": _NUM, "draft_s": _NUM,
    "tree_nodes": _NUM, "t_start": _NUM, "t_end": _NUM}
RUN_FIELDS: dict[str, tuple[type, ...]] = {
    "policy": _TEXT, "profile": _TEXT, "schedule": _TEXT, "set": _TEXT, "tokens": _NUM, "tokens_per_s": _NUM,
    "per_token_s": _NUM, "wall_s": _NUM, **dict.fromkeys(
        ("mean_accepted", "tokens_per_call", "hit_rate", "interrupts", "discarded_ratio", "mean_depth"),
        _NUM_OR_NULL)}
# ... and the fields a round may have (name -> the JSON types allowed, checked where present)
ROUND_OPTIONAL: dict[str, tuple[type, ...]] = {
    **dict.fromkeys(("verify_s", "cloud_s", "load", "emitted", "reused_depth", "prefill_s", "lookup_depth",
                     "t_rel_end"), _NUM),
    **dict.fromkeys(("profile", "schedule", "set", "prompt_id"), _TEXT)}
_JSON_NAMES = {bool: "a boolean", str: "a string", list: "an array", dict: "an object", type(None): "null"}


class TraceError(RapidError):
    """A bench output file (``rounds.jsonl``, ``runs.jsonl``, ``meta.json``) cannot be read, is
    not JSON, or holds a record without a field the calibration or the report reads."""


def read_jsonl(path: Path, fields: Mapping[str, tuple[type, ...]] | None = None,
               optional: Mapping[str, tuple[type, ...]] | None = None) -> list[dict]:
    """The records of a JSON-lines file ([] if there is none): each a JSON object with ``fields``
    and, where present, ``optional`` (both name -> allowed types); else ``TraceError`` naming
    the file and the line."""
    if not path.exists():
        return []
    try:
        lines = path.read_bytes().splitlines()
    except OSError as e:
        raise TraceError(f"cannot read {path}: {e.strerror or e}") from None
    out = []
    for n, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            rec = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError:
            raise TraceError(f"{path} line {n}: not UTF-8 text") from None
        except json.JSONDecodeError as e:
            raise TraceError(f"{path} line {n}: not JSON ({e.msg})") from None
        _check_record(rec, f"{path} line {n}", fields or {}, optional or {})
        out.append(rec)
    return out


def read_rounds(path: Path) -> list[dict]:
    """A ``rounds.jsonl`` (or ``warmup.jsonl``), every record checked (``read_jsonl``)."""
    return read_jsonl(path, ROUND_FIELDS, ROUND_OPTIONAL)


def read_runs(path: Path) -> list[dict]:
    """A ``runs.jsonl``, every record checked (``read_jsonl``)."""
    return read_jsonl(path, RUN_FIELDS)


def _check_record(rec: object, where: str, fields: Mapping[str, tuple[type, ...]],
                  optional: Mapping[str, tuple[type, ...]]) -> None:
    if not isinstance(rec, dict):
        raise TraceError(f"{where}: a record must be a JSON object, got {_json_name(rec)}")
    for name, kinds in fields.items():
        if name not in rec:
            raise TraceError(f"{where}: the record has no {name!r} field")
        _check_type(rec[name], kinds, f"{where}: {name!r}")
    for name, kinds in optional.items():
        if name in rec:
            _check_type(rec[name], kinds, f"{where}: {name!r}")


def _check_type(value: object, kinds: tuple[type, ...], what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, kinds):  # a JSON true/false is no number
        want = "text" if kinds == _TEXT else "a number or null" if kinds == _NUM_OR_NULL else "a number"
        raise TraceError(f"{what} must be {want}, got {_json_name(value)}")


def _json_name(value: object) -> str:
    return _JSON_NAMES.get(type(value), "a number")


def make_output_folder(out: Path) -> Path:
    """Create a bench or sim output folder (``--out``) now, before anything is read or loaded;
    OptionError if it cannot be (a file of that name, a read-only place)."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OptionError(f"cannot create the output folder {out} ({e.strerror or e}); --out names another") from None
    return out


def read_meta(path: Path) -> dict:
    """A bench folder's ``meta.json`` ({} if there is none): a JSON object, else ``TraceError``."""
    if not path.exists():
        return {}
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise TraceError(f"cannot read {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise TraceError(f"{path}: not UTF-8 text") from None
    except json.JSONDecodeError as e:
        raise TraceError(f"{path}: not JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(meta, dict):
        raise TraceError(f"{path}: must hold a JSON object, got {_json_name(meta)}")
    return meta


def run_key(r: dict) -> tuple:
    """The generation a round or a run record belongs to (``trace``: the folder it was read from,
    where several are pooled: two runs of one bench command share every other field)."""
    return (r.get("trace"), r.get("profile"), r.get("schedule"), r.get("set"), r.get("prompt_id"), r.get("repeat"),
            r.get("policy"))


def shared_run(rounds: list[dict]) -> tuple | None:
    """The key of a generation whose rounds repeat a round number (two generations under one
    key: a bench that ran one schedule, policy or set twice), else None."""
    seen: set[tuple] = set()
    for r in rounds:
        k = (*run_key(r), r.get("round"))
        if k in seen:
            return run_key(r)
        seen.add(k)
    return None


def group_runs(rounds: list[dict]) -> dict[tuple, list[dict]]:
    g: dict[tuple, list[dict]] = defaultdict(list)
    for r in rounds:
        g[run_key(r)].append(r)
    return g


def with_previous(by_run: dict[tuple, list[dict]]) -> Iterator[tuple[dict, dict | None]]:
    """Every run's rounds by round number, each with the round before it (None for the first)."""
    for rs in by_run.values():
        prev = None
        for r in sorted(rs, key=lambda x: x["round"]):
            yield r, prev
            prev = r


def load_traces(folders: list[str | Path]) -> tuple[list[dict], list[dict], dict]:
    """Rounds, runs and the first folder's meta; the warm-up rounds of every folder, where
    recorded (``warmup.jsonl``), as ``meta["warmup_rounds"]``."""
    rounds, runs, meta, warmup = [], [], {}, []
    for f in map(Path, folders):  # every record checked: TraceError naming the file and line
        rounds += read_rounds(f / "rounds.jsonl")
        runs += read_runs(f / "runs.jsonl")
        meta = meta or read_meta(f / "meta.json")
        warmup += read_rounds(f / "warmup.jsonl")
    if warmup:
        meta = {**meta, "warmup_rounds": warmup}
    return rounds, runs, meta
