"""rapid.doctor: the ONNX Runtime probe needs only onnxruntime (no onnx package)."""

from __future__ import annotations

import numpy as np
import pytest

from rapid import doctor

ort = pytest.importorskip("onnxruntime")


def test_probe_model_is_what_onnx_helper_builds():
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "probe",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    assert model.SerializeToString() == doctor.PROBE_MODEL
    onnx.checker.check_model(onnx.load_from_string(doctor.PROBE_MODEL))


def test_probe_runs_and_cpu_really_works():
    sess = ort.InferenceSession(doctor.PROBE_MODEL, providers=["CPUExecutionProvider"])
    assert sess.run(None, {"x": np.array([3.5], dtype=np.float32)})[0].tolist() == [3.5]
    assert "CPUExecutionProvider" in doctor.ort_providers()


def test_precision_rows_say_what_auto_picks_and_why():
    from rapid.core.precision import choose_dtype, cpu_flags
    from rapid.doctor import precision_rows

    rows = dict(precision_rows())
    want = choose_dtype("auto", "cpu", cpu_flags())
    assert rows["--dtype auto (cpu)"].startswith(want.dtype) and want.reason in rows["--dtype auto (cpu)"]
