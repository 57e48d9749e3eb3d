"""Generate ``schemas/*.json`` from the event models."""

from __future__ import annotations

import json
from pathlib import Path

from shared.events.models import EVENT_MODELS

__all__ = ["render_schemas", "write_schemas"]


def render_schemas() -> dict[str, str]:
    """File name → JSON text of every event's schema (deterministic, so drift is detectable)."""
    out: dict[str, str] = {}
    for subject, model in EVENT_MODELS.items():
        schema = model.model_json_schema(mode="validation")
        schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
        schema["$id"] = f"https://palace.dev/schemas/{subject}.json"
        schema["x-subject"] = subject if subject != "dead_letter" else "dlq.<subject>"
        out[f"{subject}.json"] = json.dumps(schema, indent=2, sort_keys=True) + "\n"
    return out


def write_schemas(directory: Path) -> list[Path]:
    """Write every schema into ``directory``; returns the paths written."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, text in render_schemas().items():
        p = directory / name
        p.write_text(text)
        paths.append(p)
    return paths


if __name__ == "__main__":
    for p in write_schemas(Path("schemas")):
        print(p)
