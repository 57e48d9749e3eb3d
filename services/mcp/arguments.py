"""Unknown tool arguments are refused, with the names the tool takes.

The SDK's argument models ignore extra keys, so a call with another server's names went through and
silently meant something else: ``memory_search(query, k=20)`` (REST's and the SDK's name) returned five
hits, and ``memory_search(query, wing="orion")`` (MemPalace's signature) searched every wing. Each tool's
argument model is replaced by one that forbids extra keys (``additionalProperties: false`` in the schema an
LLM reads) and names the closest argument the tool does take.
"""

from __future__ import annotations

import difflib
from typing import Any

from mcp.server.mcpserver.tools import Tool
from pydantic import ConfigDict, model_validator

__all__ = ["refuse_unknown_arguments", "unknown_argument_message"]

# Other memory servers' and our other interfaces' names for an argument a tool takes under another name.
_SYNONYMS = {"k": "limit", "top_k": "limit", "n": "limit", "max_results": "limit", "episodes_k": "episodes_limit",
             "text": "content", "memory": "content", "id": "drawer", "drawer_id": "drawer", "drawer": "drawer_id"}


def unknown_argument_message(unknown: list[str], accepted: list[str]) -> str:
    """What the model reads: each unknown name, the closest one the tool takes, and the whole list."""
    parts = []
    for name in unknown:
        guess = _SYNONYMS.get(name)
        if guess not in accepted:
            close = difflib.get_close_matches(name, accepted, n=1, cutoff=0.6)
            guess = close[0] if close else None
        parts.append(f"unknown argument '{name}'" + (f" (did you mean '{guess}'?)" if guess else ""))
    return "; ".join(parts) + f". This tool takes: {', '.join(accepted) or 'no arguments'}."


def refuse_unknown_arguments(tool: Tool) -> None:
    """Swap the tool's argument model for one that refuses keys it does not declare (in place)."""
    base = tool.fn_metadata.arg_model
    accepted = [f.alias or n for n, f in base.model_fields.items()]
    title = base.model_config.get("title") or base.__name__

    class Strict(base):  # type: ignore[valid-type, misc]
        model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True, title=title)

        @model_validator(mode="before")
        @classmethod
        def _known(cls, data: Any) -> Any:
            if isinstance(data, dict) and (unknown := sorted(set(data) - set(accepted))):
                raise ValueError(unknown_argument_message(unknown, accepted))
            return data

    tool.fn_metadata.arg_model = Strict
    tool.parameters = Strict.model_json_schema(by_alias=True)
