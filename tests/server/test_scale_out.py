"""The scale-out pieces that need no Ray cluster: session ids, options, the router's ranking, the
autoscaling formula, metric federation, the first-frame routing key and the sample Serve config."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from prometheus_client.parser import text_string_to_metric_families

from rapid.core.wire import Hello, Tree, encode
from rapid.server.federate import federate
from rapid.server.metrics import ServerMetrics
from rapid.server.ray_scale import SessionsPolicy, desired_replicas
from rapid.server.scale_config import ScaleOut, replica_of, session_prefix, verifier_options
from rapid.server.serve_config import Limits
from rapid.server.sessions import SessionTable

REPO = Path(__file__).resolve().parents[2]


def test_session_ids_name_their_replica():
    table = SessionTable(Limits(), id_prefix=session_prefix("ab12cd34"))
    sid = table.add(session=None)
    assert sid.startswith("ab12cd34.") and replica_of(sid) == "ab12cd34"
    assert replica_of(SessionTable(Limits()).add(session=None)) is None  # single-process ids name none
    assert replica_of(None) is None and replica_of("") is None and replica_of(".x") is None


def test_scale_out_options():
    fixed = verifier_options(ScaleOut(replicas=3, num_gpus=1, num_cpus=2, drain_s=10))
    assert fixed["num_replicas"] == 3 and "autoscaling_config" not in fixed
    assert fixed["ray_actor_options"] == {"num_cpus": 2, "num_gpus": 1}
    assert fixed["graceful_shutdown_timeout_s"] == 15.0  # drain + 5 s to close
    assert fixed["request_router_config"]["request_router_class"] == "rapid.server.ray_router.SessionRouter"
    auto = verifier_options(ScaleOut(replicas=9, min_replicas=1, max_replicas=4, target_sessions=6))
    assert "num_replicas" not in auto
    a = auto["autoscaling_config"]
    assert (a["min_replicas"], a["max_replicas"], a["initial_replicas"]) == (1, 4, 4)  # 9 clamped
    assert a["policy"] == {"policy_function": "rapid.server.ray_scale:SessionsPolicy",
                           "policy_kwargs": {"target_sessions": 6}}
    for bad in ({"replicas": 0}, {"min_replicas": 2}, {"min_replicas": 3, "max_replicas": 2},
                {"min_replicas": 0, "max_replicas": 0}, {"num_gpus": -1}, {"drain_s": -1}):
        with pytest.raises(ValueError):
            ScaleOut(**bad)


def test_autoscaling_policy_follows_sessions():
    """n = ⌈Σ sessions / target⌉."""
    assert [desired_replicas(s, 8) for s in (0, 1, 8, 9, 16, 17)] == [0, 1, 1, 2, 2, 3]
    ctx = SimpleNamespace(aggregated_metrics={"sessions": {"r1": 7.0, "r2": 6.0}})
    assert SessionsPolicy(target_sessions=4)(ctx) == (4, {"sessions": 13.0})
    assert SessionsPolicy()(SimpleNamespace(aggregated_metrics=None))[0] == 0
    with pytest.raises(ValueError):
        SessionsPolicy(0)


def _replica(uid: str, sessions: int = 0):
    return SimpleNamespace(replica_id=SimpleNamespace(unique_id=uid), routing_stats={"sessions": sessions})


def test_router_ranking():
    from rapid.server.ray_router import rank

    a, b, c = _replica("a", 5), _replica("b", 1), _replica("c", 0)
    assert rank([a, b, c], "b", {}) == [[b]]  # strict affinity: only the replica the key names
    assert rank([a, b, c], "", {"c": 2, "b": 2}) == [[a], [c], [b]]  # fewest connections here, then sessions
    assert rank([a, b, c], "gone", {}) == [[c], [b], [a]]  # then fewest reported sessions
    assert rank([a, b, c], "gone", {"a": 0, "b": 0, "c": 0})[0] == [c]


def test_first_frame_names_the_replica():
    from rapid.server.ray_ingress import wanted_replica

    assert wanted_replica(encode(Hello([1, 2], session="ab12cd34.0011"))) == "ab12cd34"
    assert wanted_replica(encode(Hello([1, 2]))) is None
    assert wanted_replica(encode(Hello([1, 2], session="0011aabb"))) is None  # a single-process id
    assert wanted_replica(encode(Tree(1, [3], [-1]))) is None
    assert wanted_replica(b"\x00garbage") is None and wanted_replica("text") is None and wanted_replica(None) is None


def test_federated_metrics_label_each_replica():
    a, b = ServerMetrics(), ServerMetrics()
    a.sessions.labels("new").inc(3)
    a.sessions_active.set(2)
    b.verdict(8, 3, 0.01)
    text = federate([({}, "rapid_failovers_total 1.0\n"), ({"replica": "ra"}, a.render().decode()),
                     ({"replica": "rb"}, b.render().decode())])
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for fam in text_string_to_metric_families(text) for s in fam.samples}
    assert samples[("rapid_sessions_total", (("kind", "new"), ("replica", "ra")))] == 3
    assert samples[("rapid_sessions_active", (("replica", "ra"),))] == 2
    assert samples[("rapid_sessions_active", (("replica", "rb"),))] == 0
    assert samples[("rapid_spec_decode_num_accepted_tokens_total", (("replica", "rb"),))] == 3
    assert samples[("rapid_failovers_total", ())] == 1
    assert text.count("# TYPE rapid_sessions_active gauge") == 1  # one family across replicas


def test_options_are_checked():
    from rapid.server.ray_serve import ScaleOutError, spec_from_options

    spec, scale, other = spec_from_options({"target": "t", "replicas": 2, "max_sessions": 4, "port": 9000})
    assert spec.limits.max_sessions == 4 and scale.replicas == 2 and other["port"] == 9000
    assert scale.replica_host == "127.0.0.1"  # a local cluster: replicas listen on loopback
    assert spec_from_options({"ray_address": "auto"})[1].replica_host == "0.0.0.0"
    with pytest.raises(ScaleOutError, match="unknown scale-out option"):
        spec_from_options({"replica": 2})
    with pytest.raises(ScaleOutError):
        spec_from_options({"min_replicas": 2})


def test_sample_serve_config_builds():
    """docs/deploy/rapid-serve.yaml is a valid Serve config whose args build the application."""
    import yaml
    from ray.serve.schema import ServeDeploySchema

    from rapid.server.ray_serve import app_builder

    cfg = yaml.safe_load((REPO / "docs/deploy/rapid-serve.yaml").read_text())
    ServeDeploySchema.model_validate(cfg) if hasattr(ServeDeploySchema, "model_validate") else ServeDeploySchema(**cfg)
    app = cfg["applications"][0]
    assert app["import_path"] == "rapid.server.ray_serve:app_builder"
    args = {**app["args"], "token_file": None}  # the file lives on the cluster
    assert app_builder(args) is not None
