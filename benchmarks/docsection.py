"""Writing a benchmark's result table into docs/benchmarks.md between its own markers."""

from __future__ import annotations

from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"


def write_section(begin: str, end: str, heading: str, table: str, doc: Path = DOC) -> None:
    """Replace what stands between ``begin`` and ``end`` with ``table``, or add a new last section ``heading``."""
    text = doc.read_text()
    block = f"{begin}\n{table}\n{end}"
    if begin in text:
        text = text[: text.index(begin)] + block + text[text.index(end) + len(end):]
    else:
        text = text.rstrip() + f"\n\n## {heading}\n\n" + block + "\n"
    doc.write_text(text)
