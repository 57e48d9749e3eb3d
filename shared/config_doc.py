"""The configuration reference (docs/configuration.md), generated from the settings model.

The model is the one source of truth for names, defaults and meanings; the page is rendered from it and
``palace schemas --check`` fails when the committed page differs, so the two cannot drift.
"""

from __future__ import annotations

import json
from pathlib import Path

from shared.config import Settings

__all__ = ["CONFIG_DOC", "render_configuration"]

CONFIG_DOC = Path("docs/configuration.md")


def _default(value: object) -> str:
    """As the variable is written: a list or a mapping in JSON (Python's repr, with single quotes, copied
    into the environment, stopped every service at start-up)."""
    if value is None:
        return "—"
    text = json.dumps(value) if isinstance(value, list | tuple | dict) else str(value)
    return f"`{text}`" if text else "(empty)"


def render_configuration() -> str:
    """Markdown: one row per ``PALACE_*`` variable, in the model's order."""
    lines = [
        "# Configuration",
        "",
        "Every setting is an environment variable with the `PALACE_` prefix. This page is generated from",
        "`shared/config.py` by `palace schemas`; `make test` fails when it is out of date. Lists are JSON.",
        "",
        "| variable | default | meaning |",
        "|---|---|---|",
    ]
    for name, field in Settings.model_fields.items():
        desc = " ".join((field.description or "").split()).replace("|", "\\|")
        lines.append(f"| `PALACE_{name.upper()}` | {_default(field.default)} | {desc} |")
    return "\n".join(lines) + "\n"
