"""Logging: one format per process. JSON lines when ``PALACE_LOG_JSON`` is on (the default for services),
readable console lines for people otherwise — and the same for every library that logs through the
standard library (uvicorn, nats, faststream, psycopg), whose records are rendered by structlog too,
so a log stream never mixes coloured text with JSON. Failures carry their traceback (``exc_info``).
"""

from __future__ import annotations

import logging
import sys

import structlog

__all__ = ["configure_logging", "get_logger"]

_QUIET = ("httpx", "sentence_transformers", "transformers", "uvicorn.access", "faststream.access", "faststream")


def configure_logging(level: str = "INFO", json: bool = True) -> None:
    """Configure structlog and the stdlib root logger once per process."""
    lvl = getattr(logging, level.upper(), logging.INFO)
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
    ]
    renderer: structlog.types.Processor
    if json:
        renderer = structlog.processors.JSONRenderer()
        shared.append(structlog.processors.format_exc_info)
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
    ))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(lvl)
    for name in _QUIET:
        logging.getLogger(name).setLevel(logging.WARNING)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access", "faststream", "faststream.access"):
        # Libraries that install their own (coloured) handlers: send their records to ours instead.
        lg = logging.getLogger(name)
        lg.handlers[:] = []
        lg.propagate = True
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=structlog.stdlib.LoggerFactory(),
        cache_logger_on_first_use=True,
    )


def get_logger(name: str) -> structlog.stdlib.BoundLogger:
    return structlog.get_logger(name)  # type: ignore[no-any-return]
