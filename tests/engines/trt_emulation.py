"""Emulated tensorrt/pycuda for TrtEngine tests: host "device" memory, ONNX Runtime execution."""

from __future__ import annotations

import ctypes
import importlib.machinery
import json
import shutil
import sys
import types

import numpy as np
import pytest


def _host_view(ptr: int, shape, dtype) -> np.ndarray:
    count = int(np.prod(shape))
    raw = (ctypes.c_char * max(1, count * np.dtype(dtype).itemsize)).from_address(ptr)
    return np.frombuffer(raw, dtype=dtype, count=count).reshape(shape)


def _module(name: str) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__spec__ = importlib.machinery.ModuleSpec(name, None)
    return mod


def _fake_pycuda() -> types.ModuleType:
    drv = _module("pycuda.driver")

    class Alloc:  # "device" memory = a host buffer kept alive by this object
        def __init__(self, nbytes):
            self.buf = np.zeros(max(1, int(nbytes)), np.uint8)

        def __int__(self):
            return self.buf.ctypes.data

        def free(self):
            pass

    class Ctx:
        def push(self):
            pass

        def detach(self):
            pass

    class Device:
        def __init__(self, n):
            self.n = n

        @staticmethod
        def count():
            return 1

        def name(self):
            return "emulated GPU"

        def retain_primary_context(self):
            return Ctx()

    class Stream:
        handle = 0

        def synchronize(self):
            pass

    class Event:
        def __init__(self, flags=0):
            pass

        def record(self, stream=None):
            pass

        def query(self):
            return True

        def synchronize(self):
            pass

    class Memcpy2D:
        def set_src_device(self, p):
            self.src = int(p)

        def set_dst_device(self, p):
            self.dst = int(p)

        def __call__(self, stream=None):
            assert self.width_in_bytes <= min(self.src_pitch, self.dst_pitch)
            for r in range(self.height):
                ctypes.memmove(self.dst + r * self.dst_pitch, self.src + r * self.src_pitch, self.width_in_bytes)

    drv.Error = RuntimeError
    drv.init = lambda: None
    drv.Device, drv.Stream, drv.Event, drv.Memcpy2D = Device, Stream, Event, Memcpy2D
    drv.Context = types.SimpleNamespace(pop=lambda: None)
    drv.event_flags = types.SimpleNamespace(DISABLE_TIMING=2)
    drv.mem_alloc = Alloc
    drv.pagelocked_empty = lambda shape, dtype: np.empty(shape, dtype)
    drv.memcpy_htod_async = lambda dst, src, stream=None: ctypes.memmove(int(dst), src.ctypes.data, src.nbytes)
    drv.memcpy_dtoh_async = lambda dst, src, stream=None: ctypes.memmove(dst.ctypes.data, int(src), dst.nbytes)
    drv.memcpy_dtod_async = lambda dst, src, n, stream=None: ctypes.memmove(int(dst), int(src), n)
    pkg = _module("pycuda")
    pkg.driver = drv
    return pkg


def _fake_tensorrt(onnx_path, manifest) -> types.ModuleType:
    import onnxruntime as ort

    a = manifest["architecture"]
    kvh, hd, c, tree = a["kv_heads"], a["head_dim"], manifest["max_context"], manifest["max_tree"]
    profiles = [(c, c - 1), (tree, c - 1)]  # (max T, max P): prefill, tree
    sess = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    in_names = [i.name for i in sess.get_inputs()]
    out_names = [o.name for o in sess.get_outputs()]

    def dtype_of(name):
        return np.int64 if name in ("input_ids", "position_ids") else np.float32

    class Context:
        def __init__(self):
            self.profile, self.shapes, self.addrs = 0, {}, {}

        def set_optimization_profile_async(self, idx, stream):
            self.profile = idx
            return True

        def set_input_shape(self, name, shape):
            tmax, pmax = profiles[self.profile]
            if name.startswith("past_") and not 0 <= shape[2] <= pmax:
                return False
            if name == "input_ids" and not 1 <= shape[1] <= tmax:
                return False
            self.shapes[name] = tuple(shape)
            return True

        def set_tensor_address(self, name, ptr):
            self.addrs[name] = int(ptr)
            return True

        def execute_async_v3(self, stream):
            feed = {n: _host_view(self.addrs[n], self.shapes[n], dtype_of(n)).copy() for n in in_names}
            for name, value in zip(out_names, sess.run(out_names, feed), strict=True):
                value = np.ascontiguousarray(value)
                ctypes.memmove(self.addrs[name], value.ctypes.data, value.nbytes)
            return True

    class Engine:
        num_optimization_profiles = len(profiles)

        def get_tensor_dtype(self, name):
            return dtype_of(name)

        def get_tensor_profile_shape(self, name, idx):
            tmax, pmax = profiles[idx]
            if name == "input_ids":
                return [(1, 1), (1, 1), (1, tmax)]
            return [(1, kvh, 0, hd), (1, kvh, 0, hd), (1, kvh, pmax, hd)]

        def create_execution_context(self):
            return Context()

    class Logger:
        WARNING, INFO = 2, 3

        def __init__(self, level=2):
            pass

    class Runtime:
        def __init__(self, logger):
            pass

        def deserialize_cuda_engine(self, data):
            return Engine()

    trt = _module("tensorrt")
    trt.__version__ = "10.0.0-emulated"
    trt.Logger, trt.Runtime = Logger, Runtime
    trt.nptype = lambda dt: dt
    return trt


def _install_trt_emulation(monkeypatch, export, tmp_path, kernels: bool):
    """Copy the export with a stand-in draft.engine and swap in the emulated modules."""
    from rapid.engines import cuda
    from rapid.engines.trt_engine import TrtEngine

    folder = tmp_path / "trt-export"
    shutil.copytree(export, folder)
    (folder / "draft.engine").write_bytes(b"emulated")
    manifest = json.loads((folder / "manifest.json").read_text())
    pkg = _fake_pycuda()
    monkeypatch.setitem(sys.modules, "pycuda", pkg)
    monkeypatch.setitem(sys.modules, "pycuda.driver", pkg.driver)
    monkeypatch.setitem(sys.modules, "tensorrt", _fake_tensorrt(folder / "draft.onnx", manifest))
    monkeypatch.setattr(cuda, "_drv", None)
    ops = None
    if kernels:
        from rapid.engines import native

        try:
            ops = native.cuda_ops(emulation=True)
        except RuntimeError as e:
            pytest.skip(f"librapid_kvops_cuda_emu unavailable: {e}")
    monkeypatch.setattr(TrtEngine, "_load_kvops", staticmethod(lambda: ops))
    return folder
