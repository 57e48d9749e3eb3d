"""Generate ``schemas/*.json`` from the event models."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from shared.events.models import EVENT_MODELS, DeadLetterInfo, SessionCompleted

__all__ = ["README_BEGIN", "README_END", "readme_with_reference", "render_producer_reference", "render_schemas",
           "write_schemas"]

README_BEGIN = "<!-- BEGIN producer reference: generated from the event models and settings by `palace schemas` -->"
README_END = "<!-- END producer reference -->"


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


def _type(prop: dict[str, Any]) -> str:
    """A short human reading of one JSON Schema property: type and constraints."""
    options = [o for o in prop.get("anyOf", [prop]) if o.get("type") != "null"]
    p = options[0] if options else prop
    if "$ref" in p:
        return p["$ref"].rsplit("/", 1)[-1].lower()
    if "const" in p:
        return f'`"{p["const"]}"`'
    if "enum" in p:
        return "one of " + ", ".join(f"`{v}`" for v in p["enum"])
    kind = {"string": "string", "array": "list", "object": "object", "integer": "integer"}.get(p.get("type", ""), "any")
    if p.get("format") == "date-time":
        return "ISO 8601 date-time"
    if kind == "list":
        item = _type(p.get("items", {}))
        return f"list of {item}, {p.get('minItems', 0)}–{p.get('maxItems', '∞')}"
    if p.get("pattern") and not p["pattern"].startswith("^[^"):
        return f"string `{p['pattern']}`"
    if "maxLength" in p:
        return f"string, {p.get('minLength', 0)}–{p['maxLength']} chars"
    return kind


def _fields_table(schema: dict[str, Any]) -> list[str]:
    required = set(schema.get("required", []))
    rows = ["| field | required | type | meaning |", "|---|---|---|---|"]
    order = sorted(schema["properties"], key=lambda k: k not in required)  # required first, else model order
    for name in order:
        prop = schema["properties"][name]
        rows.append(f"| `{name}` | {'yes' if name in required else 'no'} | {_type(prop)} | "
                    f"{prop.get('description', '').replace('|', '/')} |")
    return rows


def render_producer_reference() -> str:
    """The README's reference for producers: fields, roles and limits of ``session.completed`` and the
    dead-letter headers, rendered from the models and the settings' defaults so the two cannot drift."""
    from shared.config import Settings

    schema = SessionCompleted.model_json_schema(mode="validation")
    defaults = {k: f.default for k, f in Settings.model_fields.items()}
    lines = ["`session.completed` (subject `session.completed`, stream `PALACE`):", ""]
    lines += _fields_table(schema)
    lines += ["", "Each entry of `messages`:", ""]
    lines += _fields_table(schema["$defs"]["Message"])
    headers = ", ".join(f"`Palace-{k}`" for k in DeadLetterInfo.model_fields if k != "stream_seq")
    lines += [
        "",
        f"Limits (defaults): an event is at most {defaults['max_event_bytes']:,} bytes of UTF-8 JSON "
        f"(`PALACE_MAX_EVENT_BYTES`) with at most {defaults['max_messages_per_session']:,} messages "
        "(`PALACE_MAX_MESSAGES_PER_SESSION`, which may lower the schema's cap but not raise it); a single "
        "message may be any "
        "length within that and is chunked. "
        "Unknown fields are rejected; `system` and `tool` turns are stored raw but not filed as memories.",
        "",
        f"Dead-letter headers (on `dlq.<subject>`, stream `PALACE_DLQ`): {headers}.",
    ]
    return "\n".join(lines) + "\n"


def readme_with_reference(readme: str) -> str:
    """``readme`` with the text between the reference markers replaced by the current reference."""
    pattern = re.compile(re.escape(README_BEGIN) + r".*?" + re.escape(README_END), re.DOTALL)
    if not pattern.search(readme):
        raise ValueError("README has no producer reference markers")
    return pattern.sub(lambda _: f"{README_BEGIN}\n{render_producer_reference()}{README_END}", readme)


if __name__ == "__main__":
    for p in write_schemas(Path("schemas")):
        print(p)
