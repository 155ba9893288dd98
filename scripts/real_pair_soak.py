"""The chaos soak's short phase on the real default pair, in the production shape.

    python scripts/real_pair_soak.py --minutes 3 --edges 2 --out DIR [--max-tokens 24]

One ``rapid serve`` of the default target (its auto dtype) with ``--cert/--key`` and a token
(``chaos_net.Secure``: wss://, a self-signed certificate); ``--edges`` edges in this process (the
int4 draft, one engine each, ``rapid.runtime.session.EdgeSession`` with the token and the CA),
generating greedy answers to the built-in chat prompts back to back under every policy. While they
run, on a seeded schedule: ``kill -9`` of the cloud and a SIGTERM drain, each followed by a
restart on the same port (the edges reconnect and re-prefill). Each run ends as

    identical      the tokens of the target alone (``ar`` on the same server before any fault)
    mismatch       other tokens (a failure)
    clean_error    a RapidError (typed, one line: e.g. unreachable while the target reloads)
    unclean_error  any other exception (a failure)
    hang           no end within --run-timeout (a failure)

After the runs and the cloud's grace period, ``rapid_sessions_active`` must be 0. RSS of the cloud
is sampled every second. Writes DIR/report.json and prints a markdown table; exit 1 on a failure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from collections import Counter
from pathlib import Path

from chaos_net import Cloud, Secure, metric, rss_kb

from rapid import models
from rapid.core.auth import client_ssl_context
from rapid.core.errors import RapidError
from rapid.core.procs import free_port
from rapid.demo import PROMPTS
from rapid.export.fast_draft import resolve_draft
from rapid.runtime.edge_config import DEFAULT
from rapid.runtime.generate import encode_prompt, open_edge_models
from rapid.runtime.session import EdgeSession

POLICIES = ("rapid", "fixed", "ipdg", "caac", "rapid-cost", "npdg", "edgellm", "ar")


class RealSoak:
    def __init__(self, args: argparse.Namespace, out: Path) -> None:
        self.args, self.out = args, out
        self.secure = Secure.make(out / "secure")
        self.t0 = time.monotonic()
        self.cloud = Cloud(models.resolve_model("default-target"), free_port(),
                           ["--threads", "1", "--grace", str(args.grace)], out, self.t0, self.secure)
        self.runs: list[dict] = []
        self.faults: Counter = Counter()
        self.rss: list[list] = []
        self.end = 0.0

    def session(self, model, policy: str) -> EdgeSession:
        return EdgeSession(model, self.cloud.url, policy=policy, token=self.secure.token,
                           ssl=client_ssl_context(self.cloud.url, self.secure.cert),
                           link_options={"max_retry_s": self.args.retry_s})

    async def slot(self, k: int, model, prompts: list[list[int]], refs: list[list[int]]) -> None:
        rng, n = random.Random(self.args.seed * 31 + k), 0
        while time.monotonic() < self.end:
            i, policy = rng.randrange(len(prompts)), POLICIES[(k + n) % len(POLICIES)]
            n += 1
            t = time.monotonic()
            session = self.session(model, policy)
            try:
                gen = await asyncio.wait_for(session.generate(prompts[i], self.args.max_tokens), self.args.run_timeout)
                outcome, detail = ("identical", "") if gen.tokens == refs[i] else ("mismatch", f"prompt {i}")
            except TimeoutError:
                outcome, detail = "hang", f"prompt {i}"
            except RapidError as e:
                outcome, detail = "clean_error", f"{type(e).__name__}: {str(e)[:80]}"
            except Exception as e:  # noqa: BLE001 - counted as a failure, never fatal to the soak
                outcome, detail = "unclean_error", f"{type(e).__name__}: {e}"
            finally:
                session.close()  # its workers: generate has already drained them
            self.runs.append({"slot": k, "policy": policy, "prompt": i, "outcome": outcome, "detail": detail,
                              "start_s": round(t - self.t0, 1), "wall_s": round(time.monotonic() - t, 1)})
            print(f"[real_pair_soak {time.monotonic() - self.t0:.0f}s] {policy} prompt {i}: {outcome} {detail}",
                  file=sys.stderr, flush=True)

    async def inject(self) -> None:
        rng = random.Random(self.args.seed)
        span = self.end - time.monotonic()
        plan = sorted([(rng.uniform(0.15, 0.45) * span, "cloud_kill"), (rng.uniform(0.55, 0.8) * span, "cloud_drain")])
        start = time.monotonic()
        for at, kind in plan:
            await asyncio.sleep(max(0.0, start + at - time.monotonic()))
            await (self.cloud.kill9() if kind == "cloud_kill" else self.cloud.drain())
            self.faults[kind] += 1
            await self.cloud.start()

    async def sample_rss(self) -> None:
        while True:
            if self.cloud.up.is_set() and (kb := rss_kb(self.cloud.proc.pid)):
                self.rss.append([round(time.monotonic() - self.t0, 1), len(self.cloud.incarnations) - 1, kb])
            await asyncio.sleep(1.0)

    async def run(self, pool: list, prompts: list[list[int]]) -> dict:
        await self.cloud.start()
        sampler = asyncio.create_task(self.sample_rss())
        try:
            refs = [(await self.session(pool[0], "ar").generate(p, self.args.max_tokens)).tokens for p in prompts]
            self.end = time.monotonic() + self.args.minutes * 60
            injector = asyncio.create_task(self.inject())
            await asyncio.gather(*(self.slot(k, m, prompts, refs) for k, m in enumerate(pool)))
            await injector
            await asyncio.wait_for(self.cloud.up.wait(), 300)
            await asyncio.sleep(self.args.grace + 2.5)
            active = await asyncio.to_thread(metric, self.cloud.port, "rapid_sessions_active", 5.0, self.secure)
        finally:
            sampler.cancel()
            await self.cloud.stop()
        return self.summary(active)

    def summary(self, active: float | None) -> dict:
        outcomes = Counter(r["outcome"] for r in self.runs)
        mb = [s[2] / 1024 for s in self.rss]
        bad = [f"{outcomes[k]} {k}" for k in ("mismatch", "unclean_error", "hang") if outcomes[k]]
        if active != 0:
            bad.append(f"sessions left on the cloud: {active}")
        return {"outcomes": dict(outcomes), "per_policy": {p: dict(Counter(r["outcome"] for r in self.runs
                                                                         if r["policy"] == p)) for p in POLICIES},
                "clean_errors": dict(Counter(r["detail"] for r in self.runs if r["outcome"] == "clean_error")),
                "faults": dict(self.faults), "sessions_active_after_grace": active,
                "rss_mb": {"first": round(mb[0], 1), "max": round(max(mb), 1), "last": round(mb[-1], 1)} if mb else {},
                "incarnations": self.cloud.incarnations, "failures": bad, "passed": not bad, "runs": self.runs}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=3.0)
    ap.add_argument("--edges", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--grace", type=float, default=10.0, help="the cloud's --grace (resume window), seconds")
    ap.add_argument("--retry-s", type=float, default=180.0, help="an edge's reconnect budget (the target reloads)")
    ap.add_argument("--run-timeout", type=float, default=400.0, help="a run still going after this is a hang")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    models.fetch_default(("target",))
    pool = open_edge_models(resolve_draft(DEFAULT.draft), DEFAULT.engine, DEFAULT.capacity, 1, args.edges)
    prompts = [encode_prompt(pool[0].tokenizer, text, chat) for _, text, chat in PROMPTS]
    s = asyncio.run(RealSoak(args, out).run(pool, prompts))
    (out / "report.json").write_text(json.dumps(s, indent=1))
    print("| figure | value |\n|---|---|")
    for key in ("outcomes", "per_policy", "clean_errors", "faults", "sessions_active_after_grace", "rss_mb"):
        print(f"| {key} | {json.dumps(s[key])} |")
    print("\nPASS" if s["passed"] else "\nFAIL: " + "; ".join(s["failures"]))
    return 0 if s["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
