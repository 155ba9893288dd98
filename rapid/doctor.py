"""``rapid doctor``: what this machine can really run (probes, never trusts provider lists)."""

from __future__ import annotations

import ctypes
import importlib
import platform
import shutil

from rapid import models
from rapid.core.optional import import_optional
from rapid.core.precision import BF16_CPU_FLAGS, choose_dtype, cpu_flags
from rapid.engines import native


def _version(mod: str) -> str | None:
    try:
        m = importlib.import_module(mod)
    except Exception as e:  # noqa: BLE001 - report any import failure
        return None if isinstance(e, ImportError) else f"import failed: {type(e).__name__}: {e}"
    return getattr(m, "__version__", "present")


def cuda_driver() -> str:
    """Probe the CUDA driver with cuda-python, else ctypes on libcuda; never via ORT's lists."""
    try:
        from cuda.bindings import driver  # cuda-python ≥ 12.6

        err, = driver.cuInit(0)
        if int(err) != 0:
            return f"cuda-python: cuInit failed ({err})"
        err, n = driver.cuDeviceGetCount()
        return f"cuda-python: {n} device(s)"
    except ImportError:
        pass
    except Exception as e:  # noqa: BLE001
        return f"cuda-python probe failed: {e}"
    for name in ("libcuda.so.1", "libcuda.so"):
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        if lib.cuInit(0) != 0:
            return f"{name}: cuInit failed (no usable GPU)"
        n = ctypes.c_int()
        lib.cuDeviceGetCount(ctypes.byref(n))
        return f"{name}: {n.value} device(s)"
    return "no CUDA driver (libcuda not found)"


# A serialized one-node ONNX model, y = Identity(x) over float[1], IR 8, opset 17: what
# onnx.helper.make_model builds (tests/test_doctor.py checks it), stored so that the probe needs
# only onnxruntime (the `edge` extra has no `onnx` package).
PROBE_MODEL = (b'\x08\x08:;\n\x10\n\x01x\x12\x01y"\x08Identity\x12\x05probeZ\x0f\n\x01x\x12\n\n\x08\x08\x01'
               b'\x12\x04\n\x02\x08\x01b\x0f\n\x01y\x12\n\n\x08\x08\x01\x12\x04\n\x02\x08\x01B\x04\n\x00\x10\x11')


def ort_providers() -> list[str]:
    """Providers that really initialise: open a one-node model with each and read back get_providers()[0]."""
    try:
        import onnxruntime as ort
    except ImportError:
        return []
    working = []
    for p in ort.get_available_providers():
        try:
            sess = ort.InferenceSession(PROBE_MODEL, providers=[p])
            if sess.get_providers()[0] == p:
                working.append(p)
        except Exception:  # noqa: BLE001 - a provider that fails to start is exactly what we report
            continue
    return working


def run_doctor(target: str | None = None) -> int:
    """Print what this machine can run; with ``target``, also load it and measure its verify curve."""
    rows: list[tuple[str, str]] = [("python", platform.python_version()), ("machine", platform.machine())]
    torch_v = _version("torch")
    if torch_v and not torch_v.startswith("import failed"):
        import torch

        dev = f"cuda ({torch.cuda.get_device_name(0)})" if torch.cuda.is_available() else "cpu only"
        rows.append(("torch", f"{torch_v}, {dev}, {torch.get_num_threads()} threads"))
    else:
        rows.append(("torch", torch_v or "not installed (needed for the cloud, export and the torch backend)"))
    rows.append(("transformers", _version("transformers") or "not installed"))
    ort_v = _version("onnxruntime")
    if ort_v:
        import onnxruntime as ort

        rows.append(("onnxruntime", f"{ort_v}; listed {ort.get_available_providers()}; really working {ort_providers()}"))
    else:
        rows.append(("onnxruntime", "not installed (pip install 'rapid-spec[edge]' or [gpu])"))
    rows.append(("tensorrt", _version("tensorrt") or "not installed (JetPack ships it; x86: NVIDIA's index)"))
    rows.append(("pycuda", _version("pycuda") or "not installed (pip install pycuda on the device)"))
    rows.append(("cuda driver", cuda_driver()))
    rows.append(("nvcc", shutil.which("nvcc") or "not found"))
    try:
        rows.append(("native kv kernels (cpu)", native.cpu_status()))
        rows.append(("native kv kernels (cuda)", native.cuda_status()))
    except Exception as e:  # noqa: BLE001
        rows.append(("native kv kernels", f"unavailable: {e}"))
    try:
        for row in models.describe_default():
            rows.append((row["name"], f"{'present' if row['present'] else 'absent'} at {row['path']}"))
    except Exception as e:  # noqa: BLE001
        rows.append(("default models", f"unknown: {e}"))
    rows += precision_rows()
    if target and torch_v and not torch_v.startswith("import failed"):
        rows += target_rows(target)
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k.ljust(width)}  {v}", flush=True)
    return 0


def precision_rows() -> list[tuple[str, str]]:
    """What ``--dtype auto`` picks here, and why (rapid.core.precision)."""
    flags = cpu_flags()
    have = sorted(f for f in BF16_CPU_FLAGS + ("amx_tile", "avx512_vnni", "avx_vnni", "avx512f") if f in flags)
    choice = choose_dtype("auto", "cpu", flags)
    return [("cpu bf16/int8 flags", ", ".join(have) or "none"),
            ("--dtype auto (cpu)", f"{choice.dtype}: {choice.reason}")]


def _verify_mode_line(found) -> str:
    return f"{'tree' if found.check.invariant else 'sequential'}: {found.line()}"


def target_rows(spec: str) -> list[tuple[str, str]]:
    """Load the target as ``rapid serve`` would and measure its verify curve and verify mode."""
    import torch

    modeling = import_optional("rapid.modeling", "cloud")
    invariance = import_optional("rapid.server.invariance", "cloud")
    serve_config = import_optional("rapid.server.serve_config", "cloud")
    vc = import_optional("rapid.server.verify_curve", "cloud")
    dtype = choose_dtype("auto", "cpu", cpu_flags()).dtype
    torch.set_num_threads(1)
    model, _ = modeling.load_decoder(spec, getattr(torch, dtype))
    points = vc.measure_curve(model)
    rows = [(f"verify curve ({dtype}, 1 thread)", vc.curve_line(points) + f" ({vc.CURVE_PREFIX}-token prefix)"),
            ("flat up to", f"{vc.flat_nodes(points)} tree nodes (what --budget auto uses)"),
            ("memory roofline", vc.roofline_line(model, points[0].ms, vc.read_bandwidth_gbs())),
            ("verify mode", _verify_mode_line(invariance.check_invariance(model, serve_config.DEFAULT.max_context)))]
    if dtype != "float32":
        model = model.float()
        rows.insert(1, ("verify curve (float32, 1 thread)", vc.curve_line(vc.measure_curve(model))))
    return rows
