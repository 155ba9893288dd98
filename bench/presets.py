"""``rapid sim --preset``: the deployment regime (a Jetson edge, an A100 / H100 cloud) from
published measurements. A preset replaces the timing half of a ``Calibration`` (edge step
curve, cloud verify curve, contention, start-up); the acceptance half stays the one replayed
from real ``rapid bench`` traces. Sources (docs/bench.md lists them with the derivations):

cloud — a 14B-class bf16 target (Qwen3-14B), verify time ~flat up to N ≈ 64 tokens:
    A100 ≈ 23 ms, H100 ≈ 14 ms per forward (microsoft/vidur per-op profiles; vLLM measures
    24–29 ms per token for Qwen3-14B on A100). Above the flat region the forward turns
    compute-bound: + 2·14e9 FLOP per token at 50 % of the bf16 peak (A100 312, H100 989 TFLOP/s),
    i.e. 0.18 / 0.057 ms per token; only the many-edges study reaches it.
edge — a Jetson AGX Orin running a 0.6B-class draft on a TensorRT-class runtime:
    8–10 ms per step for one token (llama.cpp measured 23 ms), +10 % at T = 8 tokens per step,
    +20–30 % at T = 16 (+25 % taken); the Orin Nano is ≈ 2× slower at every T.
network — RTT 5–150 ms; SpecEdge measured 14 ms over a wide-area link. Jitter 10 % of the RTT
    (an assumption: none of the sources gives a spread).
contention — bursty episodes that slow a step 1.1×, 1.3× or 1.5×, 1 s on / 1 s off: a round
    here takes 50–200 ms, so an episode spans 5–20 rounds (the CAAC gate reacts within 3) and a
    256-token generation meets several (an assumption on the episode length; the 1.1–1.5× range
    is the issue's).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from rapid.bench.calibration import Calibration
from rapid.bench.netem import NetProfile, get_profile

_FLAT_NODES = 64.0  # verify is ~flat up to this many tokens (vidur profiles, the issue)
_MFU = 0.5  # fraction of the bf16 peak a compute-bound 14B forward reaches above the flat region
_TARGET_FLOP_PER_TOKEN = 2 * 14e9  # 14B parameters, one multiply-add each per token
MAX_SLOWDOWN = 1.5  # the strongest contention episode (the 1.1–1.5× range)


def verify_curve(flat_s: float, peak_flops: float) -> tuple[list[float], list[float]]:
    """Verify seconds by tree nodes: ``flat_s`` up to 64 nodes, then + (n − 64)·2·14e9 /
    (0.5 · peak_flops) (compute-bound; extrapolated linearly beyond the last point)."""
    per_token = _TARGET_FLOP_PER_TOKEN / (_MFU * peak_flops)
    return [1.0, _FLAT_NODES, 1024.0], [flat_s, flat_s, flat_s + (1024.0 - _FLAT_NODES) * per_token]


# relative cost of one draft step by tokens per step T (1 at T = 1): +10 % at T = 8, +25 % at T = 16
ORIN_STEP_CURVE: tuple[list[float], list[float]] = ([1.0, 8.0, 16.0], [1.0, 1.10, 1.25])


@dataclass(slots=True, frozen=True)
class Preset:
    """One deployment: the edge's one-token step range and step curve, the cloud's verify curve."""

    name: str
    edge: str
    cloud: str
    step_lo_s: float  # one-token draft step, fastest of the published range
    step_hi_s: float  # ... slowest
    verify: tuple[list[float], list[float]]  # (nodes, seconds)
    step_curve: tuple[list[float], list[float]] = ORIN_STEP_CURVE

    def __post_init__(self) -> None:
        if not 0 < self.step_lo_s <= self.step_hi_s:
            raise ValueError(f"preset {self.name}: need 0 < step_lo_s <= step_hi_s")
        if len(self.verify[0]) != len(self.verify[1]) or len(self.verify[0]) < 2:
            raise ValueError(f"preset {self.name}: verify curve needs >= 2 (nodes, seconds) points")


_A100 = verify_curve(0.023, 312e12)
_H100 = verify_curve(0.014, 989e12)
_AGX = (0.008, 0.010)
_NANO = (2 * _AGX[0], 2 * _AGX[1])  # Orin Nano ≈ 2× slower

PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset("orin-agx-a100", "Jetson AGX Orin, 0.6B draft", "A100, 14B bf16", *_AGX, _A100),
        Preset("orin-agx-h100", "Jetson AGX Orin, 0.6B draft", "H100, 14B bf16", *_AGX, _H100),
        Preset("orin-nano-a100", "Jetson Orin Nano, 0.6B draft", "A100, 14B bf16", *_NANO, _A100),
        Preset("orin-nano-h100", "Jetson Orin Nano, 0.6B draft", "H100, 14B bf16", *_NANO, _H100),
    )
}

# RTT choices: 5 ms (a metro edge), SpecEdge's measured 14 ms WAN, 50 ms, 150 ms (intercontinental)
NET_PROFILES: dict[str, NetProfile] = {
    p.name: p for p in (NetProfile(f"rtt{ms:g}", float(ms), 0.1 * ms) for ms in (5, 14, 50, 150))
}

# none, then episodes of 1.1×, 1.3×, 1.5× (intensity I slows a step 1 + 0.5·I: see apply_preset)
SCHEDULES: tuple[str, ...] = ("none", "burst:1:1:0.2", "burst:1:1:0.6", "burst:1:1")


def get_preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown sim preset {name!r}; choose from {', '.join(PRESETS)}") from None


def parse_presets(spec: str) -> list[Preset]:
    """``all`` or a comma list of preset names."""
    names = list(PRESETS) if spec.strip() == "all" else [s.strip() for s in spec.split(",") if s.strip()]
    return [get_preset(n) for n in names]


def net_profile(name: str) -> NetProfile:
    """A preset RTT choice (``rtt5``, ``rtt14``, ``rtt50``, ``rtt150``) or a bench profile."""
    return NET_PROFILES[name] if name in NET_PROFILES else get_profile(name)


def apply_preset(cal: Calibration, preset: Preset, samples: int = 21) -> Calibration:
    """A copy of ``cal`` with the preset's timing; the acceptance replay, tree sizes and hit rates
    stay the traced ones.

    - step samples: ``samples`` evenly spaced one-token times in [step_lo_s, step_hi_s], times
      curve(W) / curve(1) for the traced tree width W (a tree step feeds W tokens);
    - verify(nodes) = the preset's curve (as a GPU profile), with no co-location tax;
    - contention: a step in an active period of intensity I takes 1 + (1.5 − 1)·I times as long;
    - start-up and the draft prefill: 0 (the comparison is steady-state decoding, the same for
      every policy and oracle); the traced transport overhead stays (framing, measured).
    """
    if samples < 2:
        raise ValueError(f"samples must be >= 2, got {samples}")
    out = replace(cal, step_curve=preset.step_curve)
    w = out.step_curve_at(out.step_tokens) / out.step_curve_at(1)
    lo, hi = preset.step_lo_s, preset.step_hi_s
    out.step_s = [(lo + (hi - lo) * k / (samples - 1)) * w for k in range(samples)]
    out.gpu_profile = (list(preset.verify[0]), list(preset.verify[1]))
    out.cloud_elsewhere()
    out.slowdown, out.cal_intensity, out.slowdown_by_schedule = MAX_SLOWDOWN, 1.0, {}
    out.startup_s, out.prefill_s = 0.0, 0.0
    out.source = f"preset {preset.name} (acceptance: {cal.source})"
    return out
