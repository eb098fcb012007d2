"""Writing a benchmark's results into docs/benchmarks.md: its own section, and its rows of the glance table.

A section is whatever stands between ``<!-- KEY:begin -->`` and ``<!-- KEY:end -->``;
a benchmark rewrites only that, and the prose around it stays. A section that is not
there yet is added as a new last ``## heading``. The glance table at the top
(between ``<!-- glance:begin -->`` and ``<!-- glance:end -->``) has one row per
target; a benchmark replaces the rows whose first cell is one of its targets, and
adds those that are missing.

Every benchmark takes the same options (:func:`add_arguments`): ``--doc PATH`` (the
file to write; docs/benchmarks.md by default, none with ``--quick`` unless given)
and ``--images DIR`` (where pictures go; docs/images by default, none with
``--quick`` unless given), so a smoke run never overwrites published figures.
"""

from __future__ import annotations

import argparse
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "benchmarks.md"
IMAGES = REPO / "docs" / "images"
GLANCE = "glance"
GLANCE_HEADER = ("| target | measured | measured / target | where measured | |\n"
                 "|---|---|---|---|---|")


def markers(key: str) -> tuple[str, str]:
    return f"<!-- {key}:begin -->", f"<!-- {key}:end -->"


def write_section(key: str, heading: str, text: str, doc: Path = DOC) -> None:
    """Replace what stands between ``key``'s markers with ``text``, or add a new last section ``heading``."""
    begin, end = markers(key)
    body = doc.read_text()
    block = f"{begin}\n{text.strip()}\n{end}"
    if begin in body and end in body:
        body = body[: body.index(begin)] + block + body[body.index(end) + len(end):]
    else:
        body = body.rstrip() + f"\n\n## {heading}\n\n" + block + "\n"
    doc.write_text(body)


def write_glance(rows: list[list[str]], doc: Path = DOC) -> None:
    """Replace (or add) these rows of the glance table; a row is its cells, the first naming the target."""
    begin, end = markers(GLANCE)
    body = doc.read_text()
    if begin not in body:
        raise SystemExit(f"{doc} has no {begin} table to write the targets into")
    start, stop = body.index(begin) + len(begin), body.index(end)
    lines = [l for l in body[start:stop].strip().splitlines() if l.startswith("|")][2:]  # without the header
    for cells in rows:
        line = "| " + " | ".join(cells) + " |"
        at = next((i for i, l in enumerate(lines) if l.split("|")[1].strip() == cells[0]), None)
        if at is None:
            lines.append(line)
        else:
            lines[at] = line
    body = body[:start] + "\n" + "\n".join([GLANCE_HEADER, *lines]) + "\n" + body[stop:]
    doc.write_text(body)


def verdict(met: bool) -> str:
    return "met" if met else "**missed**"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--quick``, ``--doc`` and ``--images``, the same for every benchmark (``./dev bench`` passes them)."""
    parser.add_argument("--quick", action="store_true", help="a smoke run: fewer repeats, nothing published")
    parser.add_argument("--doc", type=Path, default=None,
                        help=f"where to write the section (default {DOC.relative_to(REPO)}; with --quick: nowhere)")
    parser.add_argument("--images", type=Path, default=None,
                        help=f"where to draw pictures (default {IMAGES.relative_to(REPO)}; with --quick: none)")
    parser.add_argument("--no-write", action="store_true", help="print only: no section, no picture")


def doc_of(args: argparse.Namespace) -> Path | None:
    if args.no_write:
        return None
    return args.doc or (None if args.quick else DOC)


def images_of(args: argparse.Namespace) -> Path | None:
    if args.no_write:
        return None
    folder = args.images or (None if args.quick else IMAGES)
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
    return folder


def publish(args: argparse.Namespace, key: str, heading: str, text: str, glance: list[list[str]] = ()) -> None:
    """Print the section, then write it and its glance rows into the document ``args`` name, if any."""
    print(text, flush=True)
    doc = doc_of(args)
    if doc is None:
        return
    write_section(key, heading, text, doc)
    if glance:
        write_glance(list(glance), doc)
    print(f"wrote the {key} section of {doc}", flush=True)
