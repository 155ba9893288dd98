"""Finding TensorRT (an optional dependency): import it with an install hint, say what is missing.

Shared by the TensorRT backend (``rapid.engines.trt_engine``) and the engine builder
(``rapid.export.trt_build``); imports tensorrt only when asked to.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from rapid.core.errors import RapidError

# Most tokens one enqueue runs: the prefill profile's max T (export.trt_build) and the TensorRT
# engine's default chunk (engines.trt_engine). Longer prompts are prefilled in chunks of this
# size, which bounds the attention activations (heads · T · S) and the [T, vocab] logits buffer.
PREFILL_CHUNK = 256

TENSORRT_HINT = (
    "on a Jetson, TensorRT ships with JetPack (`sudo apt install nvidia-jetpack`, or just "
    "`python3-libnvinfer`); create the virtualenv with --system-site-packages to see it. "
    "Elsewhere: `pip install tensorrt` (10.x)")


class TrtUnavailableError(RapidError):
    """tensorrt and/or pycuda are missing, or there is no usable GPU."""


def require_tensorrt() -> Any:
    try:
        import tensorrt as trt
    except ImportError as e:
        raise TrtUnavailableError(f"the TensorRT backend needs the `tensorrt` module, which is not installed: "
                                  f"{TENSORRT_HINT}") from e
    major = int(str(trt.__version__).split(".")[0])
    if major < 10:
        raise TrtUnavailableError(f"TensorRT {trt.__version__} is too old: the backend uses the TensorRT 10 API")
    return trt


def missing_modules() -> list[str]:
    """Which of tensorrt / pycuda cannot be imported (without initialising CUDA)."""
    out = []
    for name in ("tensorrt", "pycuda"):
        try:
            if importlib.util.find_spec(name) is None:
                out.append(name)
        except (ImportError, ValueError):
            out.append(name)
    return out
