"""Prometheus metrics shared by every service (one process = one service, default registry)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

__all__ = [
    "ACCESS_UPDATES",
    "CONSUMER_ACK_PENDING",
    "CONSUMER_PENDING",
    "DEAD_LETTERED",
    "DEPENDENCY_WAITS",
    "DRAWERS",
    "EMBED_SECONDS",
    "EMBED_TEXTS",
    "ENTITIES",
    "FAILED",
    "HANDLER_SECONDS",
    "HANDLER_TIMEOUTS",
    "HTTP_REQUESTS",
    "HTTP_REQUEST_SECONDS",
    "IN_FLIGHT",
    "LLM_CALLS",
    "LLM_SECONDS",
    "LLM_TOKENS",
    "LLM_WORKSPACE_CALLS",
    "LLM_WORKSPACE_TOKENS",
    "NEIGHBOUR_CACHE_BYTES",
    "NEIGHBOUR_CACHE_READS",
    "PROCESSED",
    "SEARCH_SECONDS",
    "STATISTICS_REFRESHES",
    "VECTOR_INDEX_BUILDS",
    "VECTOR_INDEX_BUILD_SECONDS",
    "VECTOR_INDEX_OLDEST_WAIT",
]

_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

PROCESSED = Counter(
    "palace_messages_processed_total", "Messages handled and acked.", ["service", "subject"]
)
FAILED = Counter(
    "palace_messages_failed_total", "Handler failures (each attempt).", ["service", "subject", "kind"]
)
DEAD_LETTERED = Counter(
    "palace_messages_dead_lettered_total", "Messages moved to the dead-letter stream.", ["service", "subject"]
)
HANDLER_SECONDS = Histogram(
    "palace_handler_seconds", "Handler latency, receive to commit.", ["service", "subject"], buckets=_BUCKETS
)
DEPENDENCY_WAITS = Counter(
    "palace_dependency_waits_total", "Handler retries held in place because a dependency was unreachable.",
    ["service", "dependency", "error"],
)
HANDLER_TIMEOUTS = Counter(
    "palace_handler_timeouts_total", "Handler attempts cancelled past PALACE_HANDLER_TIMEOUT_S (then retried with "
    "backoff, or dead-lettered at the last attempt).", ["service", "subject"],
)
IN_FLIGHT = Gauge("palace_in_flight_messages", "Messages being handled now.", ["service"])
CONSUMER_PENDING = Gauge(
    "palace_consumer_pending_messages", "Consumer lag: messages not yet delivered.", ["service", "consumer"]
)
CONSUMER_ACK_PENDING = Gauge(
    "palace_consumer_ack_pending_messages", "Delivered but not yet acked.", ["service", "consumer"]
)
CONSUMER_OLDEST_UNACKED_AGE = Gauge(
    "palace_consumer_oldest_unacked_age_seconds",
    "Age of the oldest message the consumer has not acked (delivered or not); grows during a stall even at zero lag.",
    ["service", "consumer"],
)
STREAM_MESSAGES = Gauge("palace_stream_messages", "Messages held by a JetStream stream.", ["stream"])
STREAM_BYTES = Gauge("palace_stream_bytes", "Bytes held by a JetStream stream.", ["stream"])
STREAM_MAX_BYTES = Gauge("palace_stream_max_bytes", "Size limit of a JetStream stream (-1: none).", ["stream"])
DRAWERS = Counter("palace_drawers_total", "Drawer transitions.", ["service", "outcome"])
ENTITIES = Counter("palace_entities_total", "Entity dedup outcomes (merged, flagged).", ["service", "outcome"])
EMBED_TEXTS = Counter("palace_embedded_texts_total", "Texts embedded (cache misses).", ["model"])
EMBED_SECONDS = Histogram("palace_embed_seconds", "Embedding call latency.", ["model"], buckets=_BUCKETS)
SEARCH_SECONDS = Histogram("palace_search_seconds", "Search latency.", ["stage"], buckets=_BUCKETS)
ACCESS_UPDATES = Counter(
    "palace_access_updates_total",
    "Drawer access bumps by outcome: written, dropped (buffer full), retried (row locked or pool busy).",
    ["outcome"],
)

# HTTP API. `route` is the route template (/v1/workspaces/{workspace_id}/stats), never the raw path, so
# the number of series stays bounded whatever callers send; unmatched paths share one label.
HTTP_REQUESTS = Counter(
    "palace_http_requests_total", "HTTP requests answered by the API.", ["method", "route", "status"]
)
HTTP_REQUEST_SECONDS = Histogram(
    "palace_http_request_seconds", "HTTP request latency, first byte received to response sent.",
    ["method", "route"], buckets=_BUCKETS,
)
LLM_CALLS = Counter(
    "palace_llm_calls_total", "LLM calls (each attempt) by purpose and outcome.", ["purpose", "outcome"]
)
LLM_TOKENS = Counter(
    "palace_llm_tokens_total", "LLM tokens by purpose and direction (in/out).", ["purpose", "direction"]
)
LLM_SECONDS = Histogram("palace_llm_seconds", "LLM call latency.", ["purpose"], buckets=_BUCKETS)
# Today's LLM cost per workspace, read from llm_usage by maintain (so every replica of every service is
# counted, and a restart loses nothing): the PALACE_METRICS_COST_WORKSPACES costliest workspaces by name,
# the rest summed under workspace="(other)", which keeps the number of series bounded.
LLM_WORKSPACE_CALLS = Gauge(
    "palace_llm_workspace_calls_today", "LLM calls today (database date) by workspace, purpose and outcome.",
    ["workspace", "purpose", "outcome"],
)
LLM_WORKSPACE_TOKENS = Gauge(
    "palace_llm_workspace_tokens_today", "LLM tokens today (database date) by workspace, purpose and direction.",
    ["workspace", "purpose", "direction"],
)

# Cluster ranks small workspaces' neighbours from vectors it keeps (shared.memory.neighbours): what it holds,
# and how each event's ranking got its vectors (a whole workspace read, only what changed, or left to the
# database: too large for PALACE_CLUSTER_VECTOR_CACHE_MB, or a drawer of the event no longer a candidate).
NEIGHBOUR_CACHE_BYTES = Gauge("palace_neighbour_cache_bytes", "Bytes of vectors a cluster replica keeps in memory.")
NEIGHBOUR_CACHE_READS = Counter(
    "palace_neighbour_cache_reads_total", "Neighbour rankings by where their vectors came from.", ["kind"],
)

# A workspace past PALACE_VECTOR_INDEX_MIN_DRAWERS is searched (and clustered) exactly until maintain has
# built its own index: how long the oldest such request has waited says whether that is happening.
VECTOR_INDEX_OLDEST_WAIT = Gauge(
    "palace_vector_index_oldest_wait_seconds",
    "Age of the oldest request for a workspace's vector index not built yet (0: none waits).",
)
STATISTICS_REFRESHES = Counter(
    "palace_statistics_refreshes_total",
    "Tables maintain analyzed: their statistics estimated a sizeable workspace as nearly empty, or autovacuum had "
    "fallen behind on them.", ["table"],
)
VECTOR_INDEX_BUILDS = Counter("palace_vector_index_builds_total", "Workspace vector index builds.", ["outcome"])
VECTOR_INDEX_BUILD_SECONDS = Histogram(
    "palace_vector_index_build_seconds", "Time to build a workspace's vector index.",
    buckets=(1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200),
)
