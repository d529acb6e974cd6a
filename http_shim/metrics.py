"""The shim's Prometheus metrics, in a registry of its own (served at GET /metrics).

Names carry the `conduit:` prefix the engine uses, after vLLM's `vllm:` convention, so
dashboards port by a prefix change. `route` is the Flask rule (`/v1/models/<path:model_id>`), or
`other` for URLs no route matches, so label values stay few whatever clients send.
"""

from __future__ import annotations

from functools import partial

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

UNMATCHED_ROUTE = "other"
# Streams last as long as generation does: the buckets reach minutes.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)


class ShimMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        counter, gauge = partial(Counter, registry=self.registry), partial(Gauge, registry=self.registry)
        self.requests = counter("conduit:http_requests", "HTTP requests answered, by route, method and status code "
                                "(streams when they end).", ["route", "method", "status"])
        self.duration = Histogram("conduit:http_request_duration_seconds", "Seconds from a request's arrival to the "
                                  "end of its response (a stream's last byte).", ["route"], buckets=DURATION_BUCKETS,
                                  registry=self.registry)
        self.requests_in_flight = gauge("conduit:http_requests_in_flight", "Requests being answered, streams included.")
        self.streams_in_flight = gauge("conduit:http_streams_in_flight", "Server-sent event streams open.")
        self.client_disconnects = counter("conduit:http_client_disconnects", "Clients that left before their answer "
                                          "was complete (their engine calls were cancelled).", ["route"])
        self.mcp_calls = counter(
            "conduit:mcp_calls", "MCP operations the Responses API's mcp tool ran, by server_label (the first 50 "
            "seen; later ones as other), operation (list_tools, call_tool) and outcome: ok, tool_error, timeout, "
            "unreachable, http_error, protocol_error, refused (a redirect or URL off the allowlist), "
            "approval_requested, denied, bad_arguments, max_tool_calls.", ["server_label", "operation", "outcome"])
        self.draining = gauge("conduit:http_draining",
                              "1 once the shim was asked to stop and refuses new generations, else 0.")
        # Routing over engine replicas (routing/): only with several engines or a dns:/// target.
        self.router_requests = counter(
            "conduit:router_requests",
            "Engine calls routed to each replica, by the policy's reason: cache_hit (followed its prefix), "
            "cache_miss, load_override (its prefix holder was too loaded), least_load, round_robin, unhealthy.",
            ["replica", "decision"])
        self.router_retries = counter("conduit:router_retries", "Engine calls a replica refused before answering "
                                      "(unavailable, queue full), sent to another.", ["replica"])
        self.router_replica_healthy = gauge("conduit:router_replica_healthy", "1 while the replica is SERVING "
                                            "(ready, not draining, reachable), else 0.", ["replica"])
        self.router_replica_load = gauge("conduit:router_replica_load", "The replica's running and waiting requests "
                                         "as the router weighs them (its last report, plus this shim's calls since).",
                                         ["replica"])
        self.router_replica_kv_blocks = gauge(
            "conduit:router_replica_kv_blocks",
            "Blocks the replica's prefix cache holds as its KV events say (--routing-prefix-view kv_events; "
            "0 while it publishes none).",
            ["replica"])

        # The Batch API (batches/): its requests by outcome, those queued and running, batches by status.
        self.batch_requests = counter("conduit:batch_requests", "Batch API requests finished, by outcome: completed "
                                      "(a 2xx answer, in the output file), failed (an error answer, in the error "
                                      "file), expired (not run within the completion window).", ["state"])
        self.batch_requests_waiting = gauge("conduit:batch_requests_waiting", "Requests of running batches not "
                                            "started yet (the batch queue's depth).")
        self.batch_requests_running = gauge("conduit:batch_requests_running", "Batch API requests in the engine now "
                                            "(at batch priority; at most --batch-max-in-flight).")
        self.batches = gauge("conduit:batches", "Batches this shim's store holds, by status.", ["status"])

    def exposition(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
