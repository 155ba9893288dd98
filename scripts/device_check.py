"""The Python half of scripts/device_check.sh: prints Markdown lines for the report."""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time

import numpy as np
import torch
from transformers import AutoModelForCausalLM

from rapid.bench.contention import LoadProcess, parse_schedule
from rapid.core.sampling import SamplingParams
from rapid.engines import native
from rapid.engines.torch_engine import TorchEngine
from rapid.modeling import Decoder, DecoderConfig
from rapid.runtime.assembly import assemble
from rapid.runtime.coordinator import CoordinatorConfig
from rapid.runtime.drafter import Drafter
from rapid.runtime.policies import POLICIES
from rapid.runtime.tree import TreeParams
from rapid.server.app import VerifierServer
from rapid.server.background import BackgroundServer
from rapid.server.invariance import position_probe
from rapid.server.invariance_stress import stress
from rapid.server.target import TargetSession, reference_decode
from rapid.server.verify_curve import curve_line, measure_curve
from rapid.tiny import EOS_ID, build_tiny

PROMPT = list(b"def gpu_check(x):")


def main() -> int:
    print(f"- torch {torch.__version__}, CUDA available: {torch.cuda.is_available()}")
    if not torch.cuda.is_available():
        print("- no CUDA device visible to torch: nothing else can run")
        return 1
    print(f"- device: {torch.cuda.get_device_name(0)}")
    ok = kernels_on_gpu()
    root = tempfile.mkdtemp()
    tgt_dir = build_tiny(f"{root}/t", seed=0, dtype="float64", hidden=128, layers=4)
    drf_dir = build_tiny(f"{root}/d", seed=1, base_seed=0, perturb=0.08, dtype="float64", hidden=128, layers=4)
    tgt_cpu = _decoder(tgt_dir)
    gpu, same = draft_on_gpu(drf_dir)
    ok &= same
    contention_on_gpu(gpu)
    tgt_gpu = _decoder(tgt_dir).to("cuda")
    ok &= policies_on_gpu(tgt_gpu, tgt_cpu, drf_dir)
    ok &= batched_on_gpu(tgt_gpu, tgt_cpu, drf_dir)
    bf16_invariance(tgt_dir)
    print(f"- overall: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


def _decoder(folder: str) -> Decoder:
    return Decoder.from_hf(AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float64))


def kernels_on_gpu() -> bool:
    """1. The CUDA KV kernels against the CPU ones."""
    try:
        print(f"- CUDA KV kernels vs CPU kernels: {native.selftest_cuda()}")
        return True
    except Exception as e:  # noqa: BLE001 — report and go on
        print(f"- CUDA KV kernels vs CPU kernels: FAILED {e}")
        return False


def draft_on_gpu(drf_dir: str) -> tuple[Drafter, bool]:
    """2. The draft on CUDA with an event after every step; its tree against the CPU engine's."""
    gpu = Drafter(TorchEngine(_decoder(drf_dir), 512, device="cuda"), TreeParams(4, 16, 3, 3), (EOS_ID,))
    cpu = Drafter(TorchEngine(_decoder(drf_dir), 512), TreeParams(4, 16, 3, 3), (EOS_ID,))
    for d in (gpu, cpu):
        d.start(PROMPT)
    ready_before_wait, steps, t0 = 0, 0, time.perf_counter()
    orig = gpu.engine.step

    def step_with_event(*a, **kw):
        nonlocal ready_before_wait, steps
        h = orig(*a, **kw)
        steps += 1
        ready_before_wait += bool(h.ready())  # non-blocking CUDA event query
        return h

    gpu.engine.step = step_with_event
    gpu.draft(4)
    cpu.draft(4)
    gpu.engine.step = orig
    same = gpu.tree.tokens == cpu.tree.tokens and np.allclose(gpu.tree.score, cpu.tree.score, atol=1e-6)
    print(f"- draft on CUDA: {steps} expansion steps, each with a CUDA event ({ready_before_wait} already complete "
          f"when queried); tree identical to CPU: {'yes' if same else 'NO'}; {time.perf_counter() - t0:.3f}s")
    return gpu, same


def contention_on_gpu(gpu: Drafter) -> None:
    """3. The GPU contention load of rapid bench slows a CUDA draft step (reported, not required)."""

    def step_ms(n: int = 10) -> float:
        """Median ms per expansion step of a depth-4 draft on the GPU (prompt prefill included)."""
        ts = []
        for _ in range(n):
            gpu.start(PROMPT)
            t1 = time.perf_counter()
            gpu.draft(4)
            ts.append((time.perf_counter() - t1) / 4)
        return 1000 * sorted(ts)[n // 2]

    try:
        free = step_ms()
        with LoadProcess(parse_schedule("sustained"), None, "cuda") as load:
            load.start_epoch()
            time.sleep(3.0)  # the load process imports torch and allocates
            busy = step_ms()
        print(f"- GPU contention load: draft step {free:.2f} ms free, {busy:.2f} ms under the load "
              f"(x{busy / free:.2f})")
    except Exception as e:  # noqa: BLE001 — report and go on to the exactness check
        print(f"- GPU contention load: could not measure ({type(e).__name__}: {e})")


def policies_on_gpu(tgt_gpu: Decoder, tgt_cpu: Decoder, drf_dir: str) -> bool:
    """4. Exactness with the target on the GPU: every policy, greedy and seeded sampling."""
    server = BackgroundServer(VerifierServer(tgt_gpu, answer_delay=lambda: 0.002))
    results = []
    for sp in (SamplingParams(), SamplingParams(temperature=0.9, top_p=0.95, seed=3)):
        ref = reference_decode(tgt_cpu, PROMPT, 40, sp, (EOS_ID,))
        for name, pol in POLICIES.items():
            eng = TorchEngine(_decoder(drf_dir), 1024, device="cuda")
            coord = assemble(eng, TreeParams(4, 12, 2, 2), (EOS_ID,), server.url, pol, CoordinatorConfig(depth=4))
            gen = asyncio.run(coord.generate(PROMPT, 40, sp))
            results.append((name, sp.temperature, gen.tokens == ref, gen.summary.tokens_per_call))
    server.close()
    for name, t, same, tpc in results:
        print(f"- exactness, target+draft on GPU, policy {name}, T={t}: {'identical' if same else 'DIFFERENT'} "
              f"(tokens/target call {tpc:.2f})")
    return all(same for _, _, same, _ in results)


def batched_on_gpu(tgt_gpu: Decoder, tgt_cpu: Decoder, drf_dir: str) -> bool:
    """6. Batched verification (--max-batch 8) with the target on the GPU: 6 concurrent edges,
    each identical to the target alone, trees really batched, no batched forward split."""
    verifier = VerifierServer(tgt_gpu, max_batch=8, batch_window_ms=20.0)
    server = BackgroundServer(verifier)
    prompts = [list(f"prompt number {i}: ".encode()) for i in range(6)]

    async def one(prompt):
        eng = TorchEngine(_decoder(drf_dir), 1024, device="cuda")
        coord = assemble(eng, TreeParams(4, 12, 2, 2), (EOS_ID,), server.url, "rapid", CoordinatorConfig(depth=4))
        return (await coord.generate(prompt, 32, SamplingParams())).tokens

    async def all_of():
        return await asyncio.gather(*(one(p) for p in prompts))

    try:
        outs = asyncio.run(all_of())
    finally:
        server.close()
    same = sum(o == reference_decode(tgt_cpu, p, 32, SamplingParams(), (EOS_ID,)) for o, p in zip(outs, prompts, strict=True))
    sizes = verifier.metrics.batch_size.collect()[0].samples
    total = next(x.value for x in sizes if x.name.endswith("_sum"))
    count = next(x.value for x in sizes if x.name.endswith("_count"))
    splits = verifier.metrics.batch_failures._value.get()
    print(f"- batched verification on the GPU (--max-batch 8, 6 edges): {same}/6 identical, "
          f"mean trees per forward {total / max(count, 1):.2f}, split batches {splits:.0f}")
    return same == 6 and splits == 0


def bf16_invariance(tgt_dir: str) -> None:
    """5. Tree rows vs one-token steps on the GPU (``rapid.server.block_forward``: cuBLAS and the
    softmax called at fixed shapes only — 64-row blocks, attention in 8 x 8-row segments over
    256-multiple key slots; the row kernels are CPU-only). Reported, not required: where a
    position differs, ``rapid serve --verify auto`` verifies sequentially.

    - the stress of tests/server/test_invariance_stress.py at the default target's layer shapes
      (2 layers, 4096-token vocabulary): rows compared / differing, bf16 and fp32;
    - ``position_probe`` up to 4096 keys (what ``rapid serve`` runs at start-up on a CUDA target)
      on the layer stack and on the tiny target, and its time;
    - the verify curve of the layer stack on the GPU, and a 2,000-token prefill's time.
    """
    shapes = DecoderConfig("qwen2", 4096, 1536, 2, 12, 2, 128, 8960, 1e-6, 1e6, True, False, False, True, 32768, (0,))
    torch.manual_seed(1)
    with torch.device("meta"):
        stack = Decoder(shapes)
    stack = stack.to_empty(device="cuda")
    with torch.no_grad():
        for name, p in stack.named_parameters():
            p.normal_(1.0, 0.05) if "norm" in name else p.normal_(0.0, 0.05)
    stack.lm_head.weight = stack.embed_tokens.weight
    stack = stack.eval().requires_grad_(False)
    tiny = Decoder.from_hf(AutoModelForCausalLM.from_pretrained(tgt_dir, dtype=torch.float32))
    for dtype in (torch.bfloat16, torch.float32):
        model = stack.to(dtype)
        t0 = time.perf_counter()
        check = stress(model, 2000, seed=0, budget=64)
        print(f"- stress on the GPU, {dtype}, default target's layer shapes: {check.rows} rows compared, "
              f"{check.differing} differ (max |dlogit| {check.max_abs_diff:.3g}), {time.perf_counter() - t0:.0f} s")
        print(f"- verify curve on the GPU, {dtype}, 2-layer stack: {curve_line(measure_curve(model))}")
        t0 = time.perf_counter()
        TargetSession(model, list(range(1, 2001)), SamplingParams(), capacity=2100)
        torch.cuda.synchronize()
        print(f"- a 2,000-token prefill, 2-layer stack, {dtype}: {time.perf_counter() - t0:.2f} s")
        for name, m in (("2-layer stack", model), ("tiny target", tiny.to(device="cuda", dtype=dtype))):
            t0 = time.perf_counter()
            probe = position_probe(m, 4096)
            print(f"- start-up position_probe to 4096 keys, {name}, {dtype}: {probe.rows} rows, {probe.differing} "
                  f"differ, {time.perf_counter() - t0:.1f} s -> rapid serve would verify "
                  f"{'trees' if probe.invariant else 'sequentially'}")


if __name__ == "__main__":
    sys.exit(main())
