"""The emulated ``tensorrt`` module of ``trt_emulation``: engine, contexts, ONNX Runtime execution.

The engine's profiles are ``rapid.export.trt_build.profile_shapes`` for the export's
max_context / max_tree (what a real build of that export would have); its tensor dtypes are the
ONNX graph's. See ``trt_emulation`` for what is checked.
"""

from __future__ import annotations

import ctypes
import importlib.machinery
import types
from typing import Any

import numpy as np
import onnxruntime as ort

from rapid.core.trt_support import PREFILL_CHUNK
from rapid.export.trt_build import input_dims, profile_shapes

ALIGN = 256
STATIC, ON_PROFILE_CHANGE, USER_MANAGED = 0, 1, 2
ORT_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int64)": np.int64}


def host_view(ptr: int, shape, dtype) -> np.ndarray:
    count = int(np.prod(shape))
    raw = (ctypes.c_char * max(1, count * np.dtype(dtype).itemsize)).from_address(ptr)
    return np.frombuffer(raw, dtype=dtype, count=count).reshape(shape)


def module(name: str) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__spec__ = importlib.machinery.ModuleSpec(name, None)
    return mod


def _nbytes(shape, dtype) -> int:
    return int(np.prod(shape)) * np.dtype(dtype).itemsize


class Engine:
    """The deserialized engine: profiles, tensor dtypes, scratch size; the graph runs on ORT."""

    def __init__(self, onnx_path, manifest, mem: Any) -> None:
        a = manifest["architecture"]
        self.kvh, self.hd, self.vocab, self.heads = a["kv_heads"], a["head_dim"], a["vocab"], a["heads"]
        self.profiles = list(profile_shapes(manifest["max_context"], manifest["max_tree"], PREFILL_CHUNK).values())
        self.sess = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
        self.inputs = [i.name for i in self.sess.get_inputs()]
        self.outputs = [o.name for o in self.sess.get_outputs()]
        self.types = {x.name: ORT_TYPES[x.type] for x in (*self.sess.get_inputs(), *self.sess.get_outputs())}
        self.mem = mem
        self.state = types.SimpleNamespace(refuse_shape=set(), refuse_address=set(), dtype_override={},
                                           contexts=[], executions=[])
        self.num_optimization_profiles = len(self.profiles)
        self.num_io_tensors = len(self.types)
        self.device_memory_size_v2 = max(self.scratch_need(i) for i in range(len(self.profiles)))

    def scratch_need(self, idx: int) -> int:
        """A stand-in for TensorRT's activation size: grows with T_max · S_max, like attention."""
        d = self.profiles[idx]
        return 4 * self.heads * d["T"][2] * d["S"][2]

    def get_tensor_name(self, i):
        return list(self.types)[i]

    def get_tensor_dtype(self, name):
        return self.state.dtype_override.get(name, self.types[name])

    def get_tensor_profile_shape(self, name, idx):
        d = self.profiles[idx]
        return [input_dims(name, d["T"][k], d["P"][k], d["S"][k], self.kvh, self.hd) for k in range(3)]

    def get_device_memory_size_for_profile_v2(self, idx):
        return self.scratch_need(idx)

    def create_execution_context(self, strategy=STATIC):
        return Context(self, strategy)


class Context:
    """One execution context: profile, shapes, addresses, scratch; checks before it runs."""

    def __init__(self, engine: Engine, strategy: int) -> None:
        self.e, self.strategy, self.profile, self.shapes, self.addrs = engine, strategy, 0, {}, {}
        self.scratch = None
        if strategy == STATIC:  # TensorRT allocates the largest profile's need per context
            size = engine.device_memory_size_v2
            self.scratch = (engine.mem.alloc(size), size)
        engine.state.contexts.append(self)

    def set_device_memory(self, ptr, size):
        assert self.strategy == USER_MANAGED, "set_device_memory on a context that owns its memory"
        self.scratch = (int(ptr), int(size))

    def set_optimization_profile_async(self, idx, stream):
        if not 0 <= idx < len(self.e.profiles):
            return False
        self.profile, self.shapes = idx, {}
        return True

    def set_input_shape(self, name, shape):
        if name in self.e.state.refuse_shape or name not in self.e.inputs:
            return False
        lo, _, hi = self.e.get_tensor_profile_shape(name, self.profile)
        shape = tuple(int(x) for x in shape)
        if len(shape) != len(lo) or not all(x <= s <= y for x, s, y in zip(lo, shape, hi, strict=True)):
            return False
        self.shapes[name] = shape
        return True

    def set_tensor_address(self, name, ptr):
        if name in self.e.state.refuse_address or name not in self.e.types or int(ptr) % ALIGN:
            return False
        self.addrs[name] = int(ptr)
        return True

    def _spans(self) -> dict[str, tuple[int, int]]:
        """(address, bytes) of every binding, each checked to lie inside one allocation."""
        t = self.shapes["input_ids"][1]
        outs = {n: (1, t, self.e.vocab) if n == "logits" else (1, self.e.kvh, t, self.e.hd) for n in self.e.outputs}
        spans = {}
        for name, shape in {**self.shapes, **outs}.items():
            n = _nbytes(shape, self.e.types[name])
            self.e.mem.check_inside(self.addrs[name], n, name)
            spans[name] = (self.addrs[name], n)
        return spans

    def _check(self) -> tuple[int, int]:
        assert set(self.e.inputs) <= set(self.shapes), f"input shapes not set: {set(self.e.inputs) - set(self.shapes)}"
        assert set(self.e.types) <= set(self.addrs), f"addresses not set: {set(self.e.types) - set(self.addrs)}"
        t = self.shapes["input_ids"][1]
        pasts = {s for n, s in self.shapes.items() if n.startswith("past_")}
        assert len(pasts) == 1, f"past tensors disagree: {pasts}"
        p = pasts.pop()[2]
        assert self.shapes["position_ids"] == (1, t) and self.shapes["attn_mask"] == (1, 1, t, p + t)
        assert self.scratch is not None, "USER_MANAGED context run without device memory"
        ptr, size = self.scratch
        assert ptr % ALIGN == 0 and size >= self.e.scratch_need(self.profile), (ptr, size)
        self.e.mem.check_inside(ptr, size, "scratch")
        spans = self._spans()
        for o in self.e.outputs:
            s, n = spans[o]
            clash = [x for x, (u, m) in spans.items() if x != o and n and m and s < u + m and u < s + n]
            assert not clash, f"output {o} overlaps {clash}"
        return t, p

    def execute_async_v3(self, stream):
        t, p = self._check()
        feed = {n: host_view(self.addrs[n], self.shapes[n], self.e.types[n]).copy() for n in self.e.inputs}
        for name, value in zip(self.e.outputs, self.e.sess.run(self.e.outputs, feed), strict=True):
            value = np.ascontiguousarray(value, dtype=self.e.types[name])
            ctypes.memmove(self.addrs[name], value.ctypes.data, value.nbytes)
        self.e.state.executions.append((self.profile, t, p))
        return True


def fake_tensorrt(onnx_path, manifest, mem: Any) -> types.ModuleType:
    """The ``tensorrt`` module; ``mem``: the ``trt_emulation.DeviceMemory`` pycuda allocates from."""
    engine = Engine(onnx_path, manifest, mem)

    class Runtime:
        def __init__(self, logger):
            pass

        def deserialize_cuda_engine(self, data):
            return engine

    trt = module("tensorrt")
    trt.__version__ = "10.3.0-emulated"
    trt.Logger = type("Logger", (), {"WARNING": 2, "INFO": 3, "__init__": lambda self, level=2: None})
    trt.Runtime = Runtime
    trt.ExecutionContextAllocationStrategy = types.SimpleNamespace(
        STATIC=STATIC, ON_PROFILE_CHANGE=ON_PROFILE_CHANGE, USER_MANAGED=USER_MANAGED)
    trt.nptype = lambda dt: dt
    trt.state = engine.state
    return trt
