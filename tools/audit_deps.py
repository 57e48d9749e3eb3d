"""Known-vulnerability audit of the installed dependencies, from PyPI's own advisory data.

pip-audit asks PyPI per release (``/pypi/<name>/<version>/json``); the package mirror these machines
reach serves only the per-project document (``/pypi/<name>/json``), whose ``vulnerabilities`` are the
advisories (OSV / PyPA advisory database) that affect the project's *latest* release. So this audit:

* for a dependency installed at its latest release: fails if PyPI lists any advisory for it;
* for one installed at an older release: reports it as *unchecked* (an older release may carry
  advisories the latest fixed) — upgrade it, or run ``make audit-full`` (pip-audit) where the
  per-release API is reachable;
* a lookup that fails (network) is reported, never counted as clean.

Exit status 1 when a known vulnerability is found; 0 otherwise. Run by ``make audit`` and by
``make test`` (so CI runs it).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from dataclasses import dataclass
from importlib import metadata

import httpx
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version
from rich.console import Console
from rich.table import Table

console = Console(width=None if sys.stdout.isatty() else 150)


@dataclass
class Finding:
    name: str
    installed: str
    latest: str | None
    status: str  # ok | vulnerable | unchecked | lookup-failed
    advisories: list[str]


def installed() -> dict[str, str]:
    """Every distribution in this environment (the editable projects themselves excluded)."""
    out: dict[str, str] = {}
    for d in metadata.distributions():
        name = d.metadata.get("Name")
        if name and canonicalize_name(name) not in {"palace", "palace-dev", "pip", "setuptools", "wheel"}:
            out[canonicalize_name(name)] = d.version
    return out


async def _check(client: httpx.AsyncClient, sem: asyncio.Semaphore, name: str, version: str,
                 index: str) -> Finding:
    async with sem:
        try:
            r = await client.get(f"{index}/pypi/{name}/json")
            if r.status_code == 404:
                return Finding(name, version, None, "unchecked", ["not on PyPI"])
            r.raise_for_status()
            doc = r.json()
        except (httpx.HTTPError, ValueError) as e:
            return Finding(name, version, None, "lookup-failed", [type(e).__name__])
    latest = doc.get("info", {}).get("version")
    vulns = [v.get("id", "?") + (f" (fixed in {', '.join(v['fixed_in'])})" if v.get("fixed_in") else "")
             for v in doc.get("vulnerabilities") or []]
    try:
        same = latest is not None and Version(version) == Version(latest)
    except InvalidVersion:
        same = version == latest
    if not same:
        return Finding(name, version, latest, "unchecked", [])
    return Finding(name, version, latest, "vulnerable" if vulns else "ok", vulns)


async def audit(index: str, concurrency: int = 8) -> list[Finding]:
    sem = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=20, follow_redirects=True) as client:
        return await asyncio.gather(*(_check(client, sem, n, v, index) for n, v in sorted(installed().items())))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--index", default="https://pypi.org", help="PyPI JSON API base URL")
    ap.add_argument("--verbose", action="store_true", help="list every dependency, not only findings")
    a = ap.parse_args()
    findings = asyncio.run(audit(a.index.rstrip("/")))
    t = Table(title="Dependency audit (PyPI advisories)")
    for c in ("package", "installed", "latest", "status", "advisories"):
        t.add_column(c)
    for f in findings:
        if a.verbose or f.status != "ok":
            t.add_row(f.name, f.installed, f.latest or "-", f.status, "; ".join(f.advisories))
    console.print(t)
    counts = {s: sum(f.status == s for f in findings) for s in ("ok", "vulnerable", "unchecked", "lookup-failed")}
    console.print(f"audit: {len(findings)} dependencies — " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    sys.exit(1 if counts["vulnerable"] else 0)


if __name__ == "__main__":
    main()
