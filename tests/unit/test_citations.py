"""Citations read back: what ``cite`` writes, ``parse_citation`` returns; anything else is refused."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.memory.citations import MIN_PREFIX_LEN, CitationRef, cite, parse_citation

DRAWER = "0123456789abcdef0123456789abcdef"
names = st.text(st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=30).filter(
    lambda s: s.strip() == s and "/" not in s)


@given(wing=st.lists(names, min_size=1, max_size=3).map("/".join), room=names)
def test_every_citation_reads_back_to_its_wing_room_and_short_id(wing: str, room: str) -> None:
    assert parse_citation(cite(wing, room, DRAWER)) == CitationRef(DRAWER[:12], wing, room)


@pytest.mark.parametrize(("ref", "want"), [
    (DRAWER, CitationRef(DRAWER)),
    (DRAWER[:MIN_PREFIX_LEN], CitationRef(DRAWER[:MIN_PREFIX_LEN])),
    (f"  [alice/music/{DRAWER[:12]}] ", CitationRef(DRAWER[:12], "alice", "music")),
    (f"alice/music/{DRAWER.upper()}", CitationRef(DRAWER, "alice", "music")),
    (f"`team/a/b/{DRAWER}`", CitationRef(DRAWER, "team/a", "b")),
])
def test_ids_prefixes_and_quoted_citations(ref: str, want: CitationRef) -> None:
    assert parse_citation(ref) == want


@pytest.mark.parametrize("ref", ["", "alice/music/violin", DRAWER[:MIN_PREFIX_LEN - 1], f"music/{DRAWER}",
                                 f"/music/{DRAWER}", f"alice//{DRAWER}", DRAWER + "0", "alice/music/"])
def test_what_is_not_a_drawer_reference_is_refused(ref: str) -> None:
    with pytest.raises(ValueError, match="not a"):
        parse_citation(ref)
