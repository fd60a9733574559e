"""Prometheus metrics of a server, with vLLM's names where vLLM has the same figure (so its
dashboards read them) and ``flashspec:`` names for the rest. Fed by the scheduler's thread
(``flashspec.scheduler.Observer``); prometheus_client is thread-safe."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from ..scheduler import Observer, Ticket

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24)
TTFT_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96)


class Metrics(Observer):
    def __init__(self, model: str, draft_names: list[str], slots: int):
        self.registry = r = CollectorRegistry()
        self.model, self.names = model, list(draft_names)
        m = ["model_name"]
        self.running = Gauge("vllm:num_requests_running", "Requests in a slot", m, registry=r).labels(model)
        self.waiting = Gauge("vllm:num_requests_waiting", "Requests in the queue", m, registry=r).labels(model)
        self.slots_used = Gauge("flashspec:slots_in_use", "KV-cache slots held by requests", m, registry=r).labels(model)
        Gauge("flashspec:slots_total", "KV-cache slots (--max-batch)", m, registry=r).labels(model).set(slots)
        self.drafts = Counter("vllm:spec_decode_num_drafts", "Speculative steps times rows", m, registry=r).labels(model)
        self.draft_tokens = Counter("vllm:spec_decode_num_draft_tokens", "Drafted tokens", m, registry=r).labels(model)
        self.accepted = Counter("vllm:spec_decode_num_accepted_tokens", "Accepted drafted tokens", m,
                                registry=r).labels(model)
        self.per_pos = Counter("vllm:spec_decode_num_accepted_tokens_per_pos", "Accepted drafted tokens by position",
                               m + ["position"], registry=r)
        self.pulls = Counter("flashspec:draft_pulls", "Steps run with each draft", m + ["draft"], registry=r)
        self.plain_steps = Counter("flashspec:plain_steps", "Steps run as plain decoding (no draft)", m,
                                   registry=r).labels(model)
        self.arm_drafted = Counter("flashspec:draft_drafted_tokens", "Tokens drafted by each draft", m + ["draft"],
                                   registry=r)
        self.arm_accepted = Counter("flashspec:draft_accepted_tokens", "Tokens of each draft accepted", m + ["draft"],
                                    registry=r)
        self.step_latency = Histogram("flashspec:step_latency_seconds", "Wall time of one batch step", m,
                                      buckets=LATENCY_BUCKETS, registry=r).labels(model)
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "From arrival to the first token", m,
                              buckets=TTFT_BUCKETS, registry=r).labels(model)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "From arrival to the end", m, buckets=TTFT_BUCKETS,
                             registry=r).labels(model)
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prompt tokens of admitted requests", m,
                                     registry=r).labels(model)
        self.generation_tokens = Counter("vllm:generation_tokens", "Generated tokens", m, registry=r).labels(model)
        self.success = Counter("vllm:request_success", "Finished requests by reason", m + ["finished_reason"],
                               registry=r)

    def step(self, arm, accepted, drafted, seconds, slots_used) -> None:
        self.step_latency.observe(seconds)
        self.slots_used.set(slots_used)
        if arm < 0:
            self.plain_steps.inc()
        if arm < 0 or not accepted:
            return
        name, rows, total, proposed = self.names[arm], len(accepted), sum(accepted), sum(drafted)
        self.drafts.inc(rows)
        self.draft_tokens.inc(proposed)
        self.accepted.inc(total)
        for pos in range(max(drafted)):
            hits = sum(n > pos for n in accepted)
            if hits:
                self.per_pos.labels(self.model, str(pos)).inc(hits)
        self.pulls.labels(self.model, name).inc()
        self.arm_drafted.labels(self.model, name).inc(proposed)
        self.arm_accepted.labels(self.model, name).inc(total)

    def first_token(self, ticket: Ticket) -> None:
        self.ttft.observe(ticket.first_token - ticket.submitted)

    def finished(self, ticket: Ticket) -> None:
        self.e2e.observe(ticket.finished - ticket.submitted)
        if ticket.admitted is not None:
            self.prompt_tokens.inc(len(ticket.submission.prompt))
        self.generation_tokens.inc(len(ticket.tokens))
        self.success.labels(self.model, ticket.finish_reason).inc()

    def queues(self, counts: dict) -> None:
        """Refresh the gauges read at scrape time."""
        self.running.set(counts["running"])
        self.waiting.set(counts["waiting"])
