"""Merge Prometheus text expositions into one, labelling each source (the ingress's /metrics).

Every sample of source i gets source i's extra labels (e.g. ``replica="ab12cd34"``); families of
the same name from different sources become one family (HELP and TYPE once), so
``rapid_sessions_active{replica="…"}`` reads as sessions per replica.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families


class _Families:
    def __init__(self, families) -> None:
        self._families = families

    def collect(self):
        return list(self._families)


def federate(parts: list[tuple[dict[str, str], str]]) -> str:
    """``parts`` = [(extra labels, exposition text)] → one exposition text."""
    merged: dict[str, object] = {}
    for extra, text in parts:
        for fam in text_string_to_metric_families(text):
            samples = [s._replace(labels={**s.labels, **extra}) for s in fam.samples]
            if fam.name in merged:
                merged[fam.name].samples.extend(samples)
            else:
                fam.samples = samples
                merged[fam.name] = fam
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(merged.values()))
    return generate_latest(registry).decode()
