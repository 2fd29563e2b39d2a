"""The README is a front door (at most 200 lines, its first commands the main job's and the tests'), and every
link of the manual (README.md, docs/, containers/README.md) leads to a file and a heading that exist."""

from __future__ import annotations

import re
from pathlib import Path

from helpers import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "containers" / "README.md"]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings."""
    out = set()
    for line in page.read_text().splitlines():
        if m := re.match(r"#+ (.+)", line):
            out.add(re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-"))
    return out


def broken_links(pages: list[Path], root: Path = REPO) -> list[str]:
    bad = []
    for page in pages:
        for target in LINK.findall(page.read_text()):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                bad.append(f"{page.relative_to(root)}: {target}: no such file")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                bad.append(f"{page.relative_to(root)}: {target}: no such heading")
    return bad


def test_the_readme_is_a_front_door():
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= 200, len(lines)
    commands = [line.strip() for line in lines[:20] if line.startswith("    ")]
    assert "kit cluster up --nodes 2 --prometheus" in commands[0] and "kit report" in commands[0], commands
    assert commands[-1] == (
        ". .venv/bin/activate && python3 -m pytest -q -n 3 && python3 -m pytest -q -m machine_wide"
    ), commands
    ci = (REPO / ".ci" / "run").read_text()  # CI runs the same (its `tests` part: pytest with a kept directory)
    assert 'part "${name}" python3 -m pytest -q -p no:cacheprovider ' in ci
    assert "\n  tests suite -n 3\n" in ci and "\n  tests machine-wide -m machine_wide" in ci
    assert "issue" not in " ".join(lines).lower()  # what changed is CHANGELOG.md's
    assert (REPO / "docs" / "report.png").stat().st_size > 10_000  # the picture it opens with


def test_every_link_of_the_manual_leads_somewhere():
    assert broken_links(PAGES) == []


def test_the_link_check_can_fail(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Top\n[a](page.md#top) [b](nowhere.md) [c](#missing)\n")
    assert broken_links([page], tmp_path) == ["page.md: nowhere.md: no such file", "page.md: #missing: no such heading"]
