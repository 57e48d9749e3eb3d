"""The environment for a stack a test starts on its own (`palace up`, the fault suite): the caller's, without
its ``PALACE_`` settings. A test session's stack fixture sets short retry delays, a low delivery limit and its
own addresses in the process environment (``tests/integration/conftest.py``); whether a later test on the same
pytest-xdist worker inherited them depended on which test file ran there first, so a stack meant to run with
the product's defaults sometimes did not. ``PALACE_METRICS_PORT`` stays: it is the worker's own port range."""

from __future__ import annotations

import os
from collections.abc import Mapping

__all__ = ["own_stack_env"]

KEEP = ("PALACE_METRICS_PORT",)


def own_stack_env(base: Mapping[str, str] | None = None, **settings: str) -> dict[str, str]:
    """``base`` (default: ``os.environ``) without ``PALACE_`` settings but ``KEEP``, then ``settings``."""
    env = {k: v for k, v in (os.environ if base is None else base).items()
           if not k.startswith("PALACE_") or k in KEEP}
    return {**env, **settings}
