"""Settings that would make every message fail are refused when a service starts, naming the setting,
rather than accepted and found out one dead letter at a time."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from shared.bus import stream_configs
from shared.config import Settings
from shared.memory.chunking import chunk_text


@pytest.mark.parametrize(("overrides", "named"), [
    ({"max_deliver": 0}, "max_deliver"),  # every message dead-lettered as a crash before its handler ran
    ({"max_deliver": -1}, "max_deliver"),  # NATS's "unlimited", not ours
    ({"chunk_chars": 200}, "PALACE_CHUNK_OVERLAP"),  # overlap 100: the chunker refuses every message
    ({"chunk_overlap": -1}, "PALACE_CHUNK_OVERLAP"),
    ({"stream_replicas": 0}, "stream_replicas"),
])
def test_settings_every_message_would_fail_on_are_refused(overrides: dict[str, int], named: str) -> None:
    with pytest.raises(ValidationError, match=named):
        Settings(**overrides)  # type: ignore[arg-type]


def test_the_smallest_chunking_accepted_chunks_a_long_message() -> None:
    s = Settings(chunk_chars=201, chunk_overlap=100)
    assert len(chunk_text("A sentence that goes on. " * 40, max_chars=s.chunk_chars, overlap=s.chunk_overlap)) > 1


def test_both_streams_keep_the_configured_number_of_copies() -> None:
    assert {c.num_replicas for c in stream_configs(Settings(stream_replicas=3))} == {3}
    assert {c.num_replicas for c in stream_configs(Settings())} == {1}
