"""Every relative link in README.md and docs/*.md resolves: the file exists and, where the
link names an anchor, the target file has a heading of that anchor (GitHub's rule: lower
case, punctuation dropped, spaces to hyphens)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a Markdown file (code blocks skipped)."""
    found, fenced = set(), False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            found.add(anchor(line.lstrip("#")))
    return found


def links(path: Path) -> list[str]:
    """The relative link targets of a Markdown file (code blocks skipped)."""
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]


def test_anchor_follows_github():
    assert anchor("Finding a run on the network") == "finding-a-run-on-the-network"
    assert (
        anchor("Simulator (`swarm_sim/`, `swarm-node sim`)") == "simulator-swarm_sim-swarm-node-sim"
    )
    assert anchor("1. Run a local swarm") == "1-run-a-local-swarm"


def test_a_broken_link_is_found(tmp_path):
    page = tmp_path / "a.md"
    page.write_text("# Here\n\n[ok](#here) [gone](#there) [file](b.md)\n")
    assert links(page) == ["#here", "#there", "b.md"]
    assert anchors(page) == {"here"}


@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.name)
def test_every_relative_link_resolves(page: Path):
    for target in links(page):
        file, _, name = target.partition("#")
        where = (page.parent / file).resolve() if file else page
        assert where.exists(), f"{page.name}: link to {target}: no such file"
        if name:
            assert where.suffix == ".md", f"{page.name}: anchor into a non-Markdown file {target}"
            assert name in anchors(where), f"{page.name}: link to {target}: no such heading"
