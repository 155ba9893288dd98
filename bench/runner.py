"""Real runs: policies × prompt sets × contention schedules × network profiles.

The cloud is a separate process (``python -m rapid.bench.cloud``, i.e. ``rapid serve`` with
optional transport-delay emulation) pinned to one core; the edge drafts in this process,
pinned to the other core together with the co-running load process. Every policy sees the same
prompts, schedule (restarted at the start of each generation) and profile; policies run
interleaved (A B A B …) inside each repeat.

Output folder:
    rounds.jsonl   one row per round: RoundRecord fields + run metadata + contention state
    runs.jsonl     one row per generation: telemetry Summary + metadata + token digest
    meta.json      the configuration, the network mode and the machine
    warmup.jsonl   the warm-up generations' rounds (uncontended; not in the results): the
                   simulator's uncontended step reference when every recorded round ran loaded
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rapid import models
from rapid.bench import netem
from rapid.bench.contention import LoadProcess, Schedule, load_device_for, parse_schedule, pin
from rapid.bench.peers import PEERS, run_peers
from rapid.bench.prompts import load_sets, pick, truncate_ids
from rapid.bench.traces import make_output_folder
from rapid.bench.variants import TREE_OPTIONS, variant_configs
from rapid.core.errors import RapidError
from rapid.core.manifest import is_export_dir, load_manifest
from rapid.core.precision import choose_dtype, cpu_flags
from rapid.core.procs import free_port, start_listening, stop_server
from rapid.core.sampling import SamplingParams
from rapid.export.fast_draft import resolve_draft
from rapid.runtime.coordinator import CoordinatorConfig, controller_for
from rapid.runtime.edge_config import DEFAULT, EdgeConfig
from rapid.runtime.generate import open_edge_model
from rapid.runtime.session import EdgeSession
from rapid.runtime.tree import TreeParams
from rapid.tiny import build_tiny


@dataclass(slots=True)
class BenchConfig:
    out: Path
    draft: str = DEFAULT.draft  # the edge commands' defaults: rapid.runtime.edge_config
    target: str = "default-target"
    dtype: str = "auto"  # the target's (rapid.core.precision)
    policies: list[str] = field(default_factory=lambda: ["fixed", "npdg", "rapid"])
    prompts_source: str | None = None
    sets: list[str] | None = None
    n_prompts: int = 1  # per set
    token_budget: int = 96  # prompt tokens kept (the last ones)
    max_new: int = 24
    schedules: list[str] = field(default_factory=lambda: ["none", "sustained", "burst:4:4"])
    profiles: list[str] = field(default_factory=lambda: ["wan"])
    repeats: int = 3
    depth: int = DEFAULT.depth
    budget: int | str = DEFAULT.budget  # or a node count
    topk: int = DEFAULT.topk
    width: int = DEFAULT.width
    lookup: int = DEFAULT.lookup  # prompt-lookup tokens per tree (rapid.runtime.lookup)
    min_p: float = DEFAULT.min_p  # TreeParams.min_p
    branch_roots: int = DEFAULT.branch_roots  # IPDG roots (rapid.runtime.ipdg); every tree option is here
    branch_decay: float = DEFAULT.branch_decay  # IPDG's discount of roots inside the tree
    cost_cut: bool = DEFAULT.cost_cut  # send only the nodes that pay for their verify time (rapid.runtime.tree_cut)
    edge_cpu: int = 0
    cloud_cpu: int = 1
    net: str = "auto"  # auto | netem | transport
    seed: int = 0  # the cloud's and the sampling seed
    temperature: float = 0.0  # 0 = greedy (rapid.core.sampling)
    top_p: float = 1.0
    coupled: bool = True  # under sampling, coupled drafting (rapid.runtime.coupling)
    engine: str = "auto"
    smoke: bool = False
    progress: bool = True
    load_device: str = "auto"  # auto (the edge engine's device) | cpu | cuda
    carry_controller: bool = True  # one depth controller per policy across generations, as the daemon keeps
    peers: bool = False  # also run HF assisted / prompt-lookup generation (rapid.bench.peers)


BENCH_TREE = TREE_OPTIONS  # BenchConfig holds each (a test checks)


def _cpus() -> set[int]:
    try:
        return set(os.sched_getaffinity(0))
    except AttributeError:
        return set(range(os.cpu_count() or 1))


def _start_cloud(target: str, port: int, host: str, cpu: int | None, profile: netem.NetProfile | None,
                 log_path: Path, prefix: list[str], seed: int, dtype: str, timeout: float = 600.0) -> subprocess.Popen:
    cmd = [*prefix, sys.executable, "-m", "rapid.bench.cloud", "--target", target, "--host", host,
           "--port", str(port), "--seed", str(seed), "--dtype", dtype]
    if profile is not None:
        cmd += ["--rtt-ms", str(profile.rtt_ms), "--jitter-ms", str(profile.jitter_ms)]
    return start_listening(cmd, host, port, timeout, log_path, env=dict(os.environ, OMP_NUM_THREADS="1"),
                           cpus=None if cpu is None else {cpu})


def _models(cfg: BenchConfig) -> tuple[str, str]:
    if cfg.smoke:
        root = Path(tempfile.mkdtemp(prefix="rapid-bench-tiny-"))
        target = str(build_tiny(root / "target", seed=0))
        draft = str(build_tiny(root / "draft", seed=1, base_seed=0, perturb=0.05))
        return draft, target
    if cfg.target == "default-target":
        models.fetch_default(("target",))
    return resolve_draft(cfg.draft), models.resolve_model(cfg.target)


def _net_mode(cfg: BenchConfig) -> tuple[str, str]:
    """('netem', '') or ('transport', reason)."""
    if cfg.net == "transport":
        return "transport", "requested with --net transport"
    if all(netem.get_profile(p).rtt_ms == 0 for p in cfg.profiles):
        return "transport", "no delay requested"
    ok, why = netem.probe()
    if ok:
        return "netem", ""
    if cfg.net == "netem":
        raise RapidError(f"--net netem: a netns/netem link cannot be built here: {why}")
    return "transport", why


def run_bench(cfg: BenchConfig) -> Path:
    """Run the matrix; write the output folder; return it."""
    from tqdm import tqdm

    out = make_output_folder(Path(cfg.out))  # before any model loads
    for name in ("rounds.jsonl", "runs.jsonl", "peers.jsonl", "warmup.jsonl"):  # appended to below
        (out / name).unlink(missing_ok=True)
    m = _Matrix.of(cfg)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    old_aff = _cpus()
    pinned = pin(m.edge_cpus)
    edge = open_edge_model(m.draft, cfg.engine, 2048, 1)
    load_device = load_device_for(edge.engine.info.device, cfg.load_device)
    encoded = {k: [(p, truncate_ids(list(edge.tokenizer(p.text)["input_ids"]), cfg.token_budget)) for p in v]
               for k, v in m.chosen.items()}
    meta = _meta(cfg, m, encoded, pinned, edge.engine.info.device, load_device)
    (out / "meta.json").write_text(json.dumps(meta, indent=2))
    n_gen = cfg.repeats * sum(len(v) for v in encoded.values())
    total = n_gen * (len(m.profiles) * len(m.schedules) * len(m.policies) + (len(PEERS) if cfg.peers else 0))
    bar = tqdm(total=total, desc="rapid bench", unit="gen", disable=not cfg.progress, file=sys.stderr)
    try:
        for prof in m.profiles:
            _run_profile(cfg, m, prof, edge, encoded, load_device, out, bar)
        if cfg.peers:
            _peers(cfg, m.draft, m.target, encoded, m.cloud_cpus, bar)
    finally:
        bar.close()
        pin(old_aff)
    return out


@dataclass(slots=True)
class _Matrix:
    """What one bench run sweeps, and where its two processes run."""

    policies: list  # Policy, each named by its spec (rapid.bench.variants)
    schedules: list
    profiles: list
    chosen: dict  # set -> prompts
    cpus: set[int]
    edge_cpus: set[int] | None  # None: not pinned (fewer than two usable cores)
    cloud_cpus: set[int] | None
    net: tuple[str, str]  # (mode, why)
    draft: str
    target: str
    configs: dict[str, EdgeConfig]  # policy (spec) name -> its edge options: the run's + the variant's
    sampling: SamplingParams

    def tree(self, policy_name: str) -> TreeParams:
        return self.configs[policy_name].tree()

    @classmethod
    def of(cls, cfg: BenchConfig) -> _Matrix:
        cpus = _cpus()
        two = len(cpus) >= 2 and cfg.edge_cpu in cpus and cfg.cloud_cpu in cpus and cfg.edge_cpu != cfg.cloud_cpu
        sets = load_sets(cfg.prompts_source, cfg.sets)
        variants = variant_configs(cfg.policies, {n: getattr(cfg, n) for n in BENCH_TREE})
        return cls([p for p, _ in variants], [parse_schedule(s) for s in cfg.schedules],
                   [netem.get_profile(p) for p in cfg.profiles], {k: pick(v, cfg.n_prompts) for k, v in sets.items()},
                   cpus, {cfg.edge_cpu} if two else None, {cfg.cloud_cpu} if two else None, _net_mode(cfg),
                   *_models(cfg), {p.name: c for p, c in variants},
                   SamplingParams(cfg.temperature, cfg.top_p, 0, cfg.seed))


def _meta(cfg: BenchConfig, m: _Matrix, encoded: dict, pinned: bool, edge_device: str, load_device: str) -> dict:
    return {
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items()},
        "draft": m.draft, "target": m.target, "net_mode": m.net[0], "net_fallback_reason": m.net[1],
        "pinned": pinned, "edge_cpus": sorted(m.edge_cpus or []),
        "cloud_cpu": next(iter(m.cloud_cpus)) if m.cloud_cpus else None,
        "cpus": sorted(m.cpus), "machine": platform.platform(), "python": platform.python_version(),
        "prompts": {k: [p.id for p, _ in v] for k, v in encoded.items()},
        "prompt_tokens": {k: [len(ids) for _, ids in v] for k, v in encoded.items()},
        "token_budget": cfg.token_budget, "profiles": {p.name: asdict(p) for p in m.profiles},
        "schedules": {s.name: asdict(s) for s in m.schedules}, "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "chat_template": False, "edge_device": edge_device, "load_device": load_device,
        "controller": ("carried across generations per policy (as the edge daemon keeps it), warmed up "
                       "uncontended" if cfg.carry_controller else "fresh per generation"),
    }


def _run_profile(cfg: BenchConfig, m: _Matrix, prof, edge, encoded: dict, load_device: str, out: Path, bar) -> None:
    """One network profile: start its cloud, warm up, then every schedule × repeat × prompt × policy."""
    mode = m.net[0]
    plan = netem.NetnsPlan()
    if mode == "netem":
        ok, err = netem.setup(prof, plan)
        if not ok:
            raise RapidError(f"netem setup failed: {err}")
        host, prefix, delay_prof = plan.ns_ip, netem.exec_prefix(plan), None
    else:
        host, prefix, delay_prof = "127.0.0.1", [], (prof if prof.rtt_ms > 0 else None)
    port = free_port()
    proc = _start_cloud(m.target, port, host, next(iter(m.cloud_cpus)) if m.cloud_cpus else None, delay_prof,
                        out / f"cloud-{prof.name}.log", prefix, cfg.seed, cfg.dtype)
    url = f"ws://{host}:{port}"
    try:
        ctrls = _warm_up(cfg, m, edge, encoded, url, out)
        for sched in m.schedules:
            with LoadProcess(sched, m.edge_cpus, load_device) as load:
                time.sleep(0.5 if sched.kind != "none" else 0.0)  # the load process imports numpy
                for rep in range(cfg.repeats):
                    for set_name, items in encoded.items():
                        for prompt, ids in items:
                            for pol in (m.policies if rep % 2 == 0 else m.policies[::-1]):
                                bar.set_postfix_str(f"{prof.name} {sched.name} {pol.name} r{rep}")
                                row_meta = {"profile": prof.name, "net_mode": mode, "schedule": sched.name,
                                            "set": set_name, "prompt_id": prompt.id, "repeat": rep,
                                            "prompt_tokens": len(ids)}
                                _one(out, edge, m.tree(pol.name), m.sampling, cfg, pol, url, ids, load, sched, row_meta,
                                     ctrls.get(pol.name))
                                bar.update(1)
    finally:
        stop_server(proc)
        if mode == "netem":
            netem.teardown(plan)


def _warm_up(cfg: BenchConfig, m: _Matrix, edge, encoded: dict, url: str, out: Path) -> dict:
    """Warm-up generations (no load, not in the results; their rounds go to ``warmup.jsonl``):
    first forwards of both models, lazy init, and each carried controller's uncontended latency
    baseline; returns the carried controllers."""
    first = next(iter(encoded.values()))[0][1]
    ctrls = ({p.name: controller_for(p, CoordinatorConfig(depth=m.configs[p.name].depth)) for p in m.policies}
             if cfg.carry_controller else {})
    # one warm-up per policy whose depth reacts to the baseline (plus the first policy)
    warm = [p for i, p in enumerate(m.policies) if i == 0 or (cfg.carry_controller and p.adaptive_depth)]
    for pol in warm:
        with EdgeSession(edge, url, policy=pol, tree=m.tree(pol.name), controller=ctrls.get(pol.name)) as session:
            gen = asyncio.run(session.generate(first, 8 if cfg.carry_controller else 2, m.sampling))
        with open(out / "warmup.jsonl", "a", encoding="utf-8") as f:
            for r in gen.records:
                f.write(json.dumps({**asdict(r), "schedule": "none", "load": 0.0}) + "\n")
    return ctrls


def _peers(cfg: BenchConfig, draft: str, target: str, encoded, cpus: set[int] | None, bar) -> None:
    """HF peers on the cloud's core, the cloud stopped (``rapid.bench.peers``): the draft's PyTorch
    source model (an export's manifest names it), the target's dtype."""
    source = load_manifest(draft)["model"]["resolved"] if is_export_dir(draft) else draft
    dtype = choose_dtype(cfg.dtype, "cpu", cpu_flags()).dtype
    pin(cpus)
    ids = {k: [(p.id, x) for p, x in v] for k, v in encoded.items()}

    def tick(what: str) -> None:
        bar.set_postfix_str(what)
        bar.update(1)

    run_peers(target, source, dtype, ids, cfg.max_new, cfg.repeats, Path(cfg.out), tick)


def _one(out, edge, tree, sampling, cfg, pol, url, ids, load: LoadProcess, sched: Schedule, row_meta,
         controller) -> None:
    with EdgeSession(edge, url, policy=pol, tree=tree, controller=controller) as session:
        load.start_epoch()
        t0 = time.perf_counter()  # the schedule's epoch on the coordinator's clock
        gen = asyncio.run(session.generate(ids, cfg.max_new, sampling))
        load.pause()
    with open(out / "rounds.jsonl", "a", encoding="utf-8") as f:
        for r in gen.records:
            row = asdict(r)
            a, b = r.t_start - t0, r.t_end - t0
            row.update(row_meta)
            row.update(t_rel_start=a, t_rel_end=b, load=sched.load_fraction(a, b),
                       contended=sched.active((a + b) / 2))
            f.write(json.dumps(row) + "\n")
    s = gen.summary
    row = {k: v for k, v in asdict(s).items() if k != "extra"}
    row.update(row_meta)
    lat = [r.t_end - r.t_start for r in gen.records]
    row.update(policy=pol.name, digest=hashlib.sha1(json.dumps(gen.tokens).encode()).hexdigest()[:12],
               per_token_s=s.wall_s / max(s.tokens, 1), round_latencies=lat,
               contended_fraction=(sum(1 for r in gen.records if sched.active((r.t_start + r.t_end) / 2 - t0))
                                   / max(len(gen.records), 1)))
    with open(out / "runs.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")
