"""``rapid sim --gpu-profile``: a measured cloud verify-time curve, a JSON object
``{"nodes": [...], "seconds": [...]}`` (tree nodes, verify seconds; interpolated between points)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from rapid.core.errors import OptionError


def load_gpu_profile(path: str | Path) -> tuple[list[float], list[float]]:
    """(nodes, seconds) sorted by nodes; ``OptionError`` naming ``--gpu-profile`` where the file
    is missing, not JSON, or not two equally long, non-empty lists of finite numbers (nodes >= 0,
    seconds > 0)."""
    where = f"--gpu-profile {path}"
    try:
        g = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise OptionError(f"{where}: cannot read it ({e.strerror or e})") from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise OptionError(f"{where}: not a JSON file") from None
    shape = 'a JSON object {"nodes": [...], "seconds": [...]}'
    if not isinstance(g, dict) or not all(isinstance(g.get(k), list) for k in ("nodes", "seconds")):
        raise OptionError(f"{where}: must be {shape}")
    nodes, seconds = g["nodes"], g["seconds"]
    if not nodes or len(nodes) != len(seconds):
        raise OptionError(f"{where}: \"nodes\" and \"seconds\" must be equally long and not empty, "
                          f"got {len(nodes)} and {len(seconds)}")
    for key, xs, ok, rule in (("nodes", nodes, lambda x: x >= 0, ">= 0"), ("seconds", seconds, lambda x: x > 0, "> 0")):
        for x in xs:
            if not (_number(x) and math.isfinite(x) and ok(x)):
                raise OptionError(f"{where}: every {key!r} value must be a finite number {rule}, got {json.dumps(x)}")
    pairs = sorted(zip(nodes, seconds, strict=True))
    return [float(a) for a, _ in pairs], [float(b) for _, b in pairs]


def _number(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)
