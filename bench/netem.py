"""Network profiles, real (netns + veth + tc netem) or emulated in the transport.

Real: the cloud runs in its own network namespace joined to the host by a veth pair; both ends
get a ``tc netem`` qdisc carrying half the round-trip delay (and the jitter, and a rate limit),
so the websocket crosses a real emulated link. When namespaces or the netem qdisc are not
permitted (containers without ``sch_netem``), the bench falls back to a delay inside the
transport: the cloud holds each verdict and Ready for a sampled RTT (``VerifierServer.answer_delay``).
The mode is recorded in every trace row and in the report.
"""

from __future__ import annotations

import random
import shutil
import subprocess
from dataclasses import dataclass

from rapid.core.errors import OptionError


@dataclass(slots=True, frozen=True)
class NetProfile:
    name: str
    rtt_ms: float  # mean round-trip delay
    jitter_ms: float = 0.0  # standard deviation of the RTT
    rate_mbit: float | None = None  # link rate limit (both directions)

    def sample_rtt_s(self, rng: random.Random) -> float:
        return max(0.0, rng.gauss(self.rtt_ms, self.jitter_ms)) / 1000.0


PROFILES: dict[str, NetProfile] = {
    "local": NetProfile("local", 0.0),
    "lan": NetProfile("lan", 2.0),
    "wan": NetProfile("wan", 30.0, 5.0),
    "cellular": NetProfile("cellular", 60.0, 20.0, rate_mbit=10.0),
}


def get_profile(name: str) -> NetProfile:
    try:
        return PROFILES[name]
    except KeyError:
        raise OptionError(f"unknown network profile {name!r}; choose from {', '.join(PROFILES)}") from None


@dataclass(slots=True, frozen=True)
class NetnsPlan:
    ns: str = "rapidbench"
    host_if: str = "rbveth0"
    ns_if: str = "rbveth1"
    host_ip: str = "10.231.0.1"
    ns_ip: str = "10.231.0.2"


def netem_args(profile: NetProfile) -> list[str]:
    """The ``netem`` arguments for one direction (half the RTT and jitter)."""
    args = ["netem", "delay", f"{profile.rtt_ms / 2:g}ms"]
    if profile.jitter_ms > 0:
        args += [f"{profile.jitter_ms / 2:g}ms", "distribution", "normal"]
    if profile.rate_mbit:
        args += ["rate", f"{profile.rate_mbit:g}mbit"]
    return args


def setup_commands(profile: NetProfile, plan: NetnsPlan = NetnsPlan()) -> list[list[str]]:
    """Commands that build the namespace, the veth pair and the netem qdiscs."""
    p = plan
    cmds = [
        ["ip", "netns", "add", p.ns],
        ["ip", "link", "add", p.host_if, "type", "veth", "peer", "name", p.ns_if],
        ["ip", "link", "set", p.ns_if, "netns", p.ns],
        ["ip", "addr", "add", f"{p.host_ip}/24", "dev", p.host_if],
        ["ip", "link", "set", p.host_if, "up"],
        ["ip", "netns", "exec", p.ns, "ip", "addr", "add", f"{p.ns_ip}/24", "dev", p.ns_if],
        ["ip", "netns", "exec", p.ns, "ip", "link", "set", p.ns_if, "up"],
        ["ip", "netns", "exec", p.ns, "ip", "link", "set", "lo", "up"],
    ]
    if profile.rtt_ms > 0 or profile.rate_mbit:
        cmds.append(["tc", "qdisc", "add", "dev", p.host_if, "root", *netem_args(profile)])
        cmds.append(["ip", "netns", "exec", p.ns, "tc", "qdisc", "add", "dev", p.ns_if, "root", *netem_args(profile)])
    return cmds


def teardown_commands(plan: NetnsPlan = NetnsPlan()) -> list[list[str]]:
    return [["ip", "link", "del", plan.host_if], ["ip", "netns", "del", plan.ns]]


def exec_prefix(plan: NetnsPlan = NetnsPlan()) -> list[str]:
    """Prefix that runs a command inside the cloud's namespace."""
    return ["ip", "netns", "exec", plan.ns]


def _run_all(cmds: list[list[str]]) -> str | None:
    for c in cmds:
        r = subprocess.run(c, capture_output=True, text=True)
        if r.returncode != 0:
            return f"{' '.join(c)}: {(r.stderr or r.stdout).strip()}"
    return None


def setup(profile: NetProfile, plan: NetnsPlan = NetnsPlan()) -> tuple[bool, str]:
    """Try the real link; returns (ok, why-not). Cleans up after a failure."""
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return False, "iproute2 (ip, tc) not installed"
    for c in teardown_commands(plan):  # leftovers of an earlier run
        subprocess.run(c, capture_output=True)
    err = _run_all(setup_commands(profile, plan))
    if err is not None:
        teardown(plan)
        return False, err
    return True, ""


def teardown(plan: NetnsPlan = NetnsPlan()) -> None:
    for c in teardown_commands(plan):
        subprocess.run(c, capture_output=True)


def probe(plan: NetnsPlan = NetnsPlan(ns="rapidprobe", host_if="rbprobe0", ns_if="rbprobe1",
                                      host_ip="10.232.0.1", ns_ip="10.232.0.2")) -> tuple[bool, str]:
    """Can this machine build a namespace with a netem link? (builds one and removes it)"""
    ok, why = setup(NetProfile("probe", 2.0), plan)
    if ok:
        teardown(plan)
    return ok, why
