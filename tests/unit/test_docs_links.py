"""The README is a front page and the detail lives in docs/: every relative link between them must lead
to a file that exists (and, for a #fragment, to a heading that exists)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "deploy" / "README.md"]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchors(page: Path) -> set[str]:
    """GitHub-style heading anchors."""
    out = set()
    for line in page.read_text().splitlines():
        m = re.match(r"^#{1,6} (.*)$", line)
        if m:
            text = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower())
            out.add(text.replace(" ", "-"))
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"^[a-z]+://", target) or target.startswith("mailto:"):
            continue
        path, _, fragment = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists() or (fragment and dest.suffix == ".md" and fragment not in _anchors(dest)):
            broken.append(target)
    assert not broken, f"{page.relative_to(ROOT)}: broken links {broken}"


def test_readme_is_a_front_page() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text) < 12_000, "the README is a front page: detail belongs in docs/"
    for needed in ("make demo", "make test", "docs/configuration.md", "docs/integrate.md"):
        assert needed in text
