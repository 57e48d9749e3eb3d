"""Chat completions on any OpenAI-compatible endpoint, with retries only where retrying can help.

Timeouts, connection errors, 429 and 5xx are retried with exponential backoff (tenacity); a 400
or 401 will not get better by asking again and fails at once. Every attempt is counted (calls,
tokens, latency) in the metrics and in the caller's usage list, which the cost table is built from.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential_jitter

from shared.config import Settings
from shared.metrics import LLM_CALLS, LLM_SECONDS, LLM_TOKENS

__all__ = ["LlmClient", "LlmError", "Usage", "is_transient_llm"]


class LlmError(Exception):
    """An LLM call that failed for good (after retries, or at once for a non-transient error)."""


@dataclass(frozen=True, slots=True)
class Usage:
    """One attempt: what it cost and how it ended."""

    purpose: str
    outcome: str  # ok | error
    tokens_in: int
    tokens_out: int
    seconds: float


def is_transient_llm(exc: BaseException) -> bool:
    """Timeouts, unreachable endpoints, 429 and 5xx: worth another try. 4xx otherwise: not."""
    import openai

    if isinstance(exc, openai.APITimeoutError | openai.APIConnectionError):
        return True
    if isinstance(exc, openai.APIStatusError):
        return exc.status_code == 429 or exc.status_code >= 500
    return False


class LlmClient:
    def __init__(self, settings: Settings, client: Any = None) -> None:
        if client is None:
            from openai import AsyncOpenAI

            client = AsyncOpenAI(base_url=settings.llm_base_url, api_key=settings.llm_api_key or "unused",
                                 timeout=settings.llm_timeout_s, max_retries=0)
        self._client = client
        self._model = settings.llm_model
        self._attempts = max(1, settings.llm_attempts)

    async def chat(self, messages: list[dict[str, str]], *, purpose: str, usage: list[Usage]) -> str:
        """The answer's text. Appends one ``Usage`` per attempt to ``usage``.

        Raises:
            LlmError: the call failed for good; its message says why (for the drawer's failure reason).
        """
        try:
            async for attempt in AsyncRetrying(
                retry=retry_if_exception(is_transient_llm), stop=stop_after_attempt(self._attempts),
                wait=wait_exponential_jitter(multiplier=0.5, max=8.0), reraise=True,
            ):
                with attempt:
                    return await self._once(messages, purpose, usage)
        except Exception as e:
            raise LlmError(f"{type(e).__name__}: {str(e)[:300]}") from e
        raise LlmError("no attempt made")  # unreachable: AsyncRetrying makes at least one

    async def _once(self, messages: list[dict[str, str]], purpose: str, usage: list[Usage]) -> str:
        t0 = time.perf_counter()
        try:
            resp = await self._client.chat.completions.create(
                model=self._model, messages=messages, temperature=0, response_format={"type": "json_object"},
            )
        except Exception:
            dt = time.perf_counter() - t0
            LLM_CALLS.labels(purpose, "error").inc()
            LLM_SECONDS.labels(purpose).observe(dt)
            usage.append(Usage(purpose, "error", 0, 0, dt))
            raise
        dt = time.perf_counter() - t0
        u = getattr(resp, "usage", None)
        tin, tout = int(getattr(u, "prompt_tokens", 0) or 0), int(getattr(u, "completion_tokens", 0) or 0)
        LLM_CALLS.labels(purpose, "ok").inc()
        LLM_SECONDS.labels(purpose).observe(dt)
        LLM_TOKENS.labels(purpose, "in").inc(tin)
        LLM_TOKENS.labels(purpose, "out").inc(tout)
        usage.append(Usage(purpose, "ok", tin, tout, dt))
        return (resp.choices[0].message.content or "") if resp.choices else ""
