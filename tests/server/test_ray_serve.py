"""Cloud scale-out on a real local Ray cluster: 2 verifier replicas behind the websocket ingress
(wss, token), 8 concurrent edges (real CloudLink + Coordinator), each cut and resumed (sticky:
same session id, so same replica), one replica killed mid-generation (its sessions fail over and
re-prefill), every output identical to the target alone; then a replica drained mid-generation
(Serve replaces it; it keeps serving its attached sessions until they end: no re-prefill).
If Ray cannot start, the test fails.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter

import pytest

from rapid.core.auth import client_ssl_context, write_self_signed
from rapid.core.sampling import SamplingParams
from rapid.core.wire import Hello
from rapid.engines.torch_engine import TorchEngine
from rapid.runtime.coordinator import Coordinator, CoordinatorConfig
from rapid.runtime.drafter import Drafter
from rapid.runtime.link import CloudError, CloudLink
from rapid.runtime.policies import POLICIES
from rapid.runtime.tree import TreeParams
from rapid.server.scale_config import ScaleOut, replica_of
from rapid.server.serve_config import Limits, VerifierSpec
from rapid.server.target import reference_decode
from rapid.tiny import EOS_ID

TOKEN = "ray-test-token"
EDGES, MAX_NEW, CUT_AT, PAUSE_AT = 8, 40, 2, 4


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ray_processes(temp_dir: str) -> list[str]:
    """Command lines of live processes that belong to the Ray cluster under ``temp_dir``."""
    out = []
    for d in os.listdir("/proc"):
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if temp_dir in cmd:
            out.append(f"{d}: {cmd[:120]}")
    return out


def test_rapid_serve_replicas_cli(tiny_dir, tiny_pair, tmp_path):
    """`rapid serve --replicas 2` as a real process: two edges decode exactly through it, on two
    replicas; SIGINT stops it and every Ray process it started. (Runs before the module's cluster.)"""
    target, drafts = tiny_pair
    temp_dir, port = tempfile.mkdtemp(prefix="rr", dir="/tmp"), _free_port()
    (tmp_path / "token").write_text(TOKEN + "\n")
    cmd = [sys.executable, "-m", "rapid.cli", "serve", "--replicas", "2", "--target", tiny_dir("target", seed=0, dtype="float64"),
           "--dtype", "float64", "--verify", "tree", "--port", str(port), "--token-file", str(tmp_path / "token")]
    proc = subprocess.Popen(cmd, env={**os.environ, "RAY_TMPDIR": temp_dir, "OMP_NUM_THREADS": "1"},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    ready = threading.Event()

    def read():
        for line in proc.stdout:
            lines.append(line)
            if "rapid on Ray Serve: ws://" in line:
                ready.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        if not ready.wait(150):
            pytest.fail("rapid serve --replicas 2 did not come up:\n" + "".join(lines[-30:]))
        assert _ray_processes(temp_dir)  # the cluster it started is seen (so "none left" below means it)
        jobs = _jobs(target, 2, 5)

        async def edges():
            async def one(prompt, sampling):
                link = CloudLink(f"ws://127.0.0.1:{port}", token=TOKEN)
                drafter = Drafter(TorchEngine(drafts["partial"], capacity=1024), TreeParams(3, 8, 2, 2), (EOS_ID,))
                coord = Coordinator(drafter, link, POLICIES["rapid"], CoordinatorConfig(depth=3))
                return (await coord.generate(prompt, MAX_NEW, sampling)).tokens, link.session
            return await asyncio.gather(*(one(p, s) for p, s, _ in jobs))

        got = asyncio.run(edges())
        assert [g[0] for g in got] == [ref for _, _, ref in jobs]
        assert len({replica_of(g[1]) for g in got}) == 2, got  # one session on each replica
    finally:
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(90)
    assert rc == 0, "".join(lines[-30:])
    deadline = time.monotonic() + 20
    while (left := _ray_processes(temp_dir)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, left  # every Ray process of that cluster is gone
    shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def ray_cloud(tiny_dir, tmp_path_factory):
    """A local Ray cluster running the rapid Serve app; torn down (every Ray process) at the end."""
    try:
        import ray
        from ray import serve

        from rapid.server.ray_serve import build_app
    except ImportError as e:
        pytest.fail(f"Ray Serve is not importable (scripts/setup.sh installs the ray extra): {e}")
    cert, key = write_self_signed(tmp_path_factory.mktemp("tls"))
    port = _free_port()
    temp_dir = tempfile.mkdtemp(prefix="rr", dir="/tmp")  # short: Ray's socket paths must fit
    env = {"OMP_NUM_THREADS": "1"}
    if os.environ.get("PYTHONPATH"):  # replicas import the code this test imports (checked below)
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    t0 = time.monotonic()
    try:
        ray.init(address="local", num_cpus=4, include_dashboard=False, runtime_env={"env_vars": env},
                 _temp_dir=temp_dir)
    except Exception as e:
        pytest.fail(f"Ray could not start: {type(e).__name__}: {e}")
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port, "ssl_certfile": cert, "ssl_keyfile": key})
        spec = VerifierSpec(tiny_dir("target", seed=0, dtype="float64"),
                            Limits(max_sessions=16, max_context=512, max_nodes=64, grace_s=20.0),
                            dtype="float64", verify="tree", batch_window_ms=1.0, max_batch=4)
        # min = max = 2: the autoscaling path (sessions policy) runs, the size stays 2
        scale = ScaleOut(replicas=2, min_replicas=2, max_replicas=2, num_cpus=1, health_check_s=1.0,
                         replica_host="127.0.0.1", drain_s=30.0)
        serve.run(build_app(spec, scale, TOKEN), name="rapid", route_prefix="/")
        print(f"\nRay + Serve up in {time.monotonic() - t0:.1f}s")
        assert _ray_processes(temp_dir)
        yield {"url": f"wss://127.0.0.1:{port}", "https": f"https://127.0.0.1:{port}", "cert": cert,
               "ray": ray, "serve": serve}
    finally:
        serve.shutdown()
        ray.shutdown()
        deadline = time.monotonic() + 20
        while (left := _ray_processes(temp_dir)) and time.monotonic() < deadline:
            time.sleep(0.5)
        shutil.rmtree(temp_dir, ignore_errors=True)
        assert not left, left  # every Ray process of the test cluster is gone


class Plan:
    """Every edge pauses after verdict PAUSE_AT until the test has killed a replica."""

    def __init__(self, n: int) -> None:
        self.n, self.waiting = n, 0
        self.all_paused, self.resume = asyncio.Event(), asyncio.Event()

    def arrive(self) -> None:
        self.waiting += 1
        if self.waiting == self.n:
            self.all_paused.set()


class ScriptedLink(CloudLink):
    """Cuts its connection after verdict ``cut_at`` (then resumes), pauses after PAUSE_AT."""

    def __init__(self, url, plan: Plan, cut_at: int | None, **kw) -> None:
        super().__init__(url, **kw)
        self.plan, self.cut_at, self.rounds, self.before_cut = plan, cut_at, 0, None

    async def verdict(self, round_id):
        v = await super().verdict(round_id)
        self.rounds += 1
        if self.rounds == 1:
            self.first = self.session
        if self.rounds == self.cut_at:
            self.before_cut = self.session
            self._ws.transport.abort()  # a dropped connection: the next round reconnects
        if self.rounds == PAUSE_AT:
            self.plan.arrive()
            await self.plan.resume.wait()
        return v


def _jobs(target, n: int, seed: int):
    """n (prompt, sampling) whose target-only output runs the full MAX_NEW (no early EOS)."""
    rng, jobs = random.Random(seed), []
    while len(jobs) < n:
        prompt = [rng.randrange(256) for _ in range(rng.randint(2, 16))]
        sampling = SamplingParams() if len(jobs) % 2 else SamplingParams(temperature=0.8, top_p=0.9, seed=len(jobs))
        ref = reference_decode(target, prompt, MAX_NEW, sampling, (EOS_ID,))
        if len(ref) == MAX_NEW:
            jobs.append((prompt, sampling, ref))
    return jobs


def _kill_replica(ray, uid: str) -> None:
    names = [a for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].endswith(uid)]
    assert len(names) == 1, names
    ray.kill(ray.get_actor(names[0]["name"], namespace=names[0]["namespace"]), no_restart=True)


def _get(url: str, cafile: str, token: str | None = None) -> tuple[int, str]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=30, context=ssl.create_default_context(cafile=cafile)) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, ""


async def _run_edges(cloud, drafts, jobs, at_pause, cut_at: int | None):
    """Run one edge per job; when all have paused, call ``at_pause(sessions per replica)`` in a
    thread, then let them finish. Returns (outputs, links, sessions per replica, at_pause's result)."""
    plan = Plan(len(jobs))
    links = [ScriptedLink(cloud["url"], plan, cut_at, token=TOKEN, ssl=client_ssl_context(cloud["url"], cloud["cert"]),
                          retry_timeout=5.0, backoff_s=0.05, backoff_max_s=0.5, max_retry_s=60.0,
                          rng=random.Random(i)) for i in range(len(jobs))]

    async def edge(i, link):
        drafter = Drafter(TorchEngine(drafts["partial"], capacity=1024), TreeParams(3, 8, 2, 2), (EOS_ID,))
        policy = sorted(POLICIES)[i % len(POLICIES)]
        coord = Coordinator(drafter, link, POLICIES[policy], CoordinatorConfig(depth=3))
        return (await coord.generate(jobs[i][0], MAX_NEW, jobs[i][1])).tokens

    async def conductor():
        await asyncio.wait_for(plan.all_paused.wait(), 120)
        held = Counter(replica_of(link.session) for link in links)
        result = await asyncio.get_running_loop().run_in_executor(None, at_pause, held)
        plan.resume.set()
        return held, result

    *outs, (held, result) = await asyncio.gather(*(edge(i, lk) for i, lk in enumerate(links)), conductor())
    for (_, _, ref), out, link in zip(jobs, outs, links, strict=True):
        assert out == ref, link.stats  # identical to the target alone
    return links, held, result


def test_two_replicas_sticky_sessions_and_failover_are_exact(ray_cloud, tiny_pair):
    target, drafts = tiny_pair
    ray, serve = ray_cloud["ray"], ray_cloud["serve"]

    def kill_busiest(held):
        victim = held.most_common(1)[0][0]
        _kill_replica(ray, victim)
        return victim

    t0 = time.monotonic()
    links, held, victim = asyncio.run(_run_edges(ray_cloud, drafts, _jobs(target, EDGES, 13), kill_busiest, CUT_AT))
    print(f"{EDGES} edges, one replica killed: {time.monotonic() - t0:.1f}s; sessions per replica {dict(held)}")
    assert len(held) == 2, held  # new sessions went to both replicas
    for link in links:
        assert link.stats["resumed"] >= 1 and link.before_cut == link.first, link.stats  # sticky resume
        if replica_of(link.first) == victim:
            assert link.stats["reprefilled"] == 1 and replica_of(link.session) != victim, link.stats
        else:  # untouched by the kill: one replica, one session id, from start to end
            assert link.stats["reprefilled"] == 0 and link.session == link.first, link.stats
    _check_metrics(ray_cloud, held[victim], victim)
    _check_auth(ray_cloud)
    _wait_for_replicas(serve, victim)


def test_a_drained_replica_finishes_its_sessions(ray_cloud, tiny_pair):
    """drain(): Serve replaces the replica and stops it gracefully; its attached sessions go on
    to the end on it (no reconnect, no re-prefill), then it exits."""
    target, drafts = tiny_pair
    serve = ray_cloud["serve"]
    handle = serve.get_deployment_handle("Verifier", app_name="rapid")

    def drain_busiest(held):
        victim = held.most_common(1)[0][0]
        assert handle.options(method_name="drain", session_id=victim).remote().result() == victim
        deadline = time.monotonic() + 60
        while _states(serve).get("STOPPING", 0) < 1:  # Serve is stopping it: its drain has begun
            assert time.monotonic() < deadline, _states(serve)
            time.sleep(0.5)
        return victim

    links, held, victim = asyncio.run(_run_edges(ray_cloud, drafts, _jobs(target, 4, 29), drain_busiest, None))
    for link in links:  # nobody reconnected: the drained replica served its sessions to the end
        assert link.stats["reconnects"] == 0 and link.session == link.first, link.stats
    assert held[victim] >= 1
    _wait_for_replicas(serve, victim)


def _check_metrics(cloud, failed_over: int, victim: str) -> None:
    assert _get(cloud["https"] + "/metrics", cloud["cert"])[0] == 401
    assert _get(cloud["https"] + "/health", cloud["cert"]) == (200, "ok\n")
    status, text = _get(cloud["https"] + "/metrics", cloud["cert"], TOKEN)
    assert status == 200
    assert float(re.search(r"^rapid_failovers_total (\S+)", text, re.M).group(1)) == failed_over
    assert float(re.search(r'^rapid_ingress_routed_total\{kind="sticky"\} (\S+)', text, re.M).group(1)) >= EDGES
    replicas = set(re.findall(r'^rapid_spec_decode_num_rounds_total\{replica="([^"]+)"\}', text, re.M))
    assert replicas and victim not in replicas, replicas
    reprefilled = re.findall(r'^rapid_sessions_total\{kind="reprefilled",replica="[^"]+"\} (\S+)', text, re.M)
    assert sum(map(float, reprefilled)) == failed_over, reprefilled
    assert re.search(r'^rapid_sessions_active\{replica="[^"]+"\} ', text, re.M)


def _check_auth(cloud) -> None:
    async def run():
        link = CloudLink(cloud["url"], token="wrong", ssl=client_ssl_context(cloud["url"], cloud["cert"]))
        with pytest.raises(CloudError) as e:
            await link.open(Hello([1, 2, 3]))
        assert e.value.code == "unauthorized"  # HTTP 401 from the ingress, before any frame

    asyncio.run(run())


def _states(serve) -> dict:
    return dict(serve.status().applications["rapid"].deployments["Verifier"].replica_states)


def _wait_for_replicas(serve, gone: str) -> None:
    """Serve is back at 2 running replicas, none of them ``gone``; they run this worktree's code."""
    import rapid.server

    deadline = time.monotonic() + 90
    while (states := _states(serve)) != {"RUNNING": 2}:
        if time.monotonic() > deadline:
            pytest.fail(f"the deployment did not return to 2 running replicas: {states}")
        time.sleep(0.5)
    handle = serve.get_deployment_handle("Verifier", app_name="rapid")
    infos = [handle.options(method_name="describe").remote().result() for _ in range(6)]
    assert gone not in {i["replica"] for i in infos}
    assert {i["module"] for i in infos} == {rapid.server.__file__}, infos
