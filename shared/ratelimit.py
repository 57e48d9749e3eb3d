"""Token buckets per caller, in memory, with bounded size.

Each caller (an API key, or a client address) gets ``burst`` tokens that refill at ``rate`` per
second; a request spends one. A bucket that has been idle long enough to refill completely is
indistinguishable from a new one, so it is dropped; beyond ``max_buckets`` the least recently used
bucket is dropped too, which at worst hands that caller a fresh burst. Memory therefore never grows
with the number of distinct callers ever seen.

Limits are per process: with several api replicas a caller may get up to ``replicas × rate``.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["TokenBuckets"]


@dataclass
class _Bucket:
    tokens: float
    at: float


class TokenBuckets:
    """Not thread-safe: meant for one event loop, where each call runs without interruption."""

    def __init__(self, rate: float, burst: int, max_buckets: int = 10_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if rate <= 0 or burst < 1 or max_buckets < 1:
            raise ValueError("rate must be > 0, burst and max_buckets >= 1")
        self.rate = rate
        self.burst = float(burst)
        self.max_buckets = max_buckets
        self._clock = clock
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()
        self._full_after = self.burst / rate

    def __len__(self) -> int:
        return len(self._buckets)

    def take(self, caller: str) -> float:
        """Spend one token of ``caller``. Returns 0.0 when allowed, else the seconds until a token is
        available (the request is refused and nothing is spent)."""
        now = self._clock()
        self._evict_idle(now)
        b = self._buckets.get(caller)
        if b is None:
            b = _Bucket(self.burst, now)
            self._buckets[caller] = b
            if len(self._buckets) > self.max_buckets:
                self._buckets.popitem(last=False)
        else:
            b.tokens = min(self.burst, b.tokens + (now - b.at) * self.rate)
            b.at = now
            self._buckets.move_to_end(caller)
        if b.tokens >= 1.0:
            b.tokens -= 1.0
            return 0.0
        return (1.0 - b.tokens) / self.rate

    def wait(self, caller: str) -> float:
        """What ``take`` would answer, without spending: 0.0 when ``caller`` has a token."""
        b = self._buckets.get(caller)
        if b is None:
            return 0.0
        tokens = min(self.burst, b.tokens + (self._clock() - b.at) * self.rate)
        return 0.0 if tokens >= 1.0 else (1.0 - tokens) / self.rate

    @staticmethod
    def retry_after_header(wait_s: float) -> str:
        """Retry-After takes whole seconds; rounding down would invite a retry that fails again."""
        return str(max(1, math.ceil(wait_s)))

    def _evict_idle(self, now: float) -> None:
        # Least recently used first: stop at the first bucket still refilling.
        while self._buckets:
            key, oldest = next(iter(self._buckets.items()))
            if now - oldest.at < self._full_after:
                return
            del self._buckets[key]
