"""The LLM phase over a batch of drawers of one workspace: one call per ``batch`` drawers, and,
for whatever a batch answer did not label validly, one call per drawer."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from shared.memory.llm_labels import LlmLabel, LlmParseError, build_messages, parse_batch

__all__ = ["Chat", "ColdResult", "label_with_llm"]

Chat = Callable[[list[dict[str, str]]], Awaitable[str]]  # raises on a failed call


@dataclass
class ColdResult:
    labels: dict[str, LlmLabel] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)  # drawer id → why it has no label
    warnings: list[str] = field(default_factory=list)


async def label_with_llm(chat: Chat, items: list[tuple[str, str]], *, batch: int) -> ColdResult:
    """Labels for (id, content) items; ids the model could not label end in ``errors``."""
    out = ColdResult()
    for i in range(0, len(items), max(1, batch)):
        chunk = items[i:i + max(1, batch)]
        ids = [d for d, _ in chunk]
        try:
            parsed = parse_batch(await chat(build_messages(chunk)), ids)
            out.labels.update(parsed.labels)
            out.warnings.extend(parsed.warnings)
            missing = [it for it in chunk if it[0] not in parsed.labels]
            why = "no valid label in the batch answer"
        except LlmParseError as e:
            out.warnings.append(f"batch of {len(chunk)} unparseable ({e}); asking one by one")
            missing, why = chunk, str(e)
        except Exception as e:  # the call failed for good: one-by-one calls would fail the same way
            out.errors.update({d: str(e) for d in ids})
            continue
        if len(chunk) == 1:
            out.errors.update({d: why for d, _ in missing})
            continue
        for did, content in missing:
            try:
                parsed = parse_batch(await chat(build_messages([(did, content)])), [did])
            except Exception as e:
                out.errors[did] = str(e)
                continue
            out.warnings.extend(parsed.warnings)
            if did in parsed.labels:
                out.labels[did] = parsed.labels[did]
            else:
                out.errors[did] = "no valid label in the single-drawer answer"
    return out
