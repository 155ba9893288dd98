"""Chaos soak: edges against a cloud on loopback while faults are injected; bounded; reports.

    python scripts/chaos_soak.py --minutes M --edges E --seed S --out DIR

Real processes only. The cloud is a ``rapid serve`` process on a tiny float64 target; ``E`` edge
slots each run ``rapid generate`` processes back to back (tiny drafts, every policy, greedy and
seeded sampling, random trees), half of them through a fault proxy. On a schedule drawn from
``--seed`` the soak injects:

    cloud_kill      kill -9 of the cloud, restarted on the same port
    cloud_drain     SIGTERM of the cloud (its graceful drain), restarted on the same port
    replica_kill    kill -9 of one verifier replica (``--replicas N``: rapid serve on Ray Serve; Serve
                    restarts it, its sessions fail over and re-prefill on another replica)
    cloud_freeze    SIGSTOP of the cloud for 1-8 s, then SIGCONT (a GC pause, a VM migration)
    edge_kill       kill -9 of an edge process that has streamed part of its output
    proxy_cut_all   every connection through the proxy aborted at once
    blackhole       one proxied connection made half-open: open, but nothing crosses it
    rogue_<case>    a malformed frame (or session abuse) sent straight to the cloud
    (and per proxied message: cut, dup, delay with the --cut/--dup/--delay probabilities)

New runs start until ``--minutes`` are up (or, with ``--min-identical N``, until N runs have
finished, for at most as long again); runs in flight then finish (each bounded by
``--run-timeout``: a run still going then is a hang). After the grace period the cloud's
``rapid_sessions_active`` must be 0. Writes DIR/report.json, prints a markdown table, and exits
1 if any check fails: a hang, a finished run that differs from target-only decoding, a failure
that is not a clean one-line error, a leaked session, a rogue frame without its error answer.
The schedule is seeded; what each fault hits depends on timing and is not reproducible exactly.

``--secure`` runs the production shape: ``wss://`` with a self-signed certificate and the token
on both hops (edge → proxy → cloud, edge → cloud), the rogue client included, plus a rogue case
without the token that must get HTTP 401 (``chaos_net.Secure``).
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import os
import platform
import random
import signal
import sys
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path

import chaos_edges as edges
import chaos_report as report
from chaos_net import Cloud, FaultProxy, Secure, metric, rogue, rogue_cases, rss_kb

import rapid
import rapid.runtime
import rapid.server
from rapid.core.procs import free_port

WINDOWS = {"cloud_kill": (0.15, 0.7), "cloud_drain": (0.1, 0.8), "replica_kill": (0.1, 0.85), "cloud_freeze": (0.05, 0.9), "edge_kill": (0.05, 0.95), "proxy_cut_all": (0.05, 0.95),
           "blackhole": (0.05, 0.9), "rogue": (0.02, 0.98)}


class Soak:
    def __init__(self, args, models: dict, jobs: list, out: Path) -> None:
        self.args, self.models, self.jobs, self.out = args, models, jobs, out
        self.rng_runs = random.Random(args.seed * 7919 + 1)
        self.t0 = time.monotonic()
        self.end = self.t0 + args.minutes * 60
        extra = ["--dtype", "float64", "--grace", str(args.grace), "--max-sessions", str(max(16, 3 * args.edges)),
                 "--idle-timeout", "120", "--max-batch", "4"]
        self.secure = Secure.make(out / "secure") if args.secure else None
        self.cloud = Cloud(models["target"], free_port(), extra, out, self.t0, self.secure, args.replicas)
        self.proxy = FaultProxy(self.cloud.url, random.Random(args.seed + 1), args.cut, args.dup, args.delay,
                                secure=self.secure)
        self.runs: list[dict] = []
        self.live: dict[int, dict] = {}
        self.faults: Counter = Counter()
        self.rogue: list[dict] = []
        self.rss: list[list] = []
        self.injector_errors: list[str] = []
        self.timeline: list[list] = []  # [seconds, fault, note] as injected
        self._next = 0
        self.phases: dict[str, float] = {}  # seconds spent: cloud start + references, runs, leak check

    def injected(self, kind: str, note: str = "") -> None:
        self.faults[kind] += 1
        self.timeline.append([self.now(), kind, note])

    def launching(self) -> bool:
        """New runs start until --minutes are up, then on (for at most as long again) while fewer
        than --min-identical runs have finished: a loaded machine cannot make the check vacuous."""
        t = time.monotonic()
        if t < self.end:
            return True
        short = sum(1 for r in self.runs if r["outcome"] == "identical") < self.args.min_identical
        return short and t < self.end + max(60.0, self.args.minutes * 60)

    def over(self) -> bool:
        """No run is in flight and none will start: a fault would hit nothing."""
        return not self.launching() and not self.live

    def now(self) -> float:
        return round(time.monotonic() - self.t0, 2)

    # -- edges -------------------------------------------------------------------------------

    async def edge_slot(self) -> None:
        while self.launching():
            spec = edges.make_run(self.rng_runs, self._next, len(self.jobs))
            self._next += 1
            await self.run_edge(spec)

    async def run_edge(self, spec: edges.RunSpec) -> None:
        job = self.jobs[spec.job]
        url = self.proxy.url if spec.route == "proxy" else self.cloud.url
        argv = edges.generate_argv(spec, job, self.models[spec.draft], url)
        if self.secure:
            argv += self.secure.edge_flags()
        out_p, err_p = self.out / "runs" / f"{spec.index:05d}.out", self.out / "runs" / f"{spec.index:05d}.err"
        t = time.monotonic()
        with open(out_p, "wb") as fo, open(err_p, "wb") as fe:
            proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "rapid.cli", *argv, stdout=fo, stderr=fe)
        live = self.live[spec.index] = {"proc": proc, "out": out_p, "killed": False}
        hung = False
        try:
            rc = await asyncio.wait_for(proc.wait(), self.args.run_timeout)
        except TimeoutError:
            hung, rc = True, None
            proc.kill()
            await proc.wait()
        del self.live[spec.index]
        stdout, stderr = out_p.read_text(errors="replace"), err_p.read_text(errors="replace")
        outcome, detail = edges.classify(rc, stdout, stderr, job, spec.policy, killed=live["killed"], hung=hung)
        self.runs.append({**asdict(spec), "start_s": round(t - self.t0, 2), "wall_s": round(time.monotonic() - t, 2),
                          "rc": rc, "outcome": outcome, "detail": detail,
                          "reconnects": stderr.count("cloud link lost")})
        if outcome == "identical":
            out_p.unlink()
            err_p.unlink()

    # -- faults ------------------------------------------------------------------------------

    def schedule(self) -> list[tuple[float, str]]:
        rng, span = random.Random(self.args.seed), self.args.minutes * 60
        every = {"cloud_kill": self.args.cloud_kill_every, "cloud_drain": self.args.drain_every,
                 "replica_kill": self.args.replica_kill_every if self.args.replicas else 0,
                 "cloud_freeze": self.args.freeze_every,
                 "edge_kill": self.args.edge_kill_every,
                 "proxy_cut_all": self.args.cut_all_every, "blackhole": self.args.blackhole_every,
                 "rogue": self.args.rogue_every}
        plan = []
        for kind, interval in ((k, v) for k, v in every.items() if v > 0):  # 0 = this fault is off
            lo, hi = WINDOWS[kind]
            plan += [(rng.uniform(lo, hi) * span, kind) for _ in range(max(1, round(span / interval)))]
        return sorted(plan)

    async def inject_all(self) -> None:
        """Each event when due. A fault waits until it has something to hit, but at most one of a
        kind waits at a time (a later one is skipped), so faults never pile up on one victim."""
        rng, tasks, waiting = random.Random(self.args.seed + 2), [], {}
        cases = rogue_cases(rng, self.secure is not None)
        for at, kind in self.schedule():
            await asyncio.sleep(max(0.0, self.t0 + at - time.monotonic()))
            if kind == "rogue":
                case = rng.choice(sorted(cases))
                tasks.append(asyncio.create_task(self._guard(kind, self.inject_rogue(case, cases[case]))))
                cases = rogue_cases(rng, self.secure is not None)
            elif kind in waiting and not waiting[kind].done():
                self.faults[kind + "_skipped"] += 1
            else:
                waiting[kind] = asyncio.create_task(self._guard(kind, getattr(self, "inject_" + kind)(rng)))
                tasks.append(waiting[kind])
        await asyncio.gather(*tasks)

    async def _guard(self, kind: str, injection) -> None:
        """A bug in the soak's own fault code is recorded (and fails the soak), never fatal to it."""
        try:
            await injection
        except Exception as e:
            self.injector_errors.append(f"{kind} at {self.now():.0f}s: {type(e).__name__}: {e}")

    async def inject_cloud_kill(self, rng: random.Random) -> None:
        while not self.cloud.uptime() >= self.args.min_uptime:  # edges get to use each incarnation
            if self.over():
                self.faults["cloud_kill_skipped"] += 1
                return
            await asyncio.sleep(0.2)
        await self.cloud.kill9()
        self.injected("cloud_kill")
        await self.cloud.start()

    async def inject_cloud_drain(self, rng: random.Random) -> None:
        while not self.cloud.uptime() >= self.args.min_uptime:
            if self.over():
                self.faults["cloud_drain_skipped"] += 1
                return
            await asyncio.sleep(0.2)
        seconds = await self.cloud.drain()
        self.injected("cloud_drain", f"exited {seconds:.1f} s after SIGTERM")
        await self.cloud.start()

    async def inject_replica_kill(self, rng: random.Random) -> None:
        """SIGKILL one verifier replica while runs are in flight (Serve starts a new one).

        Only while at least two replicas serve (the ingress's ``rapid_replicas_live``, the ones
        that answered its /metrics call): a replica process that is still loading counts in
        ``replica_pids`` but not there, and killing the last serving one while its replacement
        loads is an outage of the soak's own making, not a failover."""
        async def kill_one() -> bool:
            pids = self.cloud.replica_pids()
            if not self.live or len(pids) < 2 or await self._replicas_serving() < 2:
                return False
            try:
                os.kill(rng.choice(pids), signal.SIGKILL)
            except OSError:  # it died on its own just now: try again
                return False
            return True

        await self._when_possible("replica_kill", kill_one)

    async def _replicas_serving(self) -> int:
        live = await asyncio.to_thread(metric, self.cloud.port, "rapid_replicas_live", 5.0, self.secure)
        return int(live or 0)

    async def inject_cloud_freeze(self, rng: random.Random) -> None:
        while not self.cloud.up.is_set():
            if self.over():
                self.faults["cloud_freeze_skipped"] += 1
                return
            await asyncio.sleep(0.2)
        proc, seconds = self.cloud.proc, rng.uniform(1.0, 8.0)
        proc.send_signal(signal.SIGSTOP)
        self.injected("cloud_freeze", f"{seconds:.1f} s")
        try:
            await asyncio.sleep(seconds)
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)

    async def _when_possible(self, kind: str, act) -> None:
        """Inject ``kind`` as soon as ``act()`` (plain or a coroutine function) finds something to
        hit: polled until it does, or until the soak is over (no run in flight and none to come):
        then it counts as skipped."""
        while not self.over():
            done = act()
            if inspect.isawaitable(done):
                done = await done
            if done:
                self.injected(kind)
                return
            await asyncio.sleep(0.2)
        self.faults[kind + "_skipped"] += 1

    async def inject_edge_kill(self, rng: random.Random) -> None:
        await self._when_possible("edge_kill", lambda: self._kill_an_edge(rng))

    async def inject_proxy_cut_all(self, rng: random.Random) -> None:
        await self._when_possible("proxy_cut_all", self.proxy.cut_all)

    async def inject_blackhole(self, rng: random.Random) -> None:
        await self._when_possible("blackhole", lambda: self.proxy.blackhole(rng))

    def _kill_an_edge(self, rng: random.Random) -> bool:
        """SIGKILL an edge that has streamed output (it is mid-generation); False if none has."""
        busy = [v for v in self.live.values() if not v["killed"] and v["out"].stat().st_size > 0]
        if not busy:
            return False
        victim = rng.choice(busy)
        try:
            victim["proc"].kill()
        except ProcessLookupError:  # it exited on its own just now
            return False
        victim["killed"] = True
        return True

    async def inject_rogue(self, case: str, messages: list) -> None:
        before, was_up = len(self.cloud.incarnations), self.cloud.up.is_set()
        kills = self.faults["replica_kill"]
        result = await rogue(self.cloud.url, case, messages, self.secure)
        if result["outcome"] != "ok":  # a wrong answer, silence, a dropped or refused connection:
            result["raw"] = result["outcome"]
            disturbed = (not was_up or len(self.cloud.incarnations) != before or not self.cloud.up.is_set()
                         or self.faults["replica_kill"] != kills)  # its replica may have been the one killed
            result["outcome"] = "cloud_down" if disturbed else "anomaly"  # ...the rogue's doing unless killed
        result["at_s"] = self.now()
        self.rogue.append(result)
        self.injected(f"rogue_{case}", result["outcome"])

    async def sample_rss(self) -> None:
        """RSS of the cloud every --rss-every s; a progress line on stderr every 30 s."""
        last = 0.0
        while True:
            if self.now() - last >= 30:
                last = self.now()
                done = Counter(r["outcome"] for r in self.runs)
                print(f"[chaos_soak {last:.0f}s] runs {dict(done)}, in flight {len(self.live)}, "
                      f"faults {sum(self.faults.values())}", file=sys.stderr, flush=True)
            if self.cloud.up.is_set():  # with replicas: the replicas' RSS, summed
                pids = self.cloud.replica_pids() if self.cloud.replicas else [self.cloud.proc.pid]
                kb = sum(rss_kb(pid) or 0 for pid in pids)
                if kb:
                    self.rss.append([self.now(), self.cloud.incarnations[-1]["n"], kb])
            await asyncio.sleep(self.args.rss_every)

    # -- the whole soak ----------------------------------------------------------------------

    async def run(self) -> dict:
        sampler = injector = None
        try:
            starting = asyncio.create_task(self.cloud.start())
            await asyncio.to_thread(edges.add_references, self.jobs, self.models["target"])  # meanwhile
            await starting
            self.phases["setup_s"] = round(time.monotonic() - self.t0, 1)
            self.t0 = self.cloud.t0 = time.monotonic()  # the soak's clock starts once the cloud is up
            self.cloud.incarnations[0]["up_at_s"] = 0.0
            self.end = self.t0 + self.args.minutes * 60
            await self.proxy.start()
            sampler = asyncio.create_task(self.sample_rss())
            injector = asyncio.create_task(self.inject_all())
            await asyncio.gather(*(self.edge_slot() for _ in range(self.args.edges)))
            await injector  # every event is due by now; a cloud restart under way completes
            await asyncio.wait_for(self.cloud.up.wait(), 180)  # a restart under way completes
            self.phases["runs_s"] = self.now()
            leak = await self.leak_check()
            self.phases["leak_check_s"] = round(self.now() - self.phases["runs_s"], 1)
        finally:
            for task in (sampler, injector):
                if task is not None:
                    task.cancel()
            for live in self.live.values():  # only when the soak itself failed or was interrupted
                if live["proc"].returncode is None:
                    live["proc"].kill()
            if self.proxy.url:
                await self.proxy.close()
            await self.cloud.stop()
        return report.summarize(self.runs, self.faults, self.proxy.events, self.rogue, self.cloud.incarnations,
                                self.rss, leak)

    async def leak_check(self) -> dict:
        """Sessions left after the grace period. A rogue session vanishes first, so there is at
        least one detached session for the reaper to free (the check is never vacuous)."""
        port = self.cloud.port
        if self.secure:  # at least once, whatever the schedule drew: no token, no upgrade
            await self.inject_rogue("no_token", [])
        case = "bad_tree_then_vanish"
        await self.inject_rogue(case, rogue_cases(random.Random(self.args.seed + 3))[case])
        before = await asyncio.to_thread(metric, port, "rapid_sessions_active", 5.0, self.secure)
        await asyncio.sleep(self.args.grace + 2.5)  # the reaper runs at least every second
        active = await asyncio.to_thread(metric, port, "rapid_sessions_active", 5.0, self.secure)
        detached = await asyncio.to_thread(metric, port, "rapid_sessions_detached", 5.0, self.secure)
        return {"sessions_before_grace": _int(before), "sessions_active": _int(active),
                "sessions_detached": _int(detached), "cloud_pid": self.cloud.proc.pid}


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=5.0, help="start new runs for this long")
    ap.add_argument("--edges", type=int, default=4, help="concurrent edge processes")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True, help="folder for report.json, cloud logs, failed runs' output")
    ap.add_argument("--min-identical", type=int, default=0,
                    help="go on past --minutes (at most as long again) until this many runs finished")
    ap.add_argument("--jobs", type=int, default=12, help="distinct (prompt, length, sampling) jobs")
    ap.add_argument("--run-timeout", type=float, default=150.0, help="a run still going after this is a hang")
    ap.add_argument("--grace", type=float, default=4.0, help="the cloud's --grace (resume window), seconds")
    ap.add_argument("--cloud-kill-every", type=float, default=60.0, help="mean seconds between cloud kills (0 = off, for each fault)")
    ap.add_argument("--drain-every", type=float, default=0.0,
                    help="mean seconds between cloud drains (SIGTERM, then a restart; 0 = off)")
    ap.add_argument("--replicas", type=int, default=0,
                    help="serve on Ray Serve with this many verifier replicas (>= 2); the whole-cloud faults "
                         "(kill, drain, freeze) are then off and replica kills on")
    ap.add_argument("--replica-kill-every", type=float, default=30.0, help="mean seconds between replica kills")
    ap.add_argument("--secure", action="store_true",
                    help="wss:// with a self-signed certificate and the token on every hop")
    ap.add_argument("--min-uptime", type=float, default=15.0,
                    help="a cloud kill waits until the cloud has been up this long")
    ap.add_argument("--freeze-every", type=float, default=30.0, help="mean seconds between cloud freezes")
    ap.add_argument("--edge-kill-every", type=float, default=15.0)
    ap.add_argument("--cut-all-every", type=float, default=15.0)
    ap.add_argument("--blackhole-every", type=float, default=60.0,
                    help="mean seconds between half-open connections (0 = off)")
    ap.add_argument("--rogue-every", type=float, default=4.0)
    ap.add_argument("--cut", type=float, default=0.004, help="per proxied message: abort the connection")
    ap.add_argument("--dup", type=float, default=0.02, help="per proxied message: send it twice")
    ap.add_argument("--delay", type=float, default=0.05, help="per proxied message: hold it up to 20 ms")
    ap.add_argument("--rss-every", type=float, default=1.0, help="seconds between RSS samples")
    args = ap.parse_args(argv)
    if args.replicas:  # the driver process holds the Ray cluster: killing or freezing it is not a cloud fault
        if args.replicas < 2:
            ap.error("--replicas needs at least 2 (one to fail over to)")
        args.cloud_kill_every = args.drain_every = args.freeze_every = 0.0
    if args.minutes <= 0 or args.edges < 1 or args.jobs < 1 or args.run_timeout <= 0:
        ap.error("--minutes, --edges, --jobs and --run-timeout must be positive")
    return args


def code_root() -> Path:
    """The one source tree every layer is imported from (the children are given the same)."""
    roots = {Path(m.__file__).resolve().parents[1] for m in (rapid, rapid.runtime, rapid.server)}
    if len(roots) != 1:
        raise SystemExit(f"chaos_soak: rapid's layers come from different trees {sorted(map(str, roots))}; "
                         "the edges and the cloud would not run the code under test")
    return roots.pop()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    root = str(code_root())
    out = Path(args.out)
    (out / "runs").mkdir(parents=True, exist_ok=True)
    # every child (cloud, edges) runs the very package this process imported, single-threaded
    os.environ["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])])
    os.environ.update(OMP_NUM_THREADS="1", PYTHONIOENCODING="utf-8")
    t0 = time.monotonic()
    models = edges.build_models(out / "models")
    jobs = edges.make_jobs(random.Random(args.seed), args.jobs)
    soak = Soak(args, models, jobs, out)
    bound = args.minutes * 60 + args.run_timeout + 420  # set-up, restarts, the grace: never unbounded
    summary = asyncio.run(asyncio.wait_for(soak.run(), bound))
    config = {**vars(args), "code": root, "python": platform.python_version(),
              "machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
              "wall_s": round(time.monotonic() - t0, 1), "phases": soak.phases}
    bad = report.failures(summary) + [f"the soak's injector failed: {e}" for e in soak.injector_errors[:5]]
    result = {"config": config, "summary": summary, "failures": bad, "passed": not bad, "injector_errors": soak.injector_errors,
              "runs": soak.runs, "timeline": soak.timeline, "rogue": soak.rogue, "rss": soak.rss}
    (out / "report.json").write_text(json.dumps(result, indent=1))
    print(report.markdown(summary, config))
    print("\nPASS" if not bad else "\nFAIL: " + "; ".join(bad))
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
