"""Shared by the docker-compose and Kubernetes checks: what a deployment file may run and configure."""

from __future__ import annotations

import importlib.util

import typer

from services.cli import app as palace_app

__all__ = ["check_command"]


def check_command(argv: list[str]) -> str:
    """Raise unless ``argv`` runs something that exists here: a `python -m` module with a __main__, or a
    `palace` command whose arguments parse. Returns what it names."""
    if argv[:2] == ["python", "-m"]:
        module = argv[2]
        try:
            spec = importlib.util.find_spec(f"{module}.__main__")
        except ModuleNotFoundError:
            spec = None
        assert spec is not None, f"no module {module}.__main__"
        return module
    assert argv[0] == "palace", argv
    group = typer.main.get_command(palace_app)
    try:
        ctx = group.make_context("palace", list(argv[1:]))
        name, cmd, rest = group.resolve_command(ctx, list(argv[1:]))  # type: ignore[attr-defined]
        cmd.make_context(name or "", rest, parent=ctx)  # unknown options or bad values raise here
    except Exception as e:  # typer's (vendored) click usage errors
        raise AssertionError(f"{argv}: {e}") from e
    return f"palace {name}"
