"""SQL of forgetting: tombstones the pipeline checks, the per-batch deletions, the audit record.

Ordering with the pipeline is what keeps an in-flight event from resurrecting forgotten rows. Every
writer that could re-create them (ingest's store and linker, enrich's episode and entity writes,
cluster's decisions, an approved proposal, a dreaming claim) first takes a *shared* advisory lock on
the workspace, then looks the tombstones up (or checks that its drawers still exist), in the
transaction that writes. Forget writes its tombstones holding the *exclusive* lock. So a writer either committed
before the tombstones (and forget, which deletes only afterwards, sees and deletes its rows) or runs
after them (and sees them). The lock is per workspace and held only for one short transaction.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from psycopg import AsyncConnection, sql
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from shared.db.decisions import restore_columns
from shared.db.drawers import history_id_for, record_history
from shared.db.kg import recount_entities
from shared.db.tenancy import holds_lock, workspace_tx
from shared.memory.decisions import content_hash as decision_hash
from shared.memory.filing import placement

__all__ = [
    "KINDS",
    "finish_audit",
    "forgotten",
    "forgotten_pair",
    "forgotten_session_drawers",
    "lock_for_write",
    "start_audit",
    "write_tombstones",
    "writer_tx",
]

KINDS = ("workspace", "user", "agent", "session", "drawer")
# Forget's lock of a workspace, by name (``_lock_name``): the name bound as a parameter, or as a literal where
# it travels with a BEGIN (``writer_tx``).
_LOCK_OF = "SELECT pg_advisory_xact_lock{mode}(hashtextextended({name}, 0))"
_LOCK = _LOCK_OF.format(mode="{mode}", name="'palace.forget:' || %s")
# Whether the workspace, the session (%(s)s), its user (%(u)s) or its agent (%(a)s) was forgotten; a session
# known only by its id is matched to its user and agent through the stored session row.
# Tombstones name users, agents and sessions by ``palace_forget_key`` (migration 0056), never in clear.
_FORGOTTEN = """(EXISTS (SELECT 1 FROM forget_tombstones
                          WHERE workspace_id = %(ws)s
                            AND ((kind = 'workspace' AND value = '*')
                              OR (kind = 'session' AND value = palace_forget_key(%(ws)s, 'session', %(s)s))
                              OR (kind = 'user' AND value = palace_forget_key(%(ws)s, 'user', %(u)s))
                              OR (kind = 'agent' AND value = palace_forget_key(%(ws)s, 'agent', %(a)s))))
              OR EXISTS (SELECT 1 FROM sessions ss JOIN forget_tombstones t
                            ON t.workspace_id = ss.workspace_id
                           AND ((t.kind = 'user' AND t.value = palace_forget_key(ss.workspace_id, 'user', ss.user_id))
                             OR (t.kind = 'agent'
                                 AND t.value = palace_forget_key(ss.workspace_id, 'agent', ss.agent_id)))
                          WHERE ss.workspace_id = %(ws)s AND ss.session_id = %(s)s))"""
_FORGOTTEN_SQL = sql.SQL("SELECT {}").format(sql.SQL(_FORGOTTEN)).as_string()
_FORGOTTEN_DRAWERS_SQL = sql.SQL(
    "SELECT {}, ARRAY(SELECT value FROM forget_tombstones"
    " WHERE workspace_id = %(ws)s AND kind = 'drawer' AND value = ANY(%(ids)s))"
).format(sql.SQL(_FORGOTTEN)).as_string()


def _lock_name(workspace_id: str) -> str:
    return f"palace.forget:{workspace_id}"


async def lock_for_write(conn: AsyncConnection[Any], workspace_id: str) -> None:
    """A writer's side of the ordering (shared: writers never wait for each other). Nothing to send when
    the transaction began holding it (``writer_tx``). A lock taken here is not remembered: taken inside a
    savepoint that is rolled back, PostgreSQL releases it, so only one taken with the BEGIN is known held."""
    if holds_lock(conn, _lock_name(workspace_id)):
        return
    await conn.execute(_LOCK.format(mode="_shared"), (workspace_id,))


@asynccontextmanager
async def writer_tx(pool: AsyncConnectionPool, workspace_id: str) -> AsyncIterator[AsyncConnection[Any]]:
    """A workspace transaction that begins ordered with forget: the writer's lock travels with the BEGIN
    (one round trip fewer than ``lock_for_write`` as its first statement, which then costs nothing).
    For a transaction that checks what was forgotten before it writes."""
    take = sql.SQL(_LOCK_OF.format(mode="_shared", name="{}")).format(sql.Literal(_lock_name(workspace_id)))
    async with workspace_tx(pool, workspace_id, lock=(_lock_name(workspace_id), take)) as conn:
        yield conn


async def forgotten(conn: AsyncConnection[Any], workspace_id: str, *, session_id: str | None = None,
                    user_id: str | None = None, agent_id: str | None = None) -> bool:
    """Whether the workspace, the session, its user or its agent was forgotten (takes the writer's
    lock first: call it in the transaction that writes). A few primary-key probes; a stage that
    knows only the session finds its user and agent on the stored session row."""
    await lock_for_write(conn, workspace_id)
    cur = await conn.execute(_FORGOTTEN_SQL, {"ws": workspace_id, "s": session_id, "u": user_id, "a": agent_id})
    row = await cur.fetchone()
    return bool(row and row[0])


async def forgotten_session_drawers(conn: AsyncConnection[Any], workspace_id: str, *, session_id: str,
                                    user_id: str | None, agent_id: str | None,
                                    drawer_ids: list[str]) -> tuple[bool, set[str]]:
    """``forgotten`` and the drawers forgotten one by one, in one round trip after the writer's lock: whether
    the session (its user, its agent, the workspace) was forgotten, and which of these drawers were."""
    await lock_for_write(conn, workspace_id)
    cur = await conn.execute(_FORGOTTEN_DRAWERS_SQL, {"ws": workspace_id, "s": session_id, "u": user_id,
                                                      "a": agent_id, "ids": drawer_ids})
    row = await cur.fetchone()
    return (bool(row[0]), set(row[1] or ())) if row else (False, set())


async def forgotten_pair(conn: AsyncConnection[Any], workspace_id: str, agent_id: str, user_id: str) -> bool:
    """Whether the workspace, this agent or this user was forgotten ('' names no agent / no user); takes
    the writer's lock first, like ``forgotten``."""
    await lock_for_write(conn, workspace_id)
    cur = await conn.execute(
        """SELECT EXISTS (SELECT 1 FROM forget_tombstones
                           WHERE workspace_id = %(ws)s
                             AND ((kind = 'workspace' AND value = '*')
                               OR (kind = 'user' AND value = palace_forget_key(%(ws)s, 'user', %(u)s))
                               OR (kind = 'agent' AND value = palace_forget_key(%(ws)s, 'agent', %(a)s))))""",
        {"ws": workspace_id, "u": user_id or None, "a": agent_id or None})
    row = await cur.fetchone()
    return bool(row and row[0])


async def write_tombstones(conn: AsyncConnection[Any], workspace_id: str, forget_id: str, kind: str,
                           values: list[str]) -> None:
    """Record what is being forgotten, under the exclusive lock (waits for writers in flight)."""
    await conn.execute(_LOCK.format(mode=""), (workspace_id,))
    async with conn.cursor() as cur:
        await cur.executemany(
            # Keyed on insert (palace_forget_key, migration 0057): the id itself is not stored.
            "INSERT INTO forget_tombstones (workspace_id, kind, value, forget_id) VALUES (%s, %s, %s, %s)"
            " ON CONFLICT DO NOTHING",
            [(workspace_id, kind, v, forget_id) for v in values],
        )


async def start_audit(conn: AsyncConnection[Any], workspace_id: str, forget_id: str, requested_by: str,
                      kind: str, value: str) -> None:
    await conn.execute(
        # scope_value is keyed on insert (palace_forget_key, migration 0057).
        """INSERT INTO forget_audit (workspace_id, id, requested_by, scope_kind, scope_value)
           VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING""",
        (workspace_id, forget_id, requested_by, kind, value),
    )


async def finish_audit(conn: AsyncConnection[Any], workspace_id: str, forget_id: str, counts: dict[str, int],
                       status: str = "done") -> None:
    await conn.execute(
        "UPDATE forget_audit SET counts = %s, status = %s, finished_at = now() WHERE workspace_id = %s AND id = %s",
        (Jsonb(counts), status, workspace_id, forget_id),
    )


async def scope_sessions(conn: AsyncConnection[Any], workspace_id: str, kind: str, value: str, after: str,
                         limit: int) -> list[str]:
    """The next ``limit`` session ids in scope after ``after`` (an index walk per kind)."""
    where = {"workspace": "TRUE", "user": "user_id = %(v)s", "agent": "agent_id = %(v)s",
             "session": "session_id = %(v)s"}[kind]
    cur = await conn.execute(
        f"""SELECT session_id FROM sessions WHERE workspace_id = %(ws)s AND {where} AND session_id > %(after)s
             ORDER BY session_id LIMIT %(n)s""",  # noqa: S608 - ``where`` is one of the fixed strings above
        {"ws": workspace_id, "v": value, "after": after, "n": limit},
    )
    return [r[0] for r in await cur.fetchall()]


async def drawers_of_sessions(conn: AsyncConnection[Any], workspace_id: str, session_ids: list[str]) -> list[str]:
    cur = await conn.execute(
        """SELECT drawer_id FROM drawer_sources WHERE workspace_id = %(ws)s AND session_id = ANY(%(s)s)
           UNION SELECT id FROM drawers WHERE workspace_id = %(ws)s AND session_id = ANY(%(s)s)""",
        {"ws": workspace_id, "s": session_ids},
    )
    return [r[0] for r in await cur.fetchall()]


async def dreamt_from(conn: AsyncConnection[Any], workspace_id: str, session_ids: list[str],
                      episode_ids: list[str]) -> list[str]:
    """The output sessions ('dreaming:<run>') of the dreaming runs that consolidated an episode of these
    sessions: their drawers were synthesised from it (index dreaming_runs_episodes, migration 0040).
    ``episode_ids`` names episodes that may be gone already (expired, or a forget that stopped half way)."""
    cur = await conn.execute(
        """SELECT session_id FROM dreaming_runs
            WHERE workspace_id = %(ws)s AND episode_ids && (%(e)s::text[] || ARRAY(
                  SELECT id FROM episodes WHERE workspace_id = %(ws)s AND session_id = ANY(%(s)s)))
            ORDER BY session_id""",
        {"ws": workspace_id, "s": session_ids, "e": episode_ids})
    return [r[0] for r in await cur.fetchall()]


async def drawer_fates(conn: AsyncConnection[Any], workspace_id: str, drawer_ids: list[str],
                       session_ids: list[str], *, whole_workspace: bool) -> list[dict[str, Any]]:
    """Per drawer: its content fields, whether its first sighting is in these sessions, and whether it
    was also seen in a session not being forgotten (then it stays, without the forgotten sightings)."""
    cur = await conn.execute(
        """SELECT d.id, d.content, d.speaker, d.context, d.content_hash, d.embedding,
                  coalesce(d.session_id = ANY(%(s)s), false),
                  NOT %(all)s AND EXISTS (
                      SELECT 1 FROM drawer_sources s
                       WHERE s.workspace_id = d.workspace_id AND s.drawer_id = d.id
                         AND s.session_id <> ALL(%(s)s)
                         AND s.revision IS NULL  -- a sighting edited away says nothing now
                         AND NOT EXISTS (SELECT 1 FROM forget_tombstones t
                                          WHERE t.workspace_id = s.workspace_id AND t.kind = 'session'
                                            AND t.value = palace_forget_key(s.workspace_id, 'session',
                                                                            s.session_id)))
             FROM drawers d WHERE d.workspace_id = %(ws)s AND d.id = ANY(%(ids)s)""",
        {"ws": workspace_id, "s": session_ids, "ids": drawer_ids, "all": whole_workspace},
    )
    cols = ("id", "content", "speaker", "context", "content_hash", "embedding", "first_here", "shared")
    return [dict(zip(cols, r, strict=True)) for r in await cur.fetchall()]


# Facts sourced from these drawers (by index: triples_source_drawer) that other evidence still states take
# their provenance from the earliest such statement; the start of the fact is when that was said, unless
# that falls after the fact's recorded end.
_RESOURCE_TRIPLES_SQL = """
    UPDATE triples t
       SET source_drawer = e.drawer_id, source_session = e.session_id, source_seq = e.seq,
           source_episode = e.episode_id,
           valid_from = CASE WHEN e.said_at IS NULL THEN t.valid_from
                             WHEN t.valid_to IS NOT NULL AND e.said_at > t.valid_to THEN t.valid_to
                             ELSE e.said_at END
      FROM (SELECT DISTINCT ON (v.triple_id) v.triple_id, v.drawer_id, v.session_id, v.seq, v.episode_id, v.said_at
              FROM triples x JOIN triple_evidence v ON v.workspace_id = x.workspace_id AND v.triple_id = x.id
             WHERE x.workspace_id = %(ws)s AND x.source_drawer = ANY(%(ids)s) AND NOT (v.drawer_id = ANY(%(ids)s))
             ORDER BY v.triple_id, v.said_at NULLS LAST, v.drawer_id) e
     WHERE t.workspace_id = %(ws)s AND t.id = e.triple_id"""


MERGES_NAMING_SQL = """SELECT id, survivor_id, merged_id, snapshot, status FROM entity_merges
                         WHERE workspace_id = %(ws)s AND snapshot->'mentions' ?| %(ids)s::text[]
                         ORDER BY id FOR UPDATE"""


async def _forget_in_entity_merges(conn: AsyncConnection[Any], workspace_id: str, ids: list[str]) -> dict[str, Any]:
    """Entity dedup moved a merged entity's mentions and facts to the survivor and kept them in the merge's
    snapshot for an exact revert (its name, aliases, the drawers that mentioned it, its facts). For each
    merge whose snapshot names these drawers (by index: migration 0053): the drawers and the facts read in
    them leave the snapshot; and where nothing that still exists ever mentioned the merged entity, it is
    forgotten itself: its row, the aliases the merge gave the survivor, the merge and its audit row's
    content (a revert could otherwise bring the name back)."""
    cur = await conn.execute(MERGES_NAMING_SQL, {"ws": workspace_id, "ids": ids})
    rows = await cur.fetchall()
    out: dict[str, Any] = {"scrubbed": 0, "entities": []}
    forgotten_ids = set(ids)
    for merge_id, survivor, loser, snap, status in rows:
        left = [m for m in snap.get("mentions", []) if m not in forgotten_ids]
        if left:
            cur = await conn.execute("SELECT id FROM drawers WHERE workspace_id = %s AND id = ANY(%s)",
                                     (workspace_id, left))
            left = [r[0] for r in await cur.fetchall()]
        # A reverted merge's entity lives on its own again: forget's usual path decides about it.
        if left or status != "merged":
            kept = [t for t in snap.get("triples", []) if t.get("source_drawer") not in forgotten_ids]
            kept_ids = {t["id"] for t in kept}
            snap = {**snap, "mentions": [m for m in snap["mentions"] if m not in forgotten_ids],
                    "mentions_added": [m for m in snap.get("mentions_added", []) if m not in forgotten_ids],
                    "mention_confidence": {k: v for k, v in snap.get("mention_confidence", {}).items()
                                           if k not in forgotten_ids},
                    "triples": kept,
                    "absorbed": {k: v for k, v in snap.get("absorbed", {}).items() if k in kept_ids},
                    "evidence": {k: [v for v in rows_ if v.get("drawer_id") not in forgotten_ids]
                                 for k, rows_ in snap.get("evidence", {}).items() if k in kept_ids},
                    "evidence_added": {k: [d for d in ds if d not in forgotten_ids]
                                       for k, ds in snap.get("evidence_added", {}).items()}}
            await conn.execute("UPDATE entity_merges SET snapshot = %s WHERE workspace_id = %s AND id = %s",
                               (Jsonb(snap), workspace_id, merge_id))
            out["scrubbed"] += 1
            continue
        added = list(snap.get("aliases_added", []))
        if added:
            await conn.execute("DELETE FROM entity_aliases WHERE workspace_id = %s AND entity_id = %s"
                               " AND alias_key = ANY(%s)", (workspace_id, survivor, added))
        await conn.execute("DELETE FROM entity_merges WHERE workspace_id = %s AND id = %s", (workspace_id, merge_id))
        await conn.execute("DELETE FROM entity_flags WHERE workspace_id = %s AND (entity_a = %s OR entity_b = %s)",
                           (workspace_id, loser, loser))
        await conn.execute(
            "UPDATE memory_history SET reason = NULL, old_value = NULL, new_value = NULL"
            " WHERE workspace_id = %s AND id = %s",
            (workspace_id, history_id_for(workspace_id, f"entity-merge:{merge_id}", None, "ENTITY_MERGE")))
        cur = await conn.execute("DELETE FROM entities WHERE workspace_id = %s AND id = %s AND merged_into IS NOT NULL"
                                 " RETURNING id", (workspace_id, loser))
        out["entities"] += [r[0] for r in await cur.fetchall()]
        out["scrubbed"] += 1
    return out


async def _scrub_history(conn: AsyncConnection[Any], workspace_id: str, keys: list[tuple[str, str]]) -> int:
    """Empty the audit rows of these (event id, action) pairs, rows with no drawer (found by their ids,
    which ``record_history`` derives from both): the rows stay, what they said of the forgotten goes."""
    if not keys:
        return 0
    ids = [history_id_for(workspace_id, event_id, None, action) for event_id, action in keys]
    cur = await conn.execute(
        """UPDATE memory_history SET reason = NULL, old_value = NULL, new_value = NULL
            WHERE workspace_id = %s AND id = ANY(%s)
              AND (reason IS NOT NULL OR old_value IS NOT NULL OR new_value IS NOT NULL)""", (workspace_id, ids))
    return cur.rowcount


async def delete_drawers(conn: AsyncConnection[Any], workspace_id: str, ids: list[str]) -> dict[str, Any]:
    """Delete drawers with everything derived from them: entity mentions (and entities left with none,
    with their triples), triples sourced from them, their provenance (cascade); scrub the content
    out of their history rows (the rows stay); drawers merged into them come back as themselves, and
    so do drawers they superseded; drawers a curation UPDATE rewrote with their content get back what
    they held before (``revert_updates_from``). Returns counts, and for ``verify`` the entities that
    went ("entity_ids") and the hashes of the contents those UPDATEs had written ("derived")."""
    if not ids:
        return {}
    p = {"ws": workspace_id, "ids": ids}
    out: dict[str, Any] = {}
    # The drawers go first: the delete waits for a stage still updating one (classify, cluster) and
    # takes its row, so whatever that stage wrote beside it (a history row) is committed, and seen by
    # the statements below; a stage arriving later finds no drawer and writes nothing.
    cur = await conn.execute("DELETE FROM drawers WHERE workspace_id = %(ws)s AND id = ANY(%(ids)s)"
                             " RETURNING memory_type, pipeline_tier", p)
    trained = sorted({t for t, tier in await cur.fetchall() if tier == "llm" and t})
    out["drawers"] = cur.rowcount
    if trained:
        # A type centroid is the mean of the LLM-labelled drawers' vectors (of one, for a rare type): those
        # of the types a forgotten drawer trained go, and maintain's `centroids` job computes them again.
        cur = await conn.execute("DELETE FROM type_centroids WHERE workspace_id = %s AND memory_type = ANY(%s)",
                                 (workspace_id, trained))
        out["type_centroids"] = cur.rowcount
    cur = await conn.execute(
        """UPDATE drawers SET state = 'processed', cluster_id = NULL, updated_at = now()
            WHERE workspace_id = %(ws)s AND cluster_id = ANY(%(ids)s) AND state = 'merged'
              AND NOT (id = ANY(%(ids)s))""", p)
    out["drawers_unmerged"] = cur.rowcount
    cur = await conn.execute(
        "DELETE FROM entity_mentions WHERE workspace_id = %(ws)s AND drawer_id = ANY(%(ids)s) RETURNING entity_id", p)
    touched = sorted({r[0] for r in await cur.fetchall()})
    out["entity_mentions"] = cur.rowcount
    merged_gone = await _forget_in_entity_merges(conn, workspace_id, ids)
    out["entity_merges_scrubbed"] = merged_gone.pop("scrubbed")
    # A fact another drawer also stated stays, sourced from that statement (its evidence row; the forgotten
    # drawer's went with it, by cascade); one only these drawers stated goes.
    cur = await conn.execute(_RESOURCE_TRIPLES_SQL, p)
    out["triples_resourced"] = cur.rowcount
    cur = await conn.execute("DELETE FROM triples WHERE workspace_id = %(ws)s AND source_drawer = ANY(%(ids)s)"
                             " RETURNING subject_id, object_id, id", p)
    rows = await cur.fetchall()
    ends = {e for r in rows for e in r[:2]}
    facts_gone = {r[2] for r in rows}
    out["triples"] = cur.rowcount
    if touched or ends:
        cur = await conn.execute(
            """DELETE FROM entities e WHERE e.workspace_id = %(ws)s AND e.id = ANY(%(e)s)
                 AND NOT EXISTS (SELECT 1 FROM entity_mentions m
                                  WHERE m.workspace_id = e.workspace_id AND m.entity_id = e.id)
               RETURNING e.id""", {"ws": workspace_id, "e": touched})
        gone = [r[0] for r in await cur.fetchall()]
        if gone:
            cur = await conn.execute(
                """DELETE FROM triples WHERE workspace_id = %(ws)s
                     AND (subject_id = ANY(%(e)s) OR object_id = ANY(%(e)s)) RETURNING subject_id, object_id, id""",
                {"ws": workspace_id, "e": gone})
            rows = await cur.fetchall()
            ends |= {e for r in rows for e in r[:2]}
            facts_gone |= {r[2] for r in rows}
            out["triples"] += cur.rowcount
        # The ends of the facts that went: an entity named only as one (a speaker the patterns made a fact's
        # subject, an object the model did not list as an entity) has no mention to lose, and went on naming
        # what was forgotten. It goes when nothing else names it: no mention, no fact left.
        cur = await conn.execute(
            """DELETE FROM entities e WHERE e.workspace_id = %(ws)s AND e.id = ANY(%(e)s)
                 AND NOT EXISTS (SELECT 1 FROM entity_mentions m
                                  WHERE m.workspace_id = e.workspace_id AND m.entity_id = e.id)
                 AND NOT EXISTS (SELECT 1 FROM triples t WHERE t.workspace_id = e.workspace_id AND t.subject_id = e.id)
                 AND NOT EXISTS (SELECT 1 FROM triples t WHERE t.workspace_id = e.workspace_id AND t.object_id = e.id)
               RETURNING e.id""", {"ws": workspace_id, "e": sorted(ends - set(touched) - set(gone))})
        gone += [r[0] for r in await cur.fetchall()]
        if gone:
            # Entities merged into one that goes (entity dedup) go with it, and so do the merge records.
            cur = await conn.execute(
                """DELETE FROM entities WHERE workspace_id = %(ws)s AND merged_into = ANY(%(e)s)
                   RETURNING id""", {"ws": workspace_id, "e": gone})
            gone += [r[0] for r in await cur.fetchall()]
            cur = await conn.execute(
                """DELETE FROM entity_merges WHERE workspace_id = %(ws)s
                     AND (survivor_id = ANY(%(e)s) OR merged_id = ANY(%(e)s)) RETURNING id""",
                {"ws": workspace_id, "e": gone})
            # Their audit rows name both entities (and a revert's the merged one): the rows stay, emptied.
            merges = [r[0] for r in await cur.fetchall()]
            out["history_scrubbed"] = await _scrub_history(
                conn, workspace_id, [(f"entity-merge:{m}", "ENTITY_MERGE") for m in merges]
                + [(f"entity-merge-revert:{m}", "ENTITY_MERGE_REVERT") for m in merges])
            # Look-alike flags name both entities and why they look alike (index entity_flags_b, 0040).
            cur = await conn.execute(
                """DELETE FROM entity_flags WHERE workspace_id = %(ws)s
                     AND (entity_a = ANY(%(e)s) OR entity_b = ANY(%(e)s))""", {"ws": workspace_id, "e": gone})
            out["entity_flags"] = cur.rowcount
        out["entities"] = len(gone)
        out["entity_ids"] = set(gone)
        if gone:  # facts of the entities merged into those that went
            cur = await conn.execute(
                """DELETE FROM triples WHERE workspace_id = %(ws)s
                     AND (subject_id = ANY(%(e)s) OR object_id = ANY(%(e)s)) RETURNING id""",
                {"ws": workspace_id, "e": gone})
            facts_gone |= {r[0] for r in await cur.fetchall()}
            out["triples"] += cur.rowcount
        await recount_entities(conn, workspace_id, sorted(set(touched) - set(gone)))
    if merged_gone["entities"]:
        out["entities"] = out.get("entities", 0) + len(merged_gone["entities"])
        out["entity_ids"] = set(out.get("entity_ids", set())) | set(merged_gone["entities"])
    cur = await conn.execute(
        """UPDATE memory_history SET reason = NULL, old_value = NULL, new_value = NULL
            WHERE workspace_id = %(ws)s AND drawer_id = ANY(%(ids)s)
              AND (reason IS NOT NULL OR old_value IS NOT NULL OR new_value IS NOT NULL)""", p)
    out["history_scrubbed"] = out.get("history_scrubbed", 0) + cur.rowcount
    # The end of a fact that went was audited with its subject, predicate and object in the reason.
    out["history_scrubbed"] += await _scrub_history(conn, workspace_id,
                                                    [(f"kg:{t}", "KG_INVALIDATE") for t in sorted(facts_gone)])
    reverted = await revert_updates_from(conn, workspace_id, ids)
    out["drawers_reverted"] = len(reverted["targets"])
    out["derived"] = reverted["derived"]
    out["history_scrubbed"] += reverted["history_scrubbed"]
    # Decisions filed under another drawer whose proposal came from a forgotten one: the proposal's
    # content and reason go; the target's own prior state (old_value) stays, so it can still be reverted.
    cur = await conn.execute(
        """UPDATE memory_history SET reason = NULL, new_value = NULL
            WHERE workspace_id = %(ws)s AND new_value ? 'source_drawer'
              AND (new_value ->> 'source_drawer') = ANY(%(ids)s)""", p)
    out["history_scrubbed"] += cur.rowcount
    # Drawers a forgotten one superseded rank as their own again, and no longer name it; the verdict
    # that compared them (its reason may quote the forgotten text) goes from their audit rows.
    cur = await conn.execute(
        """UPDATE drawers SET superseded_by = NULL, updated_at = now()
            WHERE workspace_id = %(ws)s AND superseded_by = ANY(%(ids)s) RETURNING id""", p)
    unsuperseded = [r[0] for r in await cur.fetchall()]
    out["drawers_unsuperseded"] = len(unsuperseded)
    if unsuperseded:
        cur = await conn.execute(
            """UPDATE memory_history SET reason = NULL, new_value = NULL
                WHERE workspace_id = %(ws)s AND drawer_id = ANY(%(old)s) AND action = 'SUPERSEDE'
                  AND (new_value ->> 'superseded_by') = ANY(%(ids)s)""", {**p, "old": unsuperseded})
        out["history_scrubbed"] += cur.rowcount
    return out


# What a curation UPDATE may have written into its target from the drawer that prompted it.
_UPDATED_COLUMNS = ("content", "content_hash", "embedding", "embedding_model", "summary")


async def revert_updates_from(conn: AsyncConnection[Any], workspace_id: str, ids: list[str]) -> dict[str, Any]:
    """Targets of applied curation UPDATEs that these (forgotten) drawers prompted get back the content
    they had before the first of them (content, hash, embedding, summary from that audit row's archived
    prior state; their importance, archive mark or pin stay as they are now). Every later audit row of
    the target loses its content too: what it recorded was derived from the forgotten text. The revert
    is audited without content. Returns the targets and, for ``verify``, the hashes of the contents
    those UPDATEs had written (``derived``)."""
    cur = await conn.execute(
        """SELECT id, drawer_id, old_value, created_at, new_value ->> 'content' FROM memory_history
            WHERE workspace_id = %(ws)s AND new_value ? 'source_drawer'
              AND (new_value ->> 'source_drawer') = ANY(%(ids)s)
              AND action = 'UPDATE' AND new_value ->> 'outcome' = 'applied' AND old_value IS NOT NULL
              AND drawer_id IS NOT NULL AND NOT (drawer_id = ANY(%(ids)s))
            ORDER BY drawer_id, created_at, id""", {"ws": workspace_id, "ids": ids})
    rows = await cur.fetchall()
    first: dict[str, tuple[str, dict[str, Any], Any]] = {}
    derived = set()
    for hid, target, old, at, content in rows:
        first.setdefault(target, (hid, old, at))
        if content:
            derived.add(decision_hash(content))
    scrubbed = 0
    for target, (hid, old, at) in sorted(first.items()):
        restored = await restore_columns(conn, workspace_id, target, {c: old[c] for c in _UPDATED_COLUMNS if c in old})
        if not restored:
            continue
        cur = await conn.execute(
            """UPDATE memory_history SET reason = NULL, old_value = NULL, new_value = NULL
                WHERE workspace_id = %s AND drawer_id = %s AND created_at >= %s AND id <> %s
                  AND (reason IS NOT NULL OR old_value IS NOT NULL OR new_value IS NOT NULL)""",
            (workspace_id, target, at, hid))
        scrubbed += cur.rowcount
        await record_history(conn, workspace_id, drawer_id=target, action="REVERT", actor="forget",
                             event_id=f"forget:{hid}", reason="the drawer behind this update was forgotten",
                             new_value={"reverted": hid})
    return {"targets": sorted(first), "derived": derived, "history_scrubbed": scrubbed}


# A drawer first seen in a forgotten session takes everything that session gave it from its earliest surviving
# sighting instead: provenance, who said it and when (the message's speaker, role and time), the message's
# metadata, and where it is filed (returned, for ``placement``). Its context and the embedding made with it
# go (back to 'raw': maintain re-drives it through embed and classify, which files it by type again).
_REPOINT_SQL = """
    UPDATE drawers d
       SET session_id = s.session_id, seq = s.seq, user_id = ss.user_id, agent_id = ss.agent_id,
           role = coalesce(m.role, d.role), speaker = m.name,
           occurred_at = coalesce(m.created_at, ss.completed_at, ss.started_at),
           metadata = jsonb_build_object('seq', s.seq, 'chunk', s.chunk_index)
                      || CASE WHEN m.metadata <> '{}' THEN jsonb_build_object('message', m.metadata)
                              ELSE '{}' END,
           context = NULL, embedding = NULL, embedding_model = NULL, state = 'raw', retry_count = 0,
           updated_at = now()
      FROM (SELECT DISTINCT ON (drawer_id) drawer_id, session_id, seq, chunk_index FROM drawer_sources
             WHERE workspace_id = %(ws)s AND drawer_id = ANY(%(ids)s)
             ORDER BY drawer_id, revision IS NOT NULL, session_id, seq, chunk_index) s
      JOIN sessions ss ON ss.workspace_id = %(ws)s AND ss.session_id = s.session_id
      LEFT JOIN messages m ON m.workspace_id = %(ws)s AND m.session_id = s.session_id AND m.seq = s.seq
     WHERE d.workspace_id = %(ws)s AND d.id = s.drawer_id
    RETURNING d.id, ss.metadata, ss.agent_id"""

# Evidence (by index: triple_evidence_drawer) and facts (triples_source_drawer) of kept drawers that name a
# forgotten session (or, with the messages' seqs in %(q)s, one of these forgotten messages) take the drawer's
# surviving sighting and its time instead; one that names where its drawer is said still is left as it is.
_REHOME_EVIDENCE_SQL = """
    UPDATE triple_evidence v SET session_id = d.session_id, seq = d.seq, said_at = d.occurred_at, episode_id = NULL
      FROM drawers d
     WHERE v.workspace_id = %(ws)s AND v.drawer_id = ANY(%(ids)s) AND v.session_id = ANY(%(s)s)
       AND (%(q)s::int[] IS NULL OR (v.session_id, v.seq) IN (SELECT * FROM unnest(%(s)s::text[], %(q)s::int[])))
       AND d.workspace_id = %(ws)s AND d.id = v.drawer_id
       AND (d.session_id, d.seq) IS DISTINCT FROM (v.session_id, v.seq)"""
_REHOME_FACTS_SQL = """
    UPDATE triples t SET source_session = d.session_id, source_seq = d.seq, source_episode = NULL,
                         valid_from = CASE WHEN d.occurred_at IS NULL THEN t.valid_from
                                           WHEN t.valid_to IS NOT NULL AND d.occurred_at > t.valid_to THEN t.valid_to
                                           ELSE d.occurred_at END
      FROM drawers d
     WHERE t.workspace_id = %(ws)s AND t.source_drawer = ANY(%(ids)s) AND t.source_session = ANY(%(s)s)
       AND (%(q)s::int[] IS NULL
            OR (t.source_session, t.source_seq) IN (SELECT * FROM unnest(%(s)s::text[], %(q)s::int[])))
       AND d.workspace_id = %(ws)s AND d.id = t.source_drawer
       AND (d.session_id, d.seq) IS DISTINCT FROM (t.source_session, t.source_seq)"""

_REFILE_SQL = """
    UPDATE drawers d SET wing = p.wing, room = p.room, hall = p.hall
      FROM unnest(%(ids)s::text[], %(wings)s::text[], %(rooms)s::text[], %(halls)s::text[]) AS p(id, wing, room, hall)
     WHERE d.workspace_id = %(ws)s AND d.id = p.id"""


async def detach_drawers(conn: AsyncConnection[Any], workspace_id: str, ids: list[str], session_ids: list[str],
                         repoint: list[str], *, seqs: list[int] | None = None) -> int:
    """Drawers whose text was also said in a surviving session: drop the forgotten sightings; those
    first seen in a forgotten session take what it gave them from the earliest surviving sighting
    (``_REPOINT_SQL``): a forgotten user's name, agent wing, time or message metadata must not stay on
    a drawer someone else's words keep. With ``seqs``, what is forgotten is the messages
    (session_ids[i], seqs[i]), not whole sessions."""
    if not ids:
        return 0
    p = {"ws": workspace_id, "ids": ids, "s": session_ids, "q": seqs}
    cur = await conn.execute(
        """DELETE FROM drawer_sources
            WHERE workspace_id = %(ws)s AND drawer_id = ANY(%(ids)s) AND session_id = ANY(%(s)s)
              AND (%(q)s::int[] IS NULL OR (session_id, seq) IN (SELECT * FROM unnest(%(s)s::text[], %(q)s::int[])))""",
        p)
    n = cur.rowcount
    if repoint:
        cur = await conn.execute(_REPOINT_SQL, {"ws": workspace_id, "ids": repoint})
        rows = await cur.fetchall()
        places = [(r[0], *placement(r[1] or {}, r[2])) for r in rows]
        if places:
            await conn.execute(_REFILE_SQL, {
                "ws": workspace_id, "ids": [p[0] for p in places], "wings": [p[1] for p in places],
                "rooms": [p[2] or "general" for p in places], "halls": [p[3] for p in places]})
    # What the graph read in these drawers stays (the words are still said), said where they now come from.
    await rehome_graph(conn, workspace_id, ids, session_ids, seqs)
    return n


async def rehome_graph(conn: AsyncConnection[Any], workspace_id: str, ids: list[str], session_ids: list[str],
                       seqs: list[int] | None) -> None:
    """The evidence and facts of these drawers that name the sessions (or, with ``seqs``, the messages
    (session_ids[i], seqs[i])) take the sighting each drawer reports now, and its time."""
    p = {"ws": workspace_id, "ids": ids, "s": session_ids, "q": seqs}
    await conn.execute(_REHOME_EVIDENCE_SQL, p)
    await conn.execute(_REHOME_FACTS_SQL, p)


async def scrub_snapshots(conn: AsyncConnection[Any], workspace_id: str, drawer_ids: list[str]) -> int:
    """Drawers that stay but lost what a forgotten message gave them (its context, its metadata, a vector
    embedded with them): the archived states their decisions keep for a revert lose the vector and the
    metadata too, or a revert would write the forgotten message back. Such a revert leaves the metadata
    as it is and has the drawer embedded again (``embedding_stale``, shared.db.decisions.restore_columns)."""
    if not drawer_ids:
        return 0
    cur = await conn.execute(
        """UPDATE memory_history SET old_value = (old_value - 'embedding' - 'metadata')
                                               || '{"embedding_stale": true}'::jsonb
            WHERE workspace_id = %s AND drawer_id = ANY(%s)
              AND (old_value ? 'embedding' OR old_value ? 'metadata')""", (workspace_id, drawer_ids))
    return cur.rowcount


async def delete_sessions(conn: AsyncConnection[Any], workspace_id: str, session_ids: list[str]) -> dict[str, Any]:
    """Episodes (summary and L0 abstract), messages and the sessions themselves. Returns counts and
    the messages' content hashes (kept in memory only, for --verify)."""
    p = {"ws": workspace_id, "s": session_ids}
    cur = await conn.execute("DELETE FROM episodes WHERE workspace_id = %(ws)s AND session_id = ANY(%(s)s)"
                             " RETURNING id", p)
    episode_ids = [r[0] for r in await cur.fetchall()]
    out: dict[str, Any] = {"episodes": len(episode_ids), "episode_ids": set(episode_ids)}
    out.update(await delete_dreaming_runs(conn, workspace_id, session_ids, episode_ids))
    cur = await conn.execute("DELETE FROM message_revisions WHERE workspace_id = %(ws)s AND session_id = ANY(%(s)s)"
                             " RETURNING content_hash", p)
    out["hashes"] = {r[0] for r in await cur.fetchall()}
    out["message_revisions"] = cur.rowcount
    cur = await conn.execute(
        "DELETE FROM messages WHERE workspace_id = %(ws)s AND session_id = ANY(%(s)s) RETURNING content_hash", p)
    out["hashes"] |= {r[0] for r in await cur.fetchall()}
    out["messages"] = cur.rowcount
    cur = await conn.execute("DELETE FROM sessions WHERE workspace_id = %(ws)s AND session_id = ANY(%(s)s)", p)
    out["sessions"] = cur.rowcount
    return out


async def delete_dreaming_runs(conn: AsyncConnection[Any], workspace_id: str, session_ids: list[str],
                               episode_ids: list[str]) -> dict[str, int]:
    """The dreaming runs that consolidated one of these episodes, or whose output is one of these
    sessions: the run keeps a copy of what it synthesised. Their other episodes become unpromoted again,
    so the next dreaming run consolidates them without the forgotten one (nothing else is lost), and
    their DREAM audit rows keep only that a run happened. (Their output sessions are forgotten with
    these: ``dreamt_from``.)"""
    cur = await conn.execute(
        """DELETE FROM dreaming_runs WHERE workspace_id = %(ws)s
              AND (episode_ids && %(e)s::text[] OR session_id = ANY(%(s)s))
           RETURNING id, episode_ids""", {"ws": workspace_id, "s": session_ids, "e": episode_ids})
    runs = await cur.fetchall()
    if not runs:
        return {}
    others = sorted({e for _, eps in runs for e in eps} - set(episode_ids))
    cur = await conn.execute(
        """UPDATE episodes SET promoted_at = NULL WHERE workspace_id = %s AND id = ANY(%s)
              AND promoted_at IS NOT NULL""", (workspace_id, others))
    unpromoted = cur.rowcount
    cur = await conn.execute(
        """UPDATE memory_history SET reason = NULL, new_value = NULL
            WHERE workspace_id = %s AND id = ANY(%s) AND new_value IS NOT NULL""",
        (workspace_id, [history_id_for(workspace_id, f"dreaming:{r}", None, "DREAM") for r, _ in runs]))
    return {"dreaming_runs": len(runs), "episodes_unpromoted": unpromoted, "history_scrubbed": cur.rowcount}


async def drop_cache_entries(conn: AsyncConnection[Any], workspace_id: str, hashes: list[str],
                             keep: set[str]) -> int:
    """Embedding-cache entries of the forgotten texts that no remaining drawer embeds."""
    gone = [h for h in hashes if h not in keep]
    if not gone:
        return 0
    cur = await conn.execute(
        "DELETE FROM embedding_cache WHERE workspace_id = %s AND content_hash = ANY(%s)", (workspace_id, gone))
    return cur.rowcount


async def drawers_with_content(conn: AsyncConnection[Any], workspace_id: str,
                               content_hashes: list[str]) -> list[tuple[str, str | None, str | None]]:
    """Remaining drawers holding one of these texts: (content, speaker, context), to keep their cache."""
    cur = await conn.execute(
        "SELECT content, speaker, context FROM drawers WHERE workspace_id = %s AND content_hash = ANY(%s)",
        (workspace_id, content_hashes))
    return [(r[0], r[1], r[2]) for r in await cur.fetchall()]


# What of a forgotten workspace is left once its sessions went, and each table's key after workspace_id.
WORKSPACE_TABLES: dict[str, str] = {
    "drawers": "id", "embedding_cache": "model, content_hash", "entity_mentions": "entity_id, drawer_id",
    "triples": "id", "entities": "id", "episodes": "id", "identities": "workspace_id",
    "type_centroids": "memory_type", "proposal_resolutions": "history_id", "entity_merges": "id",
    "entity_flags": "entity_a, entity_b", "dreaming_runs": "id",
}


async def delete_workspace_batch(conn: AsyncConnection[Any], workspace_id: str, table: str, limit: int) -> int:
    """A batch of what is left of a forgotten workspace in ``table`` (by primary key)."""
    key = WORKSPACE_TABLES[table]
    cur = await conn.execute(
        f"""DELETE FROM {table} WHERE workspace_id = %(ws)s AND ({key}) IN (
               SELECT {key} FROM {table} WHERE workspace_id = %(ws)s LIMIT %(n)s)""",  # noqa: S608 - fixed names
        {"ws": workspace_id, "n": limit})
    return cur.rowcount


async def scrub_history_batch(conn: AsyncConnection[Any], workspace_id: str, limit: int) -> int:
    """Take the content out of a batch of a forgotten workspace's history rows (the rows stay)."""
    cur = await conn.execute(
        """UPDATE memory_history SET reason = NULL, old_value = NULL, new_value = NULL
            WHERE workspace_id = %(ws)s AND id IN (
                SELECT id FROM memory_history WHERE workspace_id = %(ws)s
                   AND (reason IS NOT NULL OR old_value IS NOT NULL OR new_value IS NOT NULL) LIMIT %(n)s)""",
        {"ws": workspace_id, "n": limit})
    return cur.rowcount


# --- what a forget removes by drawer, and its proof -------------------------------------------------

async def delete_drawer_messages(conn: AsyncConnection[Any], workspace_id: str,
                                 drawer_ids: list[str]) -> list[tuple[str, str, int]]:
    """The raw messages forgotten drawers were cut from (the rest of their sessions stays); returns
    each deleted message's (content_hash, session_id, seq)."""
    cur = await conn.execute(
        """DELETE FROM messages m USING drawer_sources s
            WHERE s.workspace_id = %(ws)s AND s.drawer_id = ANY(%(ids)s)
              AND m.workspace_id = s.workspace_id AND m.session_id = s.session_id AND m.seq = s.seq
           RETURNING m.content_hash, m.session_id, m.seq""", {"ws": workspace_id, "ids": drawer_ids})
    return [(r[0], r[1], r[2]) for r in await cur.fetchall()]


async def delete_drawer_message_revisions(conn: AsyncConnection[Any], workspace_id: str,
                                          drawer_ids: list[str]) -> tuple[int, set[str]]:
    """Every earlier text of the messages forgotten drawers were cut from (an edited message goes with all
    its revisions: a drawer cut from an earlier one is still sourced at its position); how many, and their
    hashes."""
    cur = await conn.execute(
        """DELETE FROM message_revisions r USING drawer_sources s
            WHERE s.workspace_id = %(ws)s AND s.drawer_id = ANY(%(ids)s)
              AND r.workspace_id = s.workspace_id AND r.session_id = s.session_id AND r.seq = s.seq
           RETURNING r.content_hash""", {"ws": workspace_id, "ids": drawer_ids})
    return cur.rowcount, {r[0] for r in await cur.fetchall()}


# The other drawers cut from deleted messages: a long message's chunks overlap their neighbours, so each
# holds some of a forgotten chunk's text. Per drawer, ``drawer_fates``'s fields: "first_here" when the
# drawer's own sighting is one of these messages, "shared" when it was also cut from a message that stays.
_SIBLINGS_SQL = """
    WITH cut(session_id, seq) AS (SELECT * FROM unnest(%(s)s::text[], %(q)s::int[]))
    SELECT d.id, d.content, d.speaker, d.context, d.content_hash, d.embedding,
           EXISTS (SELECT 1 FROM cut WHERE cut.session_id = d.session_id AND cut.seq = d.seq),
           EXISTS (SELECT 1 FROM drawer_sources o
                    WHERE o.workspace_id = d.workspace_id AND o.drawer_id = d.id AND o.revision IS NULL
                      AND NOT EXISTS (SELECT 1 FROM cut WHERE cut.session_id = o.session_id AND cut.seq = o.seq))
      FROM drawers d
     WHERE d.workspace_id = %(ws)s AND NOT (d.id = ANY(%(ids)s))
       AND d.id = ANY(ARRAY(
           SELECT x.drawer_id FROM cut CROSS JOIN LATERAL (
               SELECT s.drawer_id FROM drawer_sources s
                WHERE s.workspace_id = %(ws)s AND s.session_id = cut.session_id AND s.seq = cut.seq) x))"""


async def message_siblings(conn: AsyncConnection[Any], workspace_id: str, cut: list[tuple[str, int]],
                           forgotten: list[str]) -> list[dict[str, Any]]:
    """``_SIBLINGS_SQL`` for these deleted messages, (session_id, seq) each, besides ``forgotten``."""
    if not cut:
        return []
    cur = await conn.execute(_SIBLINGS_SQL, {"ws": workspace_id, "s": [c[0] for c in cut],
                                             "q": [c[1] for c in cut], "ids": forgotten})
    cols = ("id", "content", "speaker", "context", "content_hash", "embedding", "first_here", "shared")
    return [dict(zip(cols, r, strict=True)) for r in await cur.fetchall()]


# The turn after a deleted message was embedded with that message as its context (``filing.plan_session``):
# the first chunk of the next message that is not noise, where this session is where its drawer was first
# seen. Its context and the embedding made with it go (back to 'raw': maintain re-drives it through embed and
# classify). Returns each such drawer's id, content, speaker and the context it had (for its cache entry).
_CONTEXT_AFTER_SQL = """
    WITH cut(session_id, seq) AS (SELECT * FROM unnest(%(s)s::text[], %(q)s::int[])),
    nxt AS (
        SELECT c.session_id,
               (SELECT min(m.seq) FROM messages m
                 WHERE m.workspace_id = %(ws)s AND m.session_id = c.session_id AND m.seq > c.seq
                   AND NOT m.is_noise) AS seq
          FROM cut c),
    old AS (
        SELECT d.id, d.content, d.speaker, d.context FROM drawers d JOIN nxt
            ON d.workspace_id = %(ws)s AND d.session_id = nxt.session_id AND d.seq = nxt.seq
         WHERE d.context IS NOT NULL
           FOR UPDATE OF d)
    UPDATE drawers d SET context = NULL, embedding = NULL, embedding_model = NULL, state = 'raw', retry_count = 0,
                         updated_at = now()
      FROM old
     WHERE d.workspace_id = %(ws)s AND d.id = old.id
    RETURNING old.id, old.content, old.speaker, old.context"""


async def clear_context_after(conn: AsyncConnection[Any], workspace_id: str,
                              cut: list[tuple[str, int]]) -> list[tuple[str, str, str | None, str]]:
    """``_CONTEXT_AFTER_SQL`` for these deleted messages, (session_id, seq) each."""
    if not cut:
        return []
    cur = await conn.execute(_CONTEXT_AFTER_SQL, {"ws": workspace_id, "s": [c[0] for c in cut],
                                                  "q": [c[1] for c in cut]})
    return [(r[0], r[1], r[2], r[3]) for r in await cur.fetchall()]


async def delete_session_episodes(conn: AsyncConnection[Any], workspace_id: str,
                                  session_ids: list[str]) -> list[str]:
    """The episodes of sessions a forgotten drawer came from (their summaries quote it); their ids."""
    cur = await conn.execute("DELETE FROM episodes WHERE workspace_id = %s AND session_id = ANY(%s) RETURNING id",
                             (workspace_id, session_ids))
    return [r[0] for r in await cur.fetchall()]


async def hashes_still_held(conn: AsyncConnection[Any], workspace_id: str, hashes: list[str]) -> set[str]:
    """Of these content hashes, those a message or drawer that stays still holds (text the forgotten
    content shares with what stays is not the forgotten user's alone)."""
    cur = await conn.execute(
        """SELECT content_hash FROM messages WHERE workspace_id = %(ws)s AND content_hash = ANY(%(h)s)
           UNION SELECT content_hash FROM message_revisions WHERE workspace_id = %(ws)s AND content_hash = ANY(%(h)s)
           UNION SELECT content_hash FROM drawers WHERE workspace_id = %(ws)s AND content_hash = ANY(%(h)s)""",
        {"ws": workspace_id, "h": hashes})
    return {r[0] for r in await cur.fetchall()}


# Per place, the rows that still name what was forgotten (``count_remaining``'s parameters: ws, s
# sessions, d drawers, h content hashes, eh embedding-text hashes, e episodes, en entities, dh hashes of
# what curation derived from forgotten drawers, dream_wing, u user, a agent, all whole workspace).
# Extraction's notes on what it read (migration 0052): the episode, or any of the drawers.
_KG_NOTES = """action = 'KG_EXTRACT' AND (new_value->>'episode_id' = ANY(%(e)s) OR new_value->'drawers' ?| %(d)s)"""
_REMAINING: dict[str, str] = {
    "sessions": "SELECT count(*) FROM sessions WHERE workspace_id = %(ws)s AND (%(all)s OR session_id = ANY(%(s)s)"
                " OR user_id = %(u)s OR agent_id = %(a)s)",
    "messages": "SELECT count(*) FROM messages WHERE workspace_id = %(ws)s AND (%(all)s OR session_id = ANY(%(s)s)"
                " OR content_hash = ANY(%(h)s))",
    "message_revisions": "SELECT count(*) FROM message_revisions WHERE workspace_id = %(ws)s AND (%(all)s"
                         " OR session_id = ANY(%(s)s) OR content_hash = ANY(%(h)s))",
    "drawers": "SELECT count(*) FROM drawers WHERE workspace_id = %(ws)s AND (%(all)s OR id = ANY(%(d)s)"
               " OR content_hash = ANY(%(h)s) OR user_id = %(u)s OR agent_id = %(a)s OR session_id = ANY(%(s)s))",
    "drawer_sources": "SELECT count(*) FROM drawer_sources WHERE workspace_id = %(ws)s AND (%(all)s"
                      " OR session_id = ANY(%(s)s) OR drawer_id = ANY(%(d)s))",
    "embedding_cache": "SELECT count(*) FROM embedding_cache WHERE workspace_id = %(ws)s AND (%(all)s"
                       " OR content_hash = ANY(%(eh)s))",
    "episodes": "SELECT count(*) FROM episodes WHERE workspace_id = %(ws)s AND (%(all)s OR session_id = ANY(%(s)s)"
                " OR agent_id = %(a)s)",
    "entity_mentions": "SELECT count(*) FROM entity_mentions WHERE workspace_id = %(ws)s AND (%(all)s"
                       " OR drawer_id = ANY(%(d)s))",
    "entities": "SELECT count(*) FROM entities WHERE workspace_id = %(ws)s AND (%(all)s OR id = ANY(%(en)s))",
    "entity_flags": "SELECT count(*) FROM entity_flags WHERE workspace_id = %(ws)s AND (%(all)s"
                    " OR entity_a = ANY(%(en)s) OR entity_b = ANY(%(en)s))",
    "triples": "SELECT count(*) FROM triples WHERE workspace_id = %(ws)s AND (%(all)s"
               " OR source_drawer = ANY(%(d)s))",
    "memory_history_content": "SELECT count(*) FROM memory_history WHERE workspace_id = %(ws)s"
                              " AND (%(all)s OR drawer_id = ANY(%(d)s))"
                              " AND (reason IS NOT NULL OR old_value IS NOT NULL OR new_value IS NOT NULL)",
    "memory_history_from_forgotten": "SELECT count(*) FROM memory_history WHERE workspace_id = %(ws)s"
                                     " AND new_value ? 'source_drawer'"
                                     " AND (new_value ->> 'source_drawer') = ANY(%(d)s)",
    # A drawer still holding what a curation UPDATE wrote into it from forgotten content (not reverted).
    "curation_updated_drawers": "SELECT count(*) FROM drawers WHERE workspace_id = %(ws)s"
                                " AND content_hash = ANY(%(dh)s)",
    # The forget's own records naming a forgotten user, agent or session in clear (they hold its digest).
    "forget_records_in_clear": "SELECT (SELECT count(*) FROM forget_tombstones WHERE workspace_id = %(ws)s"
                               " AND kind IN ('user', 'agent', 'session')"
                               " AND (value = %(u)s OR value = %(a)s OR value = ANY(%(s)s)))"
                               " + (SELECT count(*) FROM forget_audit WHERE workspace_id = %(ws)s"
                               " AND scope_kind IN ('user', 'agent', 'session')"
                               " AND (scope_value = %(u)s OR scope_value = %(a)s OR scope_value = ANY(%(s)s)))",
    # Drawers still ranked below, or merged into, a forgotten drawer (naming it).
    "drawers_pointing_at_forgotten": "SELECT count(*) FROM drawers WHERE workspace_id = %(ws)s"
                                     " AND (superseded_by = ANY(%(d)s) OR cluster_id = ANY(%(d)s))",
    # What dreaming synthesised from a forgotten episode: its runs, its drawers, its audit rows.
    "dreaming_runs": "SELECT count(*) FROM dreaming_runs WHERE workspace_id = %(ws)s AND (%(all)s"
                     " OR episode_ids && %(e)s::text[] OR session_id = ANY(%(s)s)"
                     " OR user_id = %(u)s OR agent_id = %(a)s)",
    "dreaming_drawers": "SELECT count(*) FROM drawers WHERE workspace_id = %(ws)s AND wing = %(dream_wing)s"
                        " AND (%(all)s OR (metadata -> 'message' -> 'episode_ids') ?| %(e)s::text[])",
    "dreaming_history": "SELECT count(*) FROM memory_history WHERE workspace_id = %(ws)s AND action = 'DREAM'"
                        " AND (new_value -> 'episodes') ?| %(e)s::text[]",
    "kg_extract_notes": f"SELECT count(*) FROM memory_history WHERE workspace_id = %(ws)s AND {_KG_NOTES}",  # noqa: S608 - constants
    "identities": "SELECT count(*) FROM identities WHERE workspace_id = %(ws)s AND %(all)s",
    "proposal_resolutions": "SELECT count(*) FROM proposal_resolutions WHERE workspace_id = %(ws)s AND %(all)s",
}


SCRUB_KG_NOTES_SQL = f"""UPDATE memory_history SET reason = NULL, old_value = NULL, new_value = NULL
                          WHERE workspace_id = %(ws)s AND {_KG_NOTES}"""  # noqa: S608 - constants, no input


async def scrub_kg_notes(conn: AsyncConnection[Any], workspace_id: str, episode_ids: list[str],
                         drawer_ids: list[str]) -> int:
    """Empty extraction's notes (KG_EXTRACT rows) on these episodes or drawers; the rows stay."""
    if not episode_ids and not drawer_ids:
        return 0
    cur = await conn.execute(SCRUB_KG_NOTES_SQL, {"ws": workspace_id, "e": episode_ids, "d": drawer_ids})
    return cur.rowcount


async def count_remaining(conn: AsyncConnection[Any], params: dict[str, Any]) -> dict[str, int]:
    """Place -> rows that still name the forgotten scope (see ``_REMAINING``)."""
    out: dict[str, int] = {}
    for place, q in _REMAINING.items():
        cur = await conn.execute(q, params)
        row = await cur.fetchone()
        out[place] = int(row[0]) if row else 0
    return out
