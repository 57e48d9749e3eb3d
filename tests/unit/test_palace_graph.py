"""Palace graph logic over a taxonomy: traversal order and bounds, tunnels, statistics."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from shared.palace_graph import Taxonomy, find_tunnels, graph_stats, traverse

# alice: music, hiking · bob: music, cooking · carol: cooking, chess · dave: gardening (isolated)
TAX = Taxonomy.from_counts([
    ("alice", "music", 3), ("alice", "hiking", 1), ("bob", "music", 2), ("bob", "cooking", 5),
    ("carol", "cooking", 1), ("carol", "chess", 4), ("dave", "gardening", 2),
])


def test_taxonomy_counts() -> None:
    assert TAX.total == 18
    assert TAX.wing_counts() == {"alice": 4, "bob": 7, "carol": 5, "dave": 2}
    assert TAX.rooms("bob") == {"cooking": 5, "music": 2}
    assert TAX.rooms()["music"] == 5 and TAX.rooms()["cooking"] == 6
    assert TAX.rooms("nobody") == {}
    assert TAX.room_wings()["cooking"] == ["bob", "carol"]


def test_traverse_is_breadth_first_and_bounded() -> None:
    hops = {v.room: v.hop for v in traverse(TAX, "hiking", max_hops=5)}
    assert hops == {"hiking": 0, "music": 1, "cooking": 2, "chess": 3}
    assert [v.room for v in traverse(TAX, "hiking", max_hops=1)] == ["hiking", "music"]
    visits = traverse(TAX, "hiking", max_hops=2)
    assert [(v.room, v.via_wing) for v in visits] == [("hiking", None), ("music", "alice"), ("cooking", "bob")]
    assert traverse(TAX, "gardening", 3)[0].wings == ["dave"] and len(traverse(TAX, "gardening", 3)) == 1
    assert traverse(TAX, "unknown") == []


def test_tunnels_and_stats() -> None:
    assert [(t.room, t.wings, t.drawers) for t in find_tunnels(TAX)] == [
        ("cooking", ["bob", "carol"], 6), ("music", ["alice", "bob"], 5)]
    assert [t.room for t in find_tunnels(TAX, "alice", "bob")] == ["music"]
    assert [t.room for t in find_tunnels(TAX, "carol")] == ["cooking"]
    assert find_tunnels(TAX, "alice", "carol") == []
    st_ = graph_stats(TAX)
    assert (st_.wings, st_.rooms, st_.drawers, st_.tunnels, st_.edges) == (4, 5, 18, 2, 3)
    assert st_.rooms_per_wing == {"alice": 2, "bob": 2, "carol": 2, "dave": 1}


names = st.sampled_from([f"r{i}" for i in range(8)])


@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c", "d"]), names, st.integers(1, 9)), min_size=1,
                max_size=20, unique_by=lambda t: (t[0], t[1])), names, st.integers(1, 5))
def test_traverse_properties(rows: list[tuple[str, str, int]], start: str, max_hops: int) -> None:
    tax = Taxonomy.from_counts(rows)
    visits = traverse(tax, start, max_hops)
    if start not in tax.room_wings():
        assert visits == []
        return
    rooms = [v.room for v in visits]
    assert len(rooms) == len(set(rooms)), "each room once"
    assert [v.hop for v in visits] == sorted(v.hop for v in visits), "breadth-first order"
    assert all(v.hop <= max_hops for v in visits)
    by_room = {v.room: v for v in visits}
    for v in visits[1:]:
        # reached through a wing it is in, from a room one hop closer that shares that wing
        assert v.via_wing in v.wings
        assert any(p.hop == v.hop - 1 and v.via_wing in p.wings for p in by_room.values())
