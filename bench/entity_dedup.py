"""Entity dedup's cost for one entity.upserted event among look-alike names: the batched evidence
(one statement per kind of evidence for every candidate pair of the event) side by side, in the same
run, with the per-pair queries it replaced (``shared/db/entity_dedup.py`` at ``--before-ref``, loaded
from git).

The workspace holds ``--entities`` deliberately look-alike people: spelling variants of each first
name ("Carolina", "Caroline", "Carolyne"...), each alone and with several surnames, every entity
mentioned in drawers with embeddings (so context similarity is computed), a share of them with a
common relation (so shared relations are found and look-alikes are flagged). No pair may merge (each
short name has several longer ones), so every round sees the same workspace. An event names
``--event`` of them; ``dedup_entities`` is timed for it, alternating the two implementations, and the
candidate pairs with their evidence must come out equal.

    .venv/bin/python bench/entity_dedup.py [--entities 2000] [--event 40] [--rounds 9]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import psycopg
from _common import (
    bench_servers,
    bench_settings,
    console,
    machine_info,
    module_at,
    prepare_process,
    write_results,
)
from pgvector.psycopg import register_vector

WORKSPACE = "bench-entity-dedup"
BEFORE_REF = "bac4332"  # the last commit with the per-pair evidence queries
ENDINGS = ["line", "lina", "lyn", "lene", "linn"]  # spelling variants of one first name
CONSONANTS, VOWELS = "bdfgkmnprstvz", "aeiou"


def names(n: int) -> list[str]:
    """Families of 20 look-alikes: five spellings of a first name ("Baroline", "Barolina", "Barolyn"...),
    each alone and with three surnames of the family. A family's names share their first letters and
    nothing else does, so each name has fewer candidates than the cap (a name with more is too common
    to decide on, and dedup skips it): the load is look-alikes, not one name shared by everyone."""
    out: list[str] = []
    fam = 0
    while len(out) < n:
        c1, v1, c2, v2 = (CONSONANTS[fam % 13], VOWELS[(fam // 13) % 5], CONSONANTS[(fam // 65) % 13 + 0],
                          VOWELS[(fam // 845) % 5])
        stem = (c1 + v1 + "r" + v2).capitalize() if fam < 65 else (c1 + v1 + c2 + v2).capitalize()
        surnames = [f"{stem[::-1].capitalize()}{x}" for x in ("son", "berg", "wood")]
        for ending in ENDINGS:
            first = stem + ending
            out.append(first)
            out += [f"{first} {s}" for s in surnames]
        fam += 1
    return out[:n]


def load_before(ref: str) -> ModuleType:
    """``shared.db.entity_dedup`` as it was at ``ref`` (imports resolve against today's tree)."""
    mod = module_at(ref, "shared/db/entity_dedup.py", "entity_dedup_before")

    async def kept_apart_pairs(conn: Any, ws: str, pairs: list[tuple[str, str]]) -> set[tuple[str, str]]:
        out = set()
        for a, b in pairs:  # the per-pair check it replaced
            if await mod.kept_apart(conn, ws, a, b):
                out.add(tuple(sorted((a, b))))
        return out

    mod.kept_apart_pairs = kept_apart_pairs  # type: ignore[attr-defined]
    return mod


def fill(database_url: str, all_names: list[str], dim: int, rng: random.Random) -> None:
    from shared.ids import stable_id
    from shared.memory.entity_dedup import dedup_keys
    from shared.memory.kg import anchor_word, entity_id, match_key

    nrng = np.random.default_rng(rng.randrange(2**32))
    with psycopg.connect(database_url, autocommit=True) as conn:
        register_vector(conn)
        for table in ("entity_flags", "entity_merges", "triple_evidence", "triples", "entity_mentions",
                      "entity_keys", "entity_aliases", "entities", "drawers"):
            conn.execute(f"DELETE FROM {table} WHERE workspace_id = %s", (WORKSPACE,))  # noqa: S608 - fixed names
        ids = [entity_id(WORKSPACE, n) for n in all_names]
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO entities (workspace_id, id, name, entity_type, mention_count)"
                            " VALUES (%s, %s, %s, 'person', 3)",
                            [(WORKSPACE, i, n) for i, n in zip(ids, all_names, strict=True)])
            cur.executemany("INSERT INTO entity_keys (workspace_id, key, entity_id) VALUES (%s, %s, %s)"
                            " ON CONFLICT DO NOTHING",
                            [(WORKSPACE, k, i) for i, n in zip(ids, all_names, strict=True) for k in dedup_keys(n)])
            cur.executemany("INSERT INTO entity_aliases (workspace_id, alias_key, anchor, entity_id, alias, cased)"
                            " VALUES (%s, %s, %s, %s, %s, true) ON CONFLICT DO NOTHING",
                            [(WORKSPACE, match_key(n), anchor_word(match_key(n)), i, n)
                             for i, n in zip(ids, all_names, strict=True)])
        with conn.cursor() as cur, cur.copy(
                "COPY drawers (workspace_id, id, content, content_hash, state, embedding)"
                " FROM STDIN WITH (FORMAT BINARY)") as copy:
            copy.set_types(["text", "text", "text", "text", "text", "vector"])
            for i, n in enumerate(all_names):
                for j in range(3):
                    v = nrng.standard_normal(dim).astype(np.float32)
                    did = stable_id("bench-drawer", str(i), str(j))
                    copy.write_row([WORKSPACE, did, f"{n} said something ({j})", did, "processed",
                                    v / np.linalg.norm(v)])
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO entity_mentions (workspace_id, entity_id, drawer_id) VALUES (%s, %s, %s)",
                            [(WORKSPACE, eid, stable_id("bench-drawer", str(i), str(j)))
                             for i, eid in enumerate(ids) for j in range(3)])
            # A quarter share a relation: their look-alikes are corroborated (flagged, never merged).
            painting = entity_id(WORKSPACE, "Painting")
            cur.execute("INSERT INTO entities (workspace_id, id, name, entity_type) VALUES (%s, %s, 'Painting',"
                        " 'concept')", (WORKSPACE, painting))
            cur.executemany("INSERT INTO triples (workspace_id, id, subject_id, predicate, object_id, valid_from)"
                            " VALUES (%s, %s, %s, 'likes', %s, now())",
                            [(WORKSPACE, stable_id("bench-triple", eid), eid, painting)
                             for k, eid in enumerate(ids) if k % 4 == 0])
        for table in ("entities", "entity_keys", "entity_aliases", "entity_mentions", "triples", "drawers"):
            conn.execute(f"ANALYZE {table}")


async def run(database_url: str, args: argparse.Namespace, dim: int) -> dict[str, Any]:
    import shared.kg_dedup as kg_dedup
    from shared.db import entity_dedup as after
    from shared.db.pool import open_pool
    from shared.db.tenancy import workspace_tx
    from shared.memory.kg import entity_id

    rng = random.Random(args.seed)
    all_names = names(args.entities)
    fill(database_url, all_names, dim, rng)
    event = [entity_id(WORKSPACE, n) for n in rng.sample(all_names, args.event)]
    before = load_before(args.before_ref)
    impls = {"per_pair": before, "batched": after}
    # One connection, so its server process's CPU time is the event's database work.
    pool = await open_pool(database_url, name="bench-entity-dedup", min_size=1, max_size=1)
    try:
        async with pool.connection() as conn:
            backend = int((await (await conn.execute("SELECT pg_backend_pid()")).fetchone())[0])
        # Same pairs, same evidence, same decisions.
        got: dict[str, Any] = {}
        for label, mod in impls.items():
            async with workspace_tx(pool, WORKSPACE) as conn:
                live = [r for r in await mod.live_entities(conn, WORKSPACE, sorted(event)) if r.merged_into is None]
                got[label] = sorted(await mod.candidates_of(conn, WORKSPACE, live), key=lambda p: (p[0].id, p[1].id))
        assert got["per_pair"] == got["batched"], "the two implementations disagree"
        pairs = len(got["batched"])
        wall: dict[str, list[float]] = {k: [] for k in impls}
        cpu: dict[str, list[float]] = {k: [] for k in impls}
        db_cpu: dict[str, list[float]] = {k: [] for k in impls}
        outcomes: dict[str, set[tuple[int, int]]] = {k: set() for k in impls}
        for r in range(args.rounds + 1):
            for label in (list(impls) if r % 2 else list(reversed(impls))):
                kg_dedup.sql = impls[label]  # type: ignore[attr-defined]
                t0, c0, d0 = time.perf_counter(), time.process_time(), _proc_cpu_ms(backend)
                out = await kg_dedup.dedup_entities(pool, WORKSPACE, event, context_threshold=0.8)
                if r:  # round 0 warms caches and plans
                    wall[label].append((time.perf_counter() - t0) * 1000)
                    cpu[label].append((time.process_time() - c0) * 1000)
                    db_cpu[label].append(_proc_cpu_ms(backend) - d0)
                outcomes[label].add((len(out.merged), out.flagged))
        kg_dedup.sql = after  # type: ignore[attr-defined]
        phases = await _phases(pool, after, event, rounds=3)
    finally:
        await pool.close()
    assert outcomes["per_pair"] == outcomes["batched"] and all(m == 0 for m, _ in outcomes["batched"]), outcomes
    return {"entities": len(all_names), "event": args.event, "candidate_pairs": pairs,
            "flagged": next(iter(outcomes["batched"]))[1], "rounds": args.rounds, "before_ref": args.before_ref,
            **{f"{k}_ms_median": statistics.median(v) for k, v in wall.items()},
            **{f"{k}_ms_all": [round(x, 1) for x in v] for k, v in wall.items()},
            **{f"{k}_client_cpu_ms_median": statistics.median(v) for k, v in cpu.items()},
            **{f"{k}_db_cpu_ms_median": statistics.median(v) for k, v in db_cpu.items()},
            "batched_phase_ms_median": phases}


def _proc_cpu_ms(pid: int) -> float:
    """User + system CPU time of a local process (the PostgreSQL backend serving the bench), in ms."""
    import os

    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")


async def _phases(pool: Any, mod: ModuleType, event: list[str], rounds: int) -> dict[str, float]:
    """Where the batched event's time goes: each step of dedup_entities timed on its own."""
    import shared.kg_dedup as kg_dedup

    spent: dict[str, list[float]] = {}
    # (module, function name) of each step: the mention refresh is shared.db.kg's, called from kg_dedup.
    steps = [(kg_dedup, "refresh_entities")] + [(mod, n) for n in (
        "absorb_followups", "live_entities", "index_entity_keys", "candidates_of", "kept_apart_pairs",
        "flag_pair", "merge_entities", "_shared_relations", "_context_similarity", "_count_longer")]
    originals = {(m, n): getattr(m, n) for m, n in steps}

    def timed(name: str, fn: Any) -> Any:
        async def wrapper(*a: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return await fn(*a, **kw)
            finally:
                spent.setdefault(name, []).append((time.perf_counter() - t0) * 1000)
        return wrapper

    for (m, n), fn in originals.items():
        setattr(m, n, timed(n, fn))
    try:
        totals: dict[str, list[float]] = {}
        for _ in range(rounds):
            spent.clear()
            t0 = time.perf_counter()
            await kg_dedup.dedup_entities(pool, WORKSPACE, event, context_threshold=0.8)
            totals.setdefault("total", []).append((time.perf_counter() - t0) * 1000)
            for n, v in spent.items():
                totals.setdefault(n, []).append(sum(v))
    finally:
        for (m, n), fn in originals.items():
            setattr(m, n, fn)
    return {n: round(statistics.median(v), 1) for n, v in totals.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--entities", type=int, default=2000)
    ap.add_argument("--event", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--before-ref", default=BEFORE_REF)
    args = ap.parse_args()
    prepare_process()
    settings = bench_settings()
    with bench_servers(settings) as (sup, load):
        res = asyncio.run(run(sup.database_url, args, settings.embed_dim))
    res["machine"] = {**machine_info(), "load_at_start": load}
    console.print(f"{res['entities']} look-alike entities; an event of {res['event']}: {res['candidate_pairs']} "
                  f"candidate pairs, {res['flagged']} flagged, no merge")
    console.print(f"dedup of the event, median of {res['rounds']} alternating rounds: per-pair "
                  f"{res['per_pair_ms_median']:.1f} ms, batched {res['batched_ms_median']:.1f} ms "
                  f"({res['per_pair_ms_median'] / res['batched_ms_median']:.1f}x); client CPU "
                  f"{res['per_pair_client_cpu_ms_median']:.1f} vs {res['batched_client_cpu_ms_median']:.1f} ms, "
                  f"PostgreSQL CPU {res['per_pair_db_cpu_ms_median']:.0f} vs {res['batched_db_cpu_ms_median']:.0f} ms")
    console.print("batched, by step (median ms): " + ", ".join(f"{k} {v}" for k, v in
                                                            res["batched_phase_ms_median"].items()))
    write_results("entity_dedup", res)


if __name__ == "__main__":
    main()
