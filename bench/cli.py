"""``rapid bench`` and ``rapid sim`` argument parsing."""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

from rapid.bench.contention import parse_schedule
from rapid.bench.gpu_profile import load_gpu_profile
from rapid.bench.netem import get_profile
from rapid.bench.presets import NET_PROFILES, PRESETS, net_profile, parse_presets
from rapid.bench.prompts import default_prompt_dir, load_sets
from rapid.bench.report import write_report
from rapid.bench.runner import BENCH_TREE, BenchConfig, run_bench
from rapid.bench.sim_report import check_traced_folder, run_sim_cli
from rapid.bench.variants import variant_configs
from rapid.core.errors import OptionError
from rapid.runtime.edge_config import DEFAULT as EDGE_DEFAULT
from rapid.runtime.edge_config import EdgeConfig, add_edge_args
from rapid.runtime.policies import POLICIES, get_policy

# 4 min on the default pair (2 cores): the sustained-load comparison only, short prompts and outputs
QUICK = dict(policies="fixed,rapid", sets="c4", n_prompts=1, token_budget=32, max_new=8,
             schedules="sustained", profiles="wan", repeats=3)
# the default run: 22 min on the default pair, 2 cores (36 generations + 2 warm-ups)
DEFAULT = dict(policies="fixed,npdg,rapid", sets="c4,oasst", n_prompts=1, token_budget=64, max_new=16,
               schedules="none,sustained", profiles="wan", repeats=3)
# the target-alone comparison: rapid and the default policy vs ar on five sets, no contention, 48 tokens
# (~20 min on 2 cores, Zen 3)
# (+ the HF peers, ~6 min more)
VS_AR = dict(policies=",".join(dict.fromkeys(("ar", "rapid", EDGE_DEFAULT.policy))),
             sets="c4,oasst,mtbench,wikitext,humaneval", n_prompts=2, token_budget=64, max_new=48,
             schedules="none", profiles="lan", repeats=3, peers=True)
# the slow-edge regime (issue 22): the PyTorch draft (a step ~0.3-0.4 of a verify on a CPU), 30 ms RTT,
# every policy under no load, sustained and burst load, five sets (~1 h on 2 cores; 24 tokens)
SLOW_EDGE = dict(policies=",".join(POLICIES), sets="c4,oasst,mtbench,wikitext,humaneval", n_prompts=1,
                 token_budget=64, max_new=24, schedules="none,sustained,burst:4:4", profiles="wan", repeats=3,
                 draft="default-draft")
SMOKE = dict(policies="fixed,npdg,rapid", sets="c4", n_prompts=1, token_budget=32, max_new=24,
             schedules="none,sustained", profiles="lan", repeats=3)


# rapid sim --tokens above this would run for hours (each simulated round walks the replay)
MAX_SIM_TOKENS = 8192


def _csv(s: str | None) -> list[str] | None:
    return [x.strip() for x in s.split(",") if x.strip()] if s else None


def bench_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="rapid bench", description="real-run benchmark of drafting policies "
                                 "(edge in this process, cloud in a subprocess, over the websocket)")
    ap.add_argument("--out", help="output folder (default bench-out/<timestamp>)")
    ap.add_argument("--quick", action="store_true", help="~4 min: c4, 1 prompt, fixed vs rapid under sustained load, 8 tokens, wan")
    ap.add_argument("--smoke", action="store_true", help="tiny random models, < 60 s (tests)")
    ap.add_argument("--vs-ar", action="store_true", help="rapid vs the target alone (ar) on c4, oasst, mtbench, "
                    "wikitext, humaneval; no load; 48 tokens; lan; with --peers (~30 min on a bf16 CPU, ~55 "
                    "on an fp32-only one, two thirds of it the peers; --no-peers ~20)")
    ap.add_argument("--peers", action="store_const", const=True, default=None,
                    help="also run HF assisted and prompt-lookup generation on the same prompts "
                         "(rapid.bench.peers; default: only with --vs-ar)")
    ap.add_argument("--slow-edge", action="store_true", help="~1-1.5 h: the slow-edge regime: the PyTorch draft "
                    "(default-draft, unless --draft names another), every policy, no load / sustained / burst, "
                    "five sets, 24 tokens, wan")
    ap.add_argument("--no-peers", dest="peers", action="store_const", const=False, help="not even with --vs-ar")
    add_edge_args(ap, "tree", exclude=("policy",))  # the edge's tree options (rapid.runtime.edge_config)
    add_edge_args(ap, "draft", exclude=("capacity", "threads"))
    ap.set_defaults(draft=None)  # unset: the preset's draft (--slow-edge: default-draft), else the edge's
    add_edge_args(ap, "sampling", exclude=("max_tokens", "top_k"))  # --max-tokens below: the preset's
    ap.add_argument("--dtype", default="auto", help="the target's dtype: auto|bfloat16|float32|float64")
    ap.add_argument("--target", default="default-target")
    ap.add_argument("--policies", help="comma list (default fixed,npdg,rapid; also ipdg, caac, rapid-cost, edgellm, "
                    "ar); a variant runs a policy under other tree options beside it: rapid-cost@branch_roots=4 "
                    "(rapid.bench.variants)")
    ap.add_argument("--prompts", help="folder of prompt-set JSON files or one file "
                    "(default ../shared/data/prompts if present, else built-in prompts)")
    ap.add_argument("--sets", help="comma list of set names (default c4,oasst)")
    ap.add_argument("--n-prompts", type=int, help="prompts per set (default 1)")
    ap.add_argument("--token-budget", type=int, help="prompt tokens kept, the last ones (default 64)")
    ap.add_argument("--max-tokens", type=int, help="new tokens per generation (default 16)")
    ap.add_argument("--contention", help="comma list: none, sustained[:I], burst:ON:OFF[:I] "
                    "(default none,sustained)")
    ap.add_argument("--profiles", help="comma list: local, lan, wan, cellular (default wan)")
    ap.add_argument("--repeats", type=int, help="repeats per cell (default 3)")
    ap.add_argument("--net", default="auto", choices=["auto", "netem", "transport"],
                    help="real netns+netem link, delay in the transport, or auto (netem if permitted)")
    ap.add_argument("--edge-cpu", type=int, default=0)
    ap.add_argument("--cloud-cpu", type=int, default=1)
    ap.add_argument("--load-device", default="auto", choices=["auto", "cpu", "cuda"],
                    help="where the contention load runs (default: the edge engine's device; a GPU edge gets "
                         "a GPU matmul load)")
    ap.add_argument("--fresh-controller", action="store_true",
                    help="a new depth controller per generation (default: one per policy carried across "
                         "generations, as the edge daemon keeps it)")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--report-only", action="store_true", help="only (re)write the report of --out")
    return ap


def bench_config(a: argparse.Namespace, out: Path) -> BenchConfig:
    """The run a parsed command line asks for: its preset (--smoke, --quick, --vs-ar,
    --slow-edge, else the default run) under the flags given."""
    preset = SMOKE if a.smoke else QUICK if a.quick else VS_AR if a.vs_ar else SLOW_EDGE if a.slow_edge else DEFAULT
    draft = a.draft or preset.get("draft", EDGE_DEFAULT.draft)

    def opt(name: str, cli_value):
        return cli_value if cli_value is not None else preset.get(name)

    def names(flag: str, name: str, cli_value: str | None) -> list[str] | None:  # a flag given empty: refused
        return _names(flag, cli_value) if cli_value is not None else _csv(preset.get(name))

    cfg = BenchConfig(
        out=out, draft=draft, target=a.target, dtype=a.dtype, policies=names("--policies", "policies", a.policies),
        prompts_source=a.prompts, sets=names("--sets", "sets", a.sets), n_prompts=opt("n_prompts", a.n_prompts),
        token_budget=opt("token_budget", a.token_budget), max_new=opt("max_new", a.max_tokens),
        schedules=names("--contention", "schedules", a.contention), profiles=names("--profiles", "profiles", a.profiles),
        repeats=opt("repeats", a.repeats),
        **{n: getattr(a, n) for n in BENCH_TREE}, edge_cpu=a.edge_cpu, cloud_cpu=a.cloud_cpu,
        net=a.net, seed=a.seed, temperature=a.temperature, top_p=a.top_p, engine=a.engine, smoke=a.smoke,
        progress=not a.no_progress,
        carry_controller=not a.fresh_controller, load_device=a.load_device,
        peers=bool(opt("peers", a.peers)) and not a.smoke)
    # a bad policy, variant or option value: one line now, not after the models load
    variant_configs(cfg.policies or [], {n: getattr(cfg, n) for n in BENCH_TREE})
    _check_run_options(cfg)
    if a.sets is None and a.prompts is None:
        if default_prompt_dir() is None:  # no shared prompt sets here: the built-in prompts
            cfg.sets = None
        elif a.smoke:
            cfg.sets = ["c4"]
    return cfg


def _check_run_options(cfg: BenchConfig) -> None:
    """The run's own options (OptionError, one line): counts >= 1, every schedule and profile known,
    the sampling flags in range (the edge's rules); the ``--prompts`` file or folder readable
    (PromptSetError, rapid.bench.prompts)."""
    for flag, value in (("--repeats", cfg.repeats), ("--max-tokens", cfg.max_new), ("--n-prompts", cfg.n_prompts),
                        ("--token-budget", cfg.token_budget)):
        if value is not None and value < 1:
            raise OptionError(f"{flag} must be >= 1, got {value}")
    _once("--contention", [parse_schedule(spec).name for spec in cfg.schedules or []])
    for flag, names in (("--policies", cfg.policies), ("--sets", cfg.sets), ("--profiles", cfg.profiles)):
        _once(flag, names or [])
    for name in cfg.profiles or []:
        get_profile(name)
    EdgeConfig(temperature=cfg.temperature, top_p=cfg.top_p, seed=cfg.seed)  # --temperature, --top-p, --seed
    if cfg.prompts_source is not None:
        load_sets(cfg.prompts_source, cfg.sets)


def _repeat(keys: list) -> int | None:
    """Index of the first key that an earlier one equals, else None."""
    return next((k for k, key in enumerate(keys) if key in keys[:k]), None)


def _once(flag: str, names: list[str]) -> None:
    """OptionError where a list names one thing twice: its generations would share one record key
    (the report and ``rapid sim`` would merge them, rounds and all)."""
    k = _repeat(names)
    if k is not None:
        raise OptionError(f"{flag} names {names[k]!r} twice: its runs would share their records' key "
                          "(--repeats runs more; two bench runs compare orders)")


def main_bench(argv: list[str]) -> int:
    a = bench_parser().parse_args(argv)
    out = Path(a.out or f"bench-out/{time.strftime('%Y%m%d-%H%M%S')}")
    if a.report_only:
        if not (out / "runs.jsonl").is_file():
            raise OptionError(f"--report-only: no runs.jsonl in {out} (--out names a rapid bench output folder)")
        files = write_report(out)
        print("\n".join(str(p) for p in files.values()))
        return 0
    cfg = bench_config(a, out)
    t0 = time.perf_counter()
    run_bench(cfg)
    files = write_report(out)
    print(f"rapid bench: {time.perf_counter() - t0:.0f}s; wrote", file=sys.stderr)
    for p in files.values():
        print(p)
    return 0


def sim_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="rapid sim", description="discrete-event simulator calibrated from "
                                 "rapid bench traces (same policy objects as the runtime)")
    ap.add_argument("--traces", action="append", required=True, help="rapid bench output folder (repeatable)")
    ap.add_argument("--out", help="output folder (default <first traces>/sim)")
    ap.add_argument("--preset", help="deployment regime(s) from published measurements instead of the traced "
                    "timing: all or a comma list of " + ", ".join(PRESETS) + " (acceptance still replayed from "
                    "--traces; --profiles then takes " + ", ".join(NET_PROFILES) + "; docs/bench.md)")
    ap.add_argument("--gpu-profile", help="JSON {\"nodes\": [...], \"seconds\": [...]}: cloud verify time model")
    ap.add_argument("--policies", help="comma list (default: every drafting policy in POLICIES)")
    ap.add_argument("--contention", help="comma list of schedules to simulate (default: the traced ones)")
    ap.add_argument("--profiles", help="comma list of network profiles (default: the traced ones)")
    ap.add_argument("--tokens", type=int, default=256, help=f"tokens per simulated generation (1..{MAX_SIM_TOKENS})")
    ap.add_argument("--seeds", type=int, default=5, help="simulated generations per cell (seeds 0..n-1)")
    ap.add_argument("--edges", default="1,4,16,64,256", help="comma list of edge counts for the scale study")
    ap.add_argument("--max-batch", type=int, default=64)
    ap.add_argument("--replicas", default="1", help="comma list of verifier replica counts for the scale study "
                    "(rapid serve --replicas; edges spread evenly)")
    ap.add_argument("--cloud-elsewhere", action="store_true",
                    help="simulate the policies with the cloud on its own machine: none of the one-host "
                    "co-location tax the traces show (validation still replays the bench's one host)")
    ap.add_argument("--ingress-ms", type=float, default=0.0,
                    help="extra round trip of the Ray Serve ingress hop, added when replicas > 1 (docs/scale-out.md)")
    return ap


def _counts(flag: str, text: str) -> list[int]:
    """A comma list of counts >= 1 (``--edges 1,4,16``), or OptionError naming ``flag``."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise OptionError(f"{flag} wants a comma list of whole numbers, got {text!r}") from None
    if not values or min(values) < 1:
        raise OptionError(f"{flag} wants counts >= 1, got {text!r}")
    return values


def _names(flag: str, text: str | None) -> list[str] | None:
    """A comma list of names (``--policies a,b``) without empty ones, None when the flag is not
    given; OptionError if it is given but names nothing."""
    if text is None:
        return None
    names = _csv(text)
    if not names:
        raise OptionError(f"{flag} wants a comma list of names, got {text!r}")
    return names


def _check_sim_options(a: argparse.Namespace) -> None:
    """``rapid sim``'s options, one line each before any trace is read; ``--edges`` and
    ``--replicas`` are parsed here once, into lists of counts, ``--policies``, ``--contention``
    and ``--profiles`` into lists of names (None: the default), ``--preset`` into presets."""
    a.edges, a.replicas = _counts("--edges", a.edges), _counts("--replicas", a.replicas)
    for flag, value in (("--tokens", a.tokens), ("--seeds", a.seeds), ("--max-batch", a.max_batch)):
        if value < 1:
            raise OptionError(f"{flag} must be >= 1, got {value}")
    if a.tokens > MAX_SIM_TOKENS:  # the time grows with it: 256 tokens take ~20 s on 2 cores
        raise OptionError(f"--tokens must be <= {MAX_SIM_TOKENS}, got {a.tokens}")
    if not (math.isfinite(a.ingress_ms) and a.ingress_ms >= 0):
        raise OptionError(f"--ingress-ms must be a finite number >= 0, got {a.ingress_ms}")
    _check_sim_lists(a)
    for t in a.traces:  # each a bench output folder (its records are checked as they are read)
        check_traced_folder(t)
    k = _repeat([Path(t).resolve() for t in a.traces])
    if k is not None:  # pooled with itself, every generation would share its key twice
        raise OptionError(f"--traces names {a.traces[k]} twice")
    if a.gpu_profile is not None:
        load_gpu_profile(a.gpu_profile)


def _check_sim_lists(a: argparse.Namespace) -> None:
    """``--policies``, ``--contention``, ``--profiles`` into lists of known names (None: the
    default), ``--preset`` into presets (None: the traced timing)."""
    a.policies, a.contention, a.profiles = (_names(flag, getattr(a, flag[2:])) for flag in
                                            ("--policies", "--contention", "--profiles"))
    for name in a.policies or []:
        try:
            get_policy(name)
        except ValueError as e:
            raise OptionError(f"--policies: {e}") from None
    for spec in a.contention or []:
        parse_schedule(spec)
    if a.preset is not None:
        spec = a.preset
        try:
            a.preset = parse_presets(spec)
        except ValueError as e:
            raise OptionError(f"--preset: {e}") from None
        if not a.preset:
            raise OptionError(f"--preset wants all or a comma list of {', '.join(PRESETS)}, got {spec!r}")
    for name in a.profiles or []:
        try:
            (net_profile if a.preset else get_profile)(name)
        except OptionError as e:
            raise OptionError(f"--profiles: {e}" + (f" (with --preset also {', '.join(NET_PROFILES)})"
                                                    if a.preset else "")) from None


def main_sim(argv: list[str]) -> int:
    a = sim_parser().parse_args(argv)
    _check_sim_options(a)
    return run_sim_cli(a)
