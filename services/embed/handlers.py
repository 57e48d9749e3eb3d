"""Subscribers of the embed service."""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from typing import Any, NamedTuple

import psycopg
from nats.aio.msg import Msg

from services._runtime import Deps, ack_once, decode_batch
from shared.adapters.space_embedder import SpaceSwitched, pin_space
from shared.bus import publish_event
from shared.db.drawers import cached_embeddings, drawers_by_id, note_failure, save_embeddings
from shared.db.embedding_spaces import space_switched
from shared.db.tenancy import workspace_tx
from shared.events import DrawerCreated, DrawerEmbedded
from shared.faults import is_transient, to_raise
from shared.ids import content_hash, event_id_for
from shared.memory.filing import embedding_text
from shared.metrics import DRAWERS, EMBED_SECONDS, EMBED_TEXTS
from shared.ports import Embedder

__all__ = ["register"]


class _Pending(NamedTuple):
    """One workspace's share of a batch: its events, drawers lacking a vector, their texts and cache hits."""

    workspace_id: str
    events: list[DrawerCreated]
    rows: list[Any]
    etext: dict[str, str]
    ehash: dict[str, str]
    cached: dict[str, Any]


def register(deps: Deps) -> None:
    s = deps.settings
    assert deps.embedder is not None

    @deps.handle(DrawerCreated)
    async def on_drawer_created(bodies: list[bytes], raws: list[Msg]) -> None:
        """drawer.created (batched) → (embed, then commit) → drawer.embedded."""
        # The active embedding space, looked up for every batch (one small query): a batch retried after
        # `palace reembed` switched spaces must not fail again on the old one. Pinned for the whole batch.
        embedder, space_id = await pin_space(deps.embedder)
        events = await decode_batch(deps, DrawerCreated, bodies, raws)
        if not events:
            return
        try:
            try:
                await embed_and_save(events, embedder, space_id)
            except SpaceSwitched:
                # Once more at once, in the space active now (what earlier workspaces saved stays: their
                # drawers have vectors and are left out), rather than a NAK that costs every message a delivery.
                embedder, space_id = await pin_space(deps.embedder)
                await embed_and_save(events, embedder, space_id)
        except Exception as e:
            if is_transient(e) or len(events) == 1 or isinstance(e, SpaceSwitched):
                # The endpoint is down for all of them (the loop holds, NAKs or dead-letters them), or the
                # space switched under the whole batch twice running (it runs again later, in the new one).
                raise
            # Something in the batch broke the call: each event alone, so one bad text fails only its own
            # event (NAKed, then dead-lettered, by the loop); the others are committed and acked here.
            failed: list[Exception] = []
            for ev, raw in events:
                try:
                    await embed_and_save([(ev, raw)], embedder, space_id)
                except Exception as one:
                    failed.append(one)
                else:
                    await ack_once(raw)
            if failed:
                raise to_raise(failed) from None

    async def embed_and_save(events: list[tuple[DrawerCreated, Msg]], embedder: Embedder,
                             space_id: str | None) -> None:
        """Embed every drawer of these events still lacking a vector (one model call), commit, announce.
        ``space_id``: the embedding space ``embedder`` is of; a switch meanwhile rolls the save back."""
        by_ws: dict[str, list[DrawerCreated]] = defaultdict(list)
        for ev, _ in events:
            by_ws[ev.workspace_id].append(ev)
        # Read every workspace first, then embed all the batch's missing texts in one call: a batch
        # from many workspaces (the multi-tenant norm) would otherwise be many small model calls, and
        # each one synchronises the engine's threads (measured on 2 busy cores: 16 calls of 3 texts
        # 16.4 s, one call of 48 texts 5.7 s).
        plans: list[_Pending] = []
        for ws, evs in by_ws.items():
            ids = list(dict.fromkeys(i for ev in evs for i in ev.drawer_ids))
            async with workspace_tx(deps.pool, ws) as conn:
                rows = [r for r in await drawers_by_id(conn, ws, ids) if not r.has_embedding]
                etext = {r.id: embedding_text(r.content, r.speaker, r.context) for r in rows}
                ehash = {r.id: content_hash(etext[r.id]) for r in rows}
                cached = await cached_embeddings(conn, ws, embedder.model_name, list(set(ehash.values())))
                plans.append(_Pending(ws, evs, rows, etext, ehash, cached))
        texts = list(dict.fromkeys(p.etext[r.id] for p in plans for r in p.rows if p.ehash[r.id] not in p.cached))
        by_text: dict[str, Any] = {}
        if texts:
            # Embed outside any transaction (network or CPU work never holds a connection).
            t0 = time.perf_counter()
            try:
                vecs = await embedder.embed_documents(texts)
            except Exception as e:
                # The middleware holds, NAKs or dead-letters the events; the drawers stay raw and keep
                # the reason, so one that is never embedded is failed by maintain with it.
                reason = f"embedding failed: {type(e).__name__}: {e}"
                for p in plans:
                    missing = [r.id for r in p.rows if p.ehash[r.id] not in p.cached]
                    if missing:
                        # Best effort (the database may be what is down); the original error wins.
                        with contextlib.suppress(psycopg.Error, OSError):
                            async with workspace_tx(deps.pool, p.workspace_id) as conn:
                                await note_failure(conn, p.workspace_id, missing, reason)
                raise
            EMBED_SECONDS.labels(embedder.model_name).observe(time.perf_counter() - t0)
            EMBED_TEXTS.labels(embedder.model_name).inc(len(texts))
            by_text = dict(zip(texts, vecs, strict=True))
        for ws, evs, rows, etext, ehash, cached in plans:
            out = [(r.id, ehash[r.id], cached.get(ehash[r.id], by_text.get(etext[r.id])), r.content_hash, r.context,
                    r.speaker) for r in rows]
            async with workspace_tx(deps.pool, ws) as conn:
                await save_embeddings(conn, ws, embedder.model_name, [o for o in out if o[2] is not None])
                # `palace reembed` switched spaces while this batch embedded: its vectors (same dimension, or
                # nothing would have stopped them) would sit among the new space's, unnoticed by the switch's
                # one settle pass. Rolled back; the batch runs again in the new space.
                if await space_switched(conn, space_id):
                    raise SpaceSwitched(f"the embedding space changed while {embedder.model_name} embedded")
            DRAWERS.labels(deps.service, "embedded").inc(len(out))
            for ev in evs:
                await publish_event(deps.broker, s, DrawerEmbedded(
                    event_id=event_id_for("drawer.embedded", ev.event_id), workspace_id=ws,
                    session_id=ev.session_id, drawer_ids=ev.drawer_ids,
                ), caused_by=ev)
