"""``rapid serve --replicas N``: the verifier as a Ray Serve application (docs/scale-out.md).

    edge ──ws(s)──▶ Serve HTTP proxy ──▶ Ingress (auth, first frame → replica) ──ws──▶ Verifier replica k
                                               │  handle.options(session_id=replica id)
                                               └─▶ SessionRouter: strict affinity / least loaded

Ray is an optional extra (``pip install 'rapid-spec[ray]'``): it is imported only here and in the
modules this one loads. Options come as one dict with ``rapid serve``'s flag names
(``spec_from_options``), from the CLI or from a Serve config file (``app_builder``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading

from rapid.core.auth import load_token
from rapid.core.errors import RapidError
from rapid.core.optional import import_optional
from rapid.models import resolve_model
from rapid.server.ray_replica import VerifierReplica
from rapid.server.scale_config import ScaleOut, ingress_options, verifier_options
from rapid.server.serve_config import DEFAULT, ServeConfig, VerifierSpec

log = logging.getLogger("rapid.server.ray")
APP_NAME = "rapid"

# rapid serve flag (dest) -> default; anything else in an options dict is refused
VERIFIER_KEYS = {name: getattr(DEFAULT, name) for name in (
    "target", "threads", "dtype", "device", "verify", "max_sessions", "max_context", "max_nodes", "grace",
    "idle_timeout", "batch_window_ms", "max_batch")}
SCALE_KEYS = {"replicas": None, "min_replicas": None, "max_replicas": None, "num_gpus_per_replica": 0.0,
              "num_cpus_per_replica": 1.0, "ingress_replicas": 1, "target_sessions": 8, "drain": 60.0}
OTHER_KEYS = {"token_file": None, "host": "0.0.0.0", "port": 8000, "cert": None, "key": None, "ray_address": None,
              "replica_host": None}
ALL_KEYS = {**VERIFIER_KEYS, **SCALE_KEYS, **OTHER_KEYS}


class ScaleOutError(RapidError):
    """Ray is missing, cannot start, or the scale-out options do not make sense."""


def _ray():
    try:
        import ray
        from ray import serve
    except ImportError as e:
        raise ScaleOutError(f"rapid serve --replicas needs Ray Serve: pip install 'rapid-spec[ray]' ({e})") from None
    return ray, serve


def spec_from_options(options: dict) -> tuple[VerifierSpec, ScaleOut, dict]:
    """(what replicas serve, how many, the rest: token_file/host/port/cert/key/ray_address)."""
    unknown = set(options) - set(ALL_KEYS)
    if unknown:
        raise ScaleOutError(f"unknown scale-out option(s): {', '.join(sorted(unknown))}")
    o = {**ALL_KEYS, **{k: v for k, v in options.items() if v is not None}}
    remote = o["ray_address"] or os.environ.get("RAY_ADDRESS")  # replicas may then be on other nodes
    try:
        spec = ServeConfig.of({k: o[k] for k in (*VERIFIER_KEYS, "port")}).verifier()  # port: checked there too
        replicas = o["replicas"] if o["replicas"] is not None else o["min_replicas"] or 1  # 0 given: refused
        scale = ScaleOut(replicas=replicas, min_replicas=o["min_replicas"],
                         max_replicas=o["max_replicas"], num_gpus=o["num_gpus_per_replica"],
                         num_cpus=o["num_cpus_per_replica"], ingress_replicas=o["ingress_replicas"],
                         target_sessions=o["target_sessions"], drain_s=o["drain"],
                         replica_host=o["replica_host"] or ("0.0.0.0" if remote else "127.0.0.1"))
    except (TypeError, ValueError) as e:
        raise ScaleOutError(str(e)) from None
    return spec, scale, {k: o[k] for k in OTHER_KEYS}


def build_app(spec: VerifierSpec, scale: ScaleOut, token: str | None):
    """The Serve application: Ingress(Verifier × N). The token reaches replicas in their init
    arguments (inside the cluster), so they check the header the ingress forwards."""
    _, serve = _ray()
    make_ingress = import_optional("rapid.server.ray_ingress", "ray").make_ingress
    verifier = serve.deployment(VerifierReplica).options(**verifier_options(scale))
    ingress = serve.deployment(make_ingress(serve)).options(**ingress_options(scale))
    return ingress.bind(verifier.bind(spec, token, scale.replica_host, scale.drain_s), token,
                        scale.hello_timeout_s)


def app_builder(args: dict):
    """For ``serve run`` / ``serve deploy``: ``import_path: rapid.server.ray_serve:app_builder``
    with ``args`` = rapid serve's options (docs/deploy/rapid-serve.yaml). HTTP host, port and TLS
    then come from the config file's ``http_options``."""
    options = dict(args or {})
    options.setdefault("replica_host", "0.0.0.0")  # a deployed config may put replicas on any node
    spec, scale, other = spec_from_options(options)
    return build_app(spec, scale, load_token(other["token_file"]))


def _http_options(host: str, port: int, cert: str | None, key: str | None) -> dict:
    if bool(cert) != bool(key):
        raise ScaleOutError("TLS needs both --cert and --key")
    opts = {"host": host, "port": port}
    if cert:
        opts.update(ssl_certfile=cert, ssl_keyfile=key)
    return opts


def run_ray_serve(options: dict) -> int:
    """Deploy on a Ray cluster (``--ray-address`` / $RAY_ADDRESS, else a new local one) and run
    until SIGINT/SIGTERM; then delete the application (and stop the cluster if started here)."""
    spec, scale, other = spec_from_options(options)
    token = load_token(other["token_file"])
    ray, serve = _ray()
    if token is None:
        log.warning("verifier runs WITHOUT authentication (no --token-file / RAPID_TOKEN): local use only")
    address = other["ray_address"] or os.environ.get("RAY_ADDRESS") or "local"  # local: a new cluster here
    if address == "local":  # its replicas load the target from here: a bad --target is one line, not a
        resolve_model(spec.target)  # failed deployment after Ray started (a remote cluster's nodes may differ)
    try:
        ray.init(address=address, ignore_reinit_error=True)
    except Exception as e:
        raise ScaleOutError(f"cannot start or reach a Ray cluster ({address}): {type(e).__name__}: {e}") from None
    try:
        serve.start(http_options=_http_options(other["host"], other["port"], other["cert"], other["key"]))
        serve.run(build_app(spec, scale, token), name=APP_NAME, route_prefix="/")
        scheme = "wss" if other["cert"] else "ws"
        log.info("rapid on Ray Serve: %s://%s:%d (%s)", scheme, other["host"], other["port"], _describe(scale))
        _wait_for_signal()
    finally:
        with contextlib.suppress(Exception):
            serve.delete(APP_NAME) if address != "local" else serve.shutdown()
        ray.shutdown()  # a local cluster started here stops with it
    log.info("rapid on Ray Serve stopped")
    return 0


def _describe(scale: ScaleOut) -> str:
    size = (f"{scale.min_replicas}..{scale.max_replicas} replicas (autoscaling, {scale.target_sessions} "
            f"sessions each)" if scale.autoscaling else f"{scale.replicas} replica(s)")
    return f"{size}, {scale.num_gpus:g} GPU / {scale.num_cpus:g} CPU each"


def _wait_for_signal() -> None:
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(1.0):
        pass
