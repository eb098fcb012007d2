"""docs/architecture.md and its pages name files that exist, and link to headings that exist.

The architecture pages walk the code file by file; when a module moves, the walk must move with it.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "cloud_elastic"
INDEX = REPO / "docs" / "architecture.md"
PAGES = [INDEX, *sorted((REPO / "docs" / "architecture").glob("*.md"))]

#: Paths a page names that are not files of this repository (of a worker host, of the wire, of a checkpoint).
_NOT_OURS = re.compile(r"^(/dev/|/proc/|/v1/|dcp/|\./)")


def _prose(page: Path) -> str:
    return re.sub(r"```.*?```", "", page.read_text(), flags=re.S)


def _named_paths(page: Path) -> list[tuple[str, str]]:
    """(path, name) of every backticked ``path`` or ``path:Name`` of a file or folder of the repository."""
    found = []
    for token in re.findall(r"`([^`\s]+)`", _prose(page)):
        path, _, name = token.partition(":")
        if ("/" in path or path.endswith(".py")) and not _NOT_OURS.match(path) and not re.search(r"[*$]|PID", path):
            found.append((path, name))
    return found


def _resolve(path: str) -> Path | None:
    """A path relative to ``cloud_elastic/`` (how the pages name modules) or to the repository; a bare file
    name anywhere in the package or the tests."""
    for base in (PACKAGE, REPO, REPO / "tests" / "unit", REPO / "tests" / "integration"):
        if (base / path.rstrip("/")).exists():
            return base / path.rstrip("/")
    if "/" not in path:
        for root in (PACKAGE, REPO / "tests"):
            hits = [f for f in root.rglob(path) if "__pycache__" not in f.parts]
            if hits:
                return hits[0]
    return None


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    return {_slug(h) for h in re.findall(r"^#+\s+(.*)$", _prose(page), re.M)}


def test_every_file_the_architecture_pages_name_exists() -> None:
    missing = []
    for page in PAGES:
        for path, name in _named_paths(page):
            found = _resolve(path)
            if found is None:
                missing.append(f"{page.relative_to(REPO)}: `{path}`")
            elif name and found.is_file():
                top = name.split(".")[0]
                if not re.search(rf"^\s*(class|def)\s+{re.escape(top)}\b|^\s*{re.escape(top)}\s*[:=]",
                                 found.read_text(), re.M):
                    missing.append(f"{page.relative_to(REPO)}: `{path}:{name}` ({top} is not defined there)")
    assert not missing, "named in the architecture docs but not in the code: " + "; ".join(missing)


def test_every_link_of_the_architecture_pages_reaches_a_heading() -> None:
    broken = []
    for page in PAGES:
        for target in re.findall(r"\]\(([^)\s]+)\)", _prose(page)):
            if re.match(r"[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            dest = (page.parent / file) if file else page
            if not dest.exists():
                broken.append(f"{page.relative_to(REPO)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{page.relative_to(REPO)}: {target} (no such heading)")
    assert not broken, "broken links: " + "; ".join(broken)


def test_the_index_opens_with_the_four_paths() -> None:
    headings = re.findall(r"^##+\s+(.*)$", _prose(INDEX), re.M)
    assert headings[0] == "Four paths through the code"
    assert [h[:3] for h in headings[1:5]] == ["(a)", "(b)", "(c)", "(d)"]
