"""docs/architecture.md and its pages name files, classes' methods and headings that exist; the index's
Packages table has a row for every sub-package and top-level module, and each walk counts the files it lists.

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


def _package_rows() -> str:
    """The first cells of the index's Packages table."""
    section = _prose(INDEX).split("## Packages", 1)[1].split("\n## ", 1)[0]
    return "\n".join(line.split("|")[1] for line in section.splitlines() if line.startswith("| `"))


def test_every_sub_package_and_top_level_module_has_a_row_in_the_packages_table() -> None:
    rows = _package_rows()
    named = set(re.findall(r"`([^`]+)`", rows))
    parts = [f"{d.relative_to(PACKAGE)}/" for d in sorted(PACKAGE.rglob("__init__.py")) for d in [d.parent]
             if d != PACKAGE and "__pycache__" not in d.parts]
    parts += [f.name for f in sorted(PACKAGE.glob("*.py")) if f.name != "__init__.py"]
    # A package whose sub-packages have rows of their own (driver/) needs no row of its own.
    missing = [p for p in parts if p not in named and not any(n.startswith(p) and n != p for n in named)]
    assert not missing, "not in docs/architecture.md's Packages table: " + ", ".join(missing)


def test_each_walk_counts_the_files_its_table_lists() -> None:
    wrong = []
    for walk in re.split(r"^### ", _prose(INDEX), flags=re.M)[1:5]:
        title = walk.splitlines()[0]
        said = re.search(r"^(\d+) files\b", walk, re.M)
        listed = {f for row in re.findall(r"^\| \d+ \|([^|]*)\|", walk, re.M) for f in re.findall(r"`([^`]+)`", row)}
        if said is None or int(said.group(1)) != len(listed):
            wrong.append(f"{title}: says {said.group(1) if said else 'nothing'}, lists {len(listed)}")
    assert not wrong, "; ".join(wrong)


def test_every_class_attribute_the_pages_name_is_defined_in_the_package() -> None:
    """A backticked ``Class.name`` of a class of the package names something defined there (a method or
    attribute, in any module: mixins and helpers share the work): a renamed or removed method fails."""
    sources = [f.read_text() for f in PACKAGE.rglob("*.py") if "__pycache__" not in f.parts]
    classes = {c for text in sources for c in re.findall(r"^\s*class\s+(\w+)", text, re.M)}
    everything = "\n".join(sources)
    missing = []
    for page in PAGES:
        for cls, attr in re.findall(r"`(?:[\w/]+\.py:)?([A-Z]\w*)\.(\w+)(?:\(\))?`", _prose(page)):
            if cls in classes and not re.search(
                    rf"^\s*(?:async\s+)?(?:def|class)\s+{attr}\b|^\s*(?:self\.)?{attr}\s*[:=]", everything, re.M):
                missing.append(f"{page.relative_to(REPO)}: `{cls}.{attr}`")
    assert not missing, "named in the architecture docs but defined nowhere in the package: " + "; ".join(missing)
