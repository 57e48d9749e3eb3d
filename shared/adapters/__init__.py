"""Adapters: one module per provider, each implementing a port from ``shared.ports``."""

from __future__ import annotations

from shared.config import Settings
from shared.ports import Embedder

__all__ = ["build_embedder"]


def build_embedder(settings: Settings) -> Embedder:
    """The embedder the configuration asks for: a remote OpenAI-compatible one when
    ``PALACE_EMBED_BASE_URL`` is set (or provider is 'openai'), the lexical hashing embedder for
    'hash' (benchmarks of the pipeline itself), else the bundled local model."""
    if settings.embed_provider == "hash":
        from shared.adapters.hash_embedder import HashEmbedder

        return HashEmbedder(settings.embed_dim)
    if settings.embed_base_url or settings.embed_provider == "openai":
        from shared.adapters.openai_embedder import OpenAIEmbedder, OpenAIEmbedderConfig

        return OpenAIEmbedder(OpenAIEmbedderConfig.from_settings(settings))
    from shared.adapters.local_embedder import LocalEmbedder, LocalEmbedderConfig

    return LocalEmbedder(LocalEmbedderConfig.from_settings(settings))
