"""Prometheus metrics of the server, named as vLLM / llama-server name theirs
(prefix `pydflash2:` instead of `vllm:`). The four speculative-decoding counters
of vLLM's dashboards are served under vLLM's own names too (VLLM_SPEC_DECODE),
with its labels, so that those dashboards work unchanged."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

PREFIX = "pydflash2:"

# The speculative-decoding counters vLLM's dashboards read (vllm/v1/spec_decode/metrics.py,
# SpecDecodingProm): attribute -> (name, help). Each is served twice: as `pydflash2:NAME`, and as
# `vllm:NAME` with vLLM's labels model_name (the served model id) and engine ("0": one engine here).
# accepted_per_pos has the label position too (0 = a block's first draft).
VLLM_SPEC_DECODE = {
    "num_drafts": ("spec_decode_num_drafts", "Drafted blocks verified by the target"),
    "num_draft_tokens": ("spec_decode_num_draft_tokens", "Drafted tokens verified"),
    "num_accepted_tokens": ("spec_decode_num_accepted_tokens", "Drafted tokens accepted"),
    "accepted_per_pos": ("spec_decode_num_accepted_tokens_per_pos",
                         "Drafted tokens accepted, by position in the block (0 = first draft)"),
}

_LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0)
_TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)

# engine stats counter -> metric attribute
_ENGINE_COUNTERS = {
    "n_drafts": "num_drafts",
    "n_draft_tokens": "num_draft_tokens",
    "n_accepted": "num_accepted_tokens",
    "draft_s": "draft_seconds",
    "decode_s": "verify_seconds",
    "n_prompt_reused": "prefix_cache_hits",
}

# per-phase breakdown of the engine's steps: stats key -> (metric suffix, help)
_PHASES = {
    "n_steps": ("num_steps", "Target decodes (engine steps and prompt chunks)"),
    "n_rows": ("num_rows", "Target rows decoded (verify rows and prompt rows)"),
    "n_filler_rows": ("num_filler_rows", "Rows decoded only to keep a verify batch one ubatch (a slot between "
                                         "two verifying slots; removed right after the decode)"),
    "lazy_head_rows": ("num_lazy_head_rows", "Verify rows whose LM head ran after the verify reached them "
                                             "(the rest of a rejected block skips its head)"),
    "inject_s": ("inject_seconds", "Seconds in feature copies and drafter inject graphs"),
    "propose_s": ("propose_seconds", "Seconds in drafter propose graphs (with the lattice read-back)"),
    "select_s": ("select_seconds", "Seconds in the path selector (the drafts picked from each proposal)"),
    "graph_setup_s": ("graph_setup_seconds", "Seconds building and allocating drafter graphs"),
    "verify_decode_s": ("verify_decode_seconds", "Seconds in target decodes of verify rows"),
    "prefill_decode_s": ("prefill_decode_seconds", "Seconds in target decodes of prompt chunks"),
    "verify_logic_s": ("verify_logic_seconds", "Seconds accepting drafts and rolling back the target cache"),
    "step_s": ("step_seconds", "Seconds in engine steps (all native phases)"),
}


class ServerMetrics:
    """One registry per server. The scheduler thread calls the update methods;
    render() serves GET /metrics."""

    def __init__(self, n_slots: int, max_draft: int, model_name: str = "") -> None:
        r = self.registry = CollectorRegistry()
        p = PREFIX
        vllm_labels = {"model_name": model_name, "engine": "0"}
        self._vllm_labels = vllm_labels
        #: attribute -> vLLM's twin of that counter (its labels bound, but for position)
        self.vllm: dict[str, Any] = {}
        for attr, (name, doc) in VLLM_SPEC_DECODE.items():
            position = ["position"] if attr == "accepted_per_pos" else []
            setattr(self, attr, Counter(p + name, doc, position, registry=r))
            twin = Counter("vllm:" + name, doc, list(vllm_labels) + position, registry=r)
            self.vllm[attr] = twin if position else twin.labels(**vllm_labels)
        self.draft_seconds = Counter(p + "spec_decode_draft_seconds", "Seconds spent drafting", registry=r)
        self.verify_seconds = Counter(p + "spec_decode_verify_seconds",
                                      "Seconds spent in target decodes (verify rows and prompt chunks)", registry=r)
        self.phases = {key: Counter(p + "spec_decode_" + suffix, doc, registry=r)
                       for key, (suffix, doc) in _PHASES.items()}
        self.python_seconds = Counter(p + "spec_decode_python_seconds",
                                      "Seconds the scheduler thread spends in Python around engine steps", registry=r)
        self.prompt_tokens = Counter(p + "prompt_tokens", "Prompt tokens processed", registry=r)
        # vLLM's names, in tokens: a slot keeps its last request's K/V, and the next prompt there
        # is prefilled from the first token where it differs (a shared system prompt is not recomputed)
        self.prefix_cache_queries = Counter(p + "prefix_cache_queries", "Prompt tokens looked up in a slot's cache",
                                            registry=r)
        self.prefix_cache_hits = Counter(p + "prefix_cache_hits", "Prompt tokens found in a slot's cache (not "
                                         "prefilled)", registry=r)
        self.generation_tokens = Counter(p + "generation_tokens", "Tokens generated", registry=r)
        self.requests = Counter(p + "requests", "Requests by final status "
                                "(success, aborted = client gone, rejected = queue full, invalid = 4xx, error)",
                                ["status"], registry=r)
        self.request_success = Counter(p + "request_success", "Finished requests by finish reason",
                                       ["finished_reason"], registry=r)
        self.ttft = Histogram(p + "time_to_first_token_seconds", "Time from arrival to the first token",
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.tpot = Histogram(p + "time_per_output_token_seconds", "Mean time per output token after the first",
                              buckets=_TPOT_BUCKETS, registry=r)
        self.e2e = Histogram(p + "e2e_request_latency_seconds", "Time from arrival to the last token",
                             buckets=_LATENCY_BUCKETS, registry=r)
        self.faults = Counter(p + "engine_faults", "Failed engine steps and slots (each failed only its own "
                              "requests)", registry=r)
        self.recoveries = Counter(p + "engine_recoveries", "Engine re-creations after a failed step", registry=r)
        self.timeouts = Counter(p + "request_timeouts", "Requests ended by a time limit, by stage (body = upload "
                                "stalled, queue = no slot in time, generation = --timeout)", ["stage"], registry=r)
        for stage in ("body", "queue", "generation"):
            self.timeouts.labels(stage=stage)
        self.waiting = Gauge(p + "num_requests_waiting", "Requests queued for a slot (queue depth)", registry=r)
        self.running = Gauge(p + "num_requests_running", "Busy slots", registry=r)
        self.slots = Gauge(p + "num_slots", "Slots (--parallel)", registry=r)
        self.slots.set(n_slots)
        for pos in range(max_draft):
            self._per_pos(pos)  # export zeros: the dashboard sees every position
        # drafts by source (context drafts, pydflash2.context_drafts): a node both sources proposed counts for both
        self.source_drafted = Counter(p + "spec_decode_num_draft_tokens_by_source",
                                      "Drafted tokens verified, by source (lattice: the drafter; context)",
                                      ["source"], registry=r)
        self.source_accepted = Counter(p + "spec_decode_num_accepted_tokens_by_source",
                                       "Drafted tokens accepted, by source", ["source"], registry=r)
        self.propose_skipped = Counter(p + "spec_decode_propose_skipped",
                                       "Steps that verified context drafts alone, without the drafter's propose",
                                       registry=r)
        self.context_cache_tokens = Gauge(p + "context_cache_tokens",
                                          "Tokens of past outputs in the global context cache (all API keys)",
                                          registry=r)
        for status in ("success", "aborted", "rejected", "invalid", "error"):
            self.requests.labels(status=status)
        self._last: dict[str, Any] | None = None

    def engine_stats(self, stats: dict[str, Any], baseline: bool = False) -> None:
        """Moves the speculative counters by what the engine counted since the last call
        (baseline: only remember stats, e.g. those of an engine just re-created)."""
        last = self._last
        self._last = stats
        if last is None or baseline:
            return
        for key, attr in _ENGINE_COUNTERS.items():
            delta = stats[key] - last[key]
            if delta > 0:
                getattr(self, attr).inc(delta)
                if attr in self.vllm:
                    self.vllm[attr].inc(delta)
        queried = stats["n_prompt"] + stats["n_prompt_reused"] - last["n_prompt"] - last["n_prompt_reused"]
        if queried > 0:
            self.prefix_cache_queries.inc(queried)
        for key, counter in self.phases.items():
            delta = stats[key] - last[key]
            if delta > 0:
                counter.inc(delta)
        now_ctx, last_ctx = stats.get("context"), last.get("context")
        if now_ctx is not None and last_ctx is not None:
            for source in ("lattice", "context"):
                for counter, suffix in ((self.source_drafted, "_nodes"), (self.source_accepted, "_accepted")):
                    delta = now_ctx[source + suffix] - last_ctx[source + suffix]
                    if delta > 0:
                        counter.labels(source=source).inc(delta)
            if now_ctx["propose_skipped"] > last_ctx["propose_skipped"]:
                self.propose_skipped.inc(now_ctx["propose_skipped"] - last_ctx["propose_skipped"])
            self.context_cache_tokens.set(now_ctx["cache_tokens"])
        for pos, (now, before) in enumerate(zip(stats["accepted_per_position"], last["accepted_per_position"],
                                                strict=True)):
            if now > before:
                for counter in self._per_pos(pos):
                    counter.inc(now - before)

    def _per_pos(self, pos: int) -> tuple[Any, Any]:
        """The accepted-per-position counters of position pos: ours and vLLM's."""
        return (self.accepted_per_pos.labels(position=str(pos)),
                self.vllm["accepted_per_pos"].labels(**self._vllm_labels, position=str(pos)))

    def render(self) -> bytes:
        return generate_latest(self.registry)
