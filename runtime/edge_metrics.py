"""Prometheus metrics of the ``rapid edge`` daemon: :class:`EdgeMetrics`.

Owns the daemon's collector registry (requests, active/waiting generations, prompt and
generated tokens, time to first token, time per output token after it and end-to-end latency,
rounds, draft/accepted tokens, tree depth, CAAC's ESR and eta per engine, proactive
hits/misses/interrupts, draft step and cloud latency, reconnects, and the process's CPU/memory/fds) and :meth:`EdgeMetrics.observe`, which
folds one generation's round records into it. Served as ``GET /metrics`` by :mod:`.openai_api`.
Counters carry no ``_created`` twin samples (``disable_created_metrics``).
"""

from __future__ import annotations


class EdgeMetrics:
    def __init__(self) -> None:
        from prometheus_client import (
            CollectorRegistry,
            Counter,
            Gauge,
            Histogram,
            ProcessCollector,
            disable_created_metrics,
        )

        disable_created_metrics()  # vLLM-style scrapes: no *_created sample per counter
        r = self.registry = CollectorRegistry()
        ProcessCollector(registry=r)  # process_cpu_seconds_total, process_resident_memory_bytes, ...
        self.requests = Counter("rapid_edge_requests", "HTTP generation requests", ["endpoint", "status"], registry=r)
        self.active = Gauge("rapid_edge_active_requests", "Generations running", registry=r)
        self.waiting = Gauge("rapid_edge_waiting_requests", "Requests waiting for a draft engine", registry=r)
        self.tokens = Counter("rapid_edge_generated_tokens", "Tokens returned", registry=r)
        self.prompt_tokens = Counter("rapid_edge_prompt_tokens", "Prompt tokens of generation requests", registry=r)
        latency = (0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 60, 120)
        self.ttft = Histogram("rapid_edge_time_to_first_token_seconds", "Request start → first text piece",
                              buckets=latency, registry=r)
        self.tpot = Histogram("rapid_edge_time_per_output_token_seconds",
                              "First text piece → generation ended, per further token", registry=r,
                              buckets=(0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2))
        self.e2e = Histogram("rapid_edge_e2e_request_latency_seconds", "Request start → generation ended",
                             buckets=latency, registry=r)
        self.rounds = Counter("rapid_spec_decode_num_rounds", "Speculation rounds", registry=r)
        self.draft_tokens = Counter("rapid_spec_decode_num_draft_tokens", "Tree nodes sent", registry=r)
        self.accepted = Counter("rapid_spec_decode_num_accepted_tokens", "Draft tokens accepted", registry=r)
        self.depth = Histogram("rapid_edge_tree_depth", "Planned tree depth per round (0: drafted nothing)",
                               buckets=(0, 1, 2, 3, 4, 5, 6, 8, 10, 12, 16), registry=r)
        self.esr = Gauge("rapid_edge_esr", "Draft slowdown ratio ESR of the engine's last round (CAAC)", ["engine"], registry=r)
        self.eta = Gauge("rapid_edge_eta", "Depth gate eta of the engine's last round (CAAC)", ["engine"], registry=r)
        self.interrupts = Counter("rapid_edge_interrupts", "Proactive branches stopped by feedback", registry=r)
        self.hits = Counter("rapid_edge_proactive_hits", "Proactive branches kept", registry=r)
        self.misses = Counter("rapid_edge_proactive_misses", "Proactive branches discarded", registry=r)
        self.step = Histogram("rapid_edge_draft_step_seconds", "Draft step latency",
                              buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5), registry=r)
        self.cloud_rtt = Histogram("rapid_edge_cloud_seconds", "Tree sent → verdict received",
                                   buckets=(0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5), registry=r)
        self.reconnects = Counter("rapid_edge_reconnects", "Cloud link reconnects", registry=r)

    def observe(self, records, link_stats: dict, engine: str = "0") -> None:
        for rec in records:
            self.rounds.inc()
            self.draft_tokens.inc(rec.tree_nodes)
            self.accepted.inc(rec.accepted)
            self.depth.observe(rec.depth)
            self.esr.labels(engine).set(rec.esr)
            self.eta.labels(engine).set(rec.eta)
            self.cloud_rtt.observe(rec.cloud_s)
            if rec.interrupted_at is not None:
                self.interrupts.inc()
            if rec.proactive_hit is True:
                self.hits.inc()
            elif rec.proactive_hit is False:
                self.misses.inc()
            if rec.draft_steps:
                self.step.observe(rec.draft_s / rec.draft_steps)
        self.reconnects.inc(link_stats.get("reconnects", 0))
