"""Which embedder a space gets: the settings' own for the first space, the recorded target's after a re-embed."""

from __future__ import annotations

import asyncio

from shared.adapters.hash_embedder import HashEmbedder
from shared.adapters.space_embedder import embedder_for, pinned
from shared.config import Settings
from shared.db.embedding_spaces import Space, SpaceTarget


def test_the_first_space_uses_the_settings_and_a_recorded_one_its_target() -> None:
    s = Settings(embed_provider="hash", embed_dim=48)
    first = embedder_for(s, Space("initial", None, None, None, 48, "active").target)
    assert (first.model_name, first.dim) == ("hash-48", 48)
    moved = embedder_for(s, Space("x", "hash", "hash", None, 16, "active").target)
    assert (moved.model_name, moved.dim) == ("hash-16", 16)
    assert asyncio.run(moved.embed_query("the Orion launch")).shape == (16,)


def test_a_recorded_target_overrides_the_remote_endpoint_of_the_settings() -> None:
    s = Settings(embed_base_url="http://127.0.0.1:9/v1", embed_model="remote")
    e = embedder_for(s, SpaceTarget("hash", "hash", 24))
    assert isinstance(e, HashEmbedder) and e.dim == 24


def test_pinned_hands_back_a_plain_embedder_unchanged() -> None:
    e = HashEmbedder(8)
    assert asyncio.run(pinned(e)) is e
