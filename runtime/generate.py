"""``rapid generate``: draft on the edge, verify in the cloud, stream the text."""

from __future__ import annotations

import asyncio
import logging
import sys
from dataclasses import dataclass
from typing import Any

from rapid.core.auth import client_ssl_context, load_token
from rapid.core.errors import OptionError
from rapid.core.vocab import fingerprint
from rapid.engines.select import open_engine, share_engine
from rapid.export.fast_draft import FAST_DRAFT, resolve_draft
from rapid.models import load_tokenizer
from rapid.runtime.edge_config import DEFAULT, EdgeConfig
from rapid.runtime.session import EdgeSession
from rapid.runtime.telemetry import write_jsonl

log = logging.getLogger("rapid.edge")


@dataclass(slots=True)
class EdgeModel:
    engine: Any
    tokenizer: Any
    stop_ids: tuple[int, ...]
    fingerprint: str = ""  # rapid.core.vocab.fingerprint(tokenizer): checked against the cloud's at Hello


def open_edge_model(draft: str = DEFAULT.draft, engine: str = DEFAULT.engine, capacity: int = DEFAULT.capacity,
                    threads: int = DEFAULT.threads) -> EdgeModel:
    """Load the draft behind the requested backend (``rapid.engines.select``) and its tokenizer;
    ``default-draft-int4`` is the cached int4 ONNX export (``rapid.export.fast_draft``)."""
    if draft == FAST_DRAFT:
        draft = resolve_draft(draft)
    eng = open_engine(engine, draft, capacity=capacity, threads=threads)
    tok = load_tokenizer(draft)  # an export folder holds its own copy: no hub needed on the edge
    stop = set(eng.info.eos_token_ids)
    if getattr(tok, "eos_token_id", None) is not None:
        stop.add(tok.eos_token_id)
    log.info("draft engine: %s on %s", eng.info.backend, eng.info.device)
    return EdgeModel(eng, tok, tuple(sorted(stop)), fingerprint(tok))


def open_edge_models(draft: str = DEFAULT.draft, engine: str = DEFAULT.engine, capacity: int = DEFAULT.capacity,
                     threads: int = DEFAULT.threads, n: int = 1) -> list[EdgeModel]:
    """``n`` edge models over ONE copy of the draft's weights, each with its own KV cache
    (``rapid.engines.select.share_engine``)."""
    first = open_edge_model(draft, engine, capacity, threads)
    return [first] + [EdgeModel(share_engine(first.engine), first.tokenizer, first.stop_ids, first.fingerprint)
                      for _ in range(n - 1)]


def encode_messages(tokenizer: Any, messages: list[dict]) -> list[int]:
    """``messages`` (``{"role", "content"}`` dicts) in the tokenizer's chat template, ready for
    the assistant's reply."""
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    return list(ids)


def encode_prompt(tokenizer: Any, prompt: str, chat: bool) -> list[int]:
    """``prompt`` as one user message (``chat``), else as plain text."""
    if chat:
        return encode_messages(tokenizer, [{"role": "user", "content": prompt}])
    return list(tokenizer(prompt)["input_ids"])


def _check_trace(path: str | None) -> None:
    """Open ``--trace`` for appending now (it is appended to after the generation), so a folder
    that does not exist, a folder given as the file or a read-only place is one line before any
    model loads, not a traceback after the whole generation."""
    if path:
        try:
            with open(path, "a", encoding="utf-8"):
                pass
        except OSError as e:
            raise OptionError(f"--trace: cannot write {path} ({e.strerror or e})") from None


def run_generate(args) -> int:
    config = EdgeConfig.of(args)  # before any model loads: a bad option or token file fails at once
    _check_trace(args.trace)
    token = load_token(args.token_file)
    ssl = client_ssl_context(args.cloud, args.cafile)
    edge = open_edge_model(args.draft, args.engine, args.capacity, args.threads)
    ids = encode_prompt(edge.tokenizer, args.prompt, args.chat)
    with EdgeSession(edge, args.cloud, policy=args.policy, tree=config.tree(), token=token, ssl=ssl) as session:
        gen, _ = asyncio.run(session.generate_text(ids, args.max_tokens, config.sampling(), stream=sys.stdout))
    sys.stdout.write("\n")
    sys.stdout.flush()
    if args.trace:
        write_jsonl(args.trace, gen.records)
    print(gen.summary.line(), file=sys.stderr)
    return 0
