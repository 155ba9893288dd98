"""``rapid demo``: a cloud verifier subprocess, the edge in this process, built-in prompts.

For every prompt the edge generates with the chosen policy, then the same prompt is decoded by
the target alone (policy ``ar``: no draft, one target forward per token) on the same server,
and the two token sequences are compared.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

from rapid import models
from rapid.core.errors import OptionError
from rapid.core.procs import free_port, split_cores, start_server, stop_server
from rapid.export.fast_draft import resolve_draft
from rapid.runtime.edge_config import EdgeConfig
from rapid.runtime.generate import encode_prompt, open_edge_model
from rapid.runtime.session import EdgeSession
from rapid.tiny import build_tiny

PROMPTS: list[tuple[str, str, bool]] = [  # (name, text, chat?)
    ("code", 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n', False),
    ("chat", "Write a Python function that checks whether a string is a palindrome.", True),
    ("chat", "Explain in two sentences what a hash map is.", True),
    ("code", "import numpy as np\n\ndef softmax(x):\n", False),
]


def _models(args) -> tuple[str, str]:
    if args.tiny:
        root = Path(tempfile.mkdtemp(prefix="rapid-demo-"))
        return (str(build_tiny(root / "target", seed=0)),
                str(build_tiny(root / "draft", seed=1, base_seed=0, perturb=0.05)))
    if args.target == "default-target":
        models.fetch_default(("target",))
    return models.resolve_model(args.target), resolve_draft(args.draft)


def run_demo(args) -> int:
    t_all = time.perf_counter()
    config = EdgeConfig.of(args)  # a bad option fails before anything loads
    if not 1 <= args.num_prompts <= len(PROMPTS):  # none run would read "identical on every prompt"
        raise OptionError(f"--num-prompts must be in [1, {len(PROMPTS)}], got {args.num_prompts}")
    target, draft = _models(args)
    port = free_port()
    log_path = Path(tempfile.gettempdir()) / f"rapid-demo-serve-{port}.log"
    cores = split_cores()
    if cores:
        os.sched_setaffinity(0, cores[0])
    where = f"edge on core {min(cores[0])}, cloud on core {min(cores[1])}" if cores else "one core: edge and cloud share it"
    print(f"starting the cloud verifier ({target}) on ws://127.0.0.1:{port} ({where}) … log: {log_path}",
          file=sys.stderr)
    proc = start_server(target, port, ["--threads", str(args.threads), "--dtype", args.dtype], log_path=log_path,
                        cpus=cores[1] if cores else None)
    url = f"ws://127.0.0.1:{port}"
    try:
        edge = open_edge_model(draft, args.engine, args.capacity, args.threads)
        tree, sampling = config.tree(), config.sampling()
        rows = []
        with EdgeSession(edge, url, policy=args.policy, tree=tree) as spec, \
                EdgeSession(edge, url, policy="ar", tree=tree) as alone:
            for name, text, chat in PROMPTS[: args.num_prompts]:
                ids = encode_prompt(edge.tokenizer, text, chat)
                print(f"\n=== [{name}] {text.strip()[:70]!r} — policy {args.policy}", flush=True)
                gen, _ = asyncio.run(spec.generate_text(ids, args.max_tokens, sampling, stream=sys.stdout))
                print(f"\n--- {gen.summary.line()}")
                ref = asyncio.run(alone.generate(ids, args.max_tokens, sampling))
                rows.append((name, gen, ref, ref.tokens == gen.tokens))
                print(f"--- target alone: {ref.summary.line()}")
                print(f"--- identical: {'yes' if rows[-1][3] else 'NO'}; {args.policy} {gen.summary.tokens_per_s:.2f} tok/s, "
                      f"target alone {ref.summary.tokens_per_s:.2f} tok/s: {gen.summary.tokens_per_s / ref.summary.tokens_per_s:.2f}x",
                      flush=True)
        _print_table(rows, args.policy, where)
        all_same = all(r[3] for r in rows)
        print(f"\ndemo wall time {time.perf_counter() - t_all:.0f}s; identical on every prompt: "
              f"{'yes' if all_same else 'NO'}")
        return 0 if all_same else 1
    finally:
        stop_server(proc)


def _print_table(rows, policy: str, where: str) -> None:
    print(f"\n| prompt | tokens | rounds | mean accepted | {policy} tok/s | target alone tok/s | {policy}/target "
          "| identical |")
    print("|---|---|---|---|---|---|---|---|")
    for name, gen, ref, same in rows:
        s = gen.summary
        print(f"| {name} | {s.tokens} | {s.rounds} | {s.mean_accepted:.2f} | {s.tokens_per_s:.2f} | "
              f"{ref.summary.tokens_per_s:.2f} | {s.tokens_per_s / ref.summary.tokens_per_s:.2f}x | {'yes' if same else 'NO'} |")
    print(f"({where}; 1 thread each)")
