"""Every ``terraform output NAME`` in docs/terraform.md names an output the example it is run in has.

Review of 19d4b02: the steps that replace the workers after a new driver said ``terraform output -raw asg_name``
(``mig_name``) "in the multi-source example" too, whose outputs are the lists ``asg_names`` (``mig_names``): the
command failed with "Output not found" there. A command in a list item or paragraph that names an example's
directory (``terraform/examples/<name>``) is checked against that example's outputs (the last one named
before it); any other is run in whichever example the reader chose, so every example must have it.
"""

from __future__ import annotations

import re

import pytest

from .conftest import copy_tree
from .hcl import Tree

pytestmark = [pytest.mark.terraform, pytest.mark.timeout(60)]

_EXAMPLE = re.compile(r"terraform/examples/([a-z0-9-]+)")
_OUTPUT = re.compile(r"terraform\s+output\s+(?:-[a-z]+\s+)*([a-z][a-z0-9_]*)")
_ITEM = re.compile(r"^\s*(?:[-*]|\d+\.)\s|^#")


def blocks(markdown: str) -> list[str]:
    """The text's list items, headings and paragraphs (fenced code stays in the block it is in), each joined
    into one line so that a command wrapped across lines is whole."""
    out: list[list[str]] = [[]]
    fenced = False
    for line in markdown.splitlines():
        if line.strip().startswith("```"):
            fenced = not fenced
        elif not fenced and (not line.strip() or _ITEM.match(line)):
            out.append([])
        out[-1].append(line.strip())
    return [" ".join(lines) for lines in out if lines]


def output_problems(tree: Tree) -> list[str]:
    """Each ``terraform output NAME`` in the docs that the example it is run in lacks (empty: none)."""
    examples = {p.name: set(tree.example(p.name).outputs)
                for p in sorted((tree.root / "examples").iterdir()) if (p / "outputs.tf").exists()}
    problems = []
    for text in blocks(tree.docs):
        example = None
        for found in sorted([*_EXAMPLE.finditer(text), *_OUTPUT.finditer(text)], key=lambda m: m.start()):
            if found.re is _EXAMPLE:
                example = found.group(1)
                if example not in examples:
                    problems.append(f"names terraform/examples/{example}, which has no outputs.tf")
                continue
            name = found.group(1)
            lacking = [e for e in ([example] if example in examples else examples) if name not in examples[e]]
            if lacking:
                problems.append(f"`{found.group(0)}` in {lacking} (outputs there: "
                                f"{', '.join(sorted(examples[lacking[0]]))}): {text[:80]}...")
    return problems


def test_every_terraform_output_in_the_docs_exists_in_the_example_it_is_run_in(tree):
    assert not output_problems(tree), "\n".join(output_problems(tree))


@pytest.mark.parametrize("old, new, lacking", [
    ("terraform output -json asg_names", "terraform output\n    -raw asg_name", "['aws-multi-source']"),
    ("- GCP, `terraform/examples/gcp`:", "- GCP:", "'gcp-multi-source'"),  # a command no example is named for
], ids=["named-example", "any-example"])
def test_an_output_the_example_lacks_is_reported(tmp_path, old, new, lacking):
    broken = copy_tree(tmp_path)
    docs = broken.root.parent / "docs" / "terraform.md"
    assert docs.read_text().count(old) == 1, old
    docs.write_text(docs.read_text().replace(old, new))
    problems = output_problems(broken)
    assert len(problems) == 1 and lacking in problems[0], problems
