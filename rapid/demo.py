"""``rapid demo``: a cloud verifier subprocess, the edge in this process, built-in prompts.

For every prompt the edge generates with the chosen policy, then the same prompt is decoded by
the target alone (policy ``ar``: no draft, one target forward per token) on the same server,
and the two token sequences are compared.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path

from rapid import models
from rapid.procs import free_port, start_server, stop_server
from rapid.runtime.coordinator import CoordinatorConfig
from rapid.runtime.generate import encode_prompt, generate_text, open_edge_model
from rapid.runtime.tree import TreeParams
from rapid.sampling import SamplingParams
from rapid.tiny import build_tiny

PROMPTS: list[tuple[str, str, bool]] = [  # (name, text, chat?)
    ("code", 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n', False),
    ("chat", "Write a Python function that checks whether a string is a palindrome.", True),
    ("chat", "Explain in two sentences what a hash map is.", True),
    ("code", "import numpy as np\n\ndef softmax(x):\n", False),
]


def run_demo(args) -> int:
    t_all = time.perf_counter()
    if args.tiny:
        root = Path(tempfile.mkdtemp(prefix="rapid-demo-"))
        target = str(build_tiny(root / "target", seed=0))
        draft = str(build_tiny(root / "draft", seed=1, base_seed=0, perturb=0.05))
    else:
        need = [w for w, spec in (("target", args.target), ("draft", args.draft)) if spec == f"default-{w}"]
        if need:
            models.fetch_default(tuple(need))
        target, draft = models.resolve_model(args.target), models.resolve_model(args.draft)
    port = free_port()
    log_path = Path(tempfile.gettempdir()) / f"rapid-demo-serve-{port}.log"
    print(f"starting the cloud verifier ({target}) on ws://127.0.0.1:{port} … log: {log_path}", file=sys.stderr)
    proc = start_server(target, port, ["--threads", str(args.threads)], log_path=log_path)
    url = f"ws://127.0.0.1:{port}"
    try:
        edge = open_edge_model(draft, args.engine, 2048, args.threads)
        tree = TreeParams(args.depth, args.budget, args.topk, args.width)
        sampling = SamplingParams(args.temperature, args.top_p, args.top_k, args.seed)
        rows, all_same = [], True
        for name, text, chat in PROMPTS[: args.prompts]:
            ids = encode_prompt(edge.tokenizer, text, chat)
            print(f"\n=== [{name}] {text.strip()[:70]!r} — policy {args.policy}", flush=True)
            gen, out_text = asyncio.run(generate_text(
                edge, url, ids, policy=args.policy, max_new=args.max_tokens, sampling=sampling, tree=tree,
                config=CoordinatorConfig(depth=args.depth), stream=sys.stdout))
            print(f"\n--- {gen.summary.line()}")
            ref, _ = asyncio.run(generate_text(edge, url, ids, policy="ar", max_new=args.max_tokens,
                                               sampling=sampling, tree=tree))
            same = ref.tokens == gen.tokens
            all_same &= same
            print(f"--- target alone: {ref.summary.line()}")
            print(f"--- identical: {'yes' if same else 'NO'}", flush=True)
            rows.append((name, gen, ref, same))
        print("\n| prompt | tokens | rounds | mean accepted | tokens/target call | speculative s | target-alone s | identical |")
        print("|---|---|---|---|---|---|---|---|")
        for name, gen, ref, same in rows:
            s = gen.summary
            print(f"| {name} | {s.tokens} | {s.rounds} | {s.mean_accepted:.2f} | {s.tokens_per_call:.2f} | "
                  f"{s.wall_s:.1f} | {ref.summary.wall_s:.1f} | {'yes' if same else 'NO'} |")
        print(f"\ndemo wall time {time.perf_counter() - t_all:.0f}s; identical on every prompt: "
              f"{'yes' if all_same else 'NO'}")
        return 0 if all_same else 1
    finally:
        stop_server(proc)
