"""Read the Terraform tree with python-hcl2 for the structural tests.

:class:`Tree` is a ``terraform/`` directory (the real one, or a copy a test
has broken on purpose); :class:`Module` is one directory of ``.tf`` files,
merged. Values come back as python-hcl2 8 serialises them with
``strip_string_quotes``: literals as Python values, anything else as the
expression text wrapped in ``${...}``. The helpers below read those
expressions without evaluating them, which is all the checks need.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import hcl2
from hcl2 import SerializationOptions

REPO = Path(__file__).resolve().parents[2]
TERRAFORM_DIR = REPO / "terraform"
CLOUDS = ("aws", "gcp", "azure", "ibm")
SHARED = "common"

_OPTIONS = SerializationOptions(strip_string_quotes=True, with_comments=False)
_INTERPOLATION = re.compile(r"^\$\{(.*)\}$", re.S)


@functools.lru_cache(maxsize=None)
def parse(text: str) -> dict[str, Any]:
    """HCL text as python-hcl2 serialises it, without its block markers.

    Cached by content, so a broken copy re-parses only the file it changed.
    """
    return _strip_markers(hcl2.loads(text, serialization_options=_OPTIONS))


def _strip_markers(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _strip_markers(v) for k, v in node.items() if k != "__is_block__"}
    if isinstance(node, list):
        return [_strip_markers(v) for v in node]
    return node


@dataclass(frozen=True)
class Module:
    """The merged top-level blocks of every ``.tf`` file in one directory."""

    path: Path
    blocks: dict[str, list[Any]]

    @classmethod
    def load(cls, path: Path) -> "Module":
        blocks: dict[str, list[Any]] = {}
        files = sorted(path.glob("*.tf"))
        if not files:
            raise FileNotFoundError(f"no .tf files in {path}")
        for file in files:
            for kind, entries in parse(file.read_text()).items():
                blocks.setdefault(kind, []).extend(entries)
        return cls(path, blocks)

    def _labelled(self, kind: str) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for entry in self.blocks.get(kind, []):
            out.update(entry)
        return out

    def _typed(self, kind: str, type_: str) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for entry in self.blocks.get(kind, []):
            out.update(entry.get(type_, {}))
        return out

    def resources(self, type_: str) -> dict[str, dict[str, Any]]:
        """``name -> body`` of every ``resource "TYPE" "name"``."""
        return self._typed("resource", type_)

    def resource(self, type_: str, name: str) -> dict[str, Any]:
        found = self.resources(type_)
        if name not in found:
            raise LookupError(f"{self.path.name}: no resource {type_}.{name}")
        return found[name]

    def data(self, type_: str, name: str) -> dict[str, Any]:
        found = self._typed("data", type_)
        if name not in found:
            raise LookupError(f"{self.path.name}: no data {type_}.{name}")
        return found[name]

    def all_resources(self) -> Iterator[tuple[str, str, dict[str, Any]]]:
        for entry in self.blocks.get("resource", []):
            for type_, named in entry.items():
                for name, body in named.items():
                    yield type_, name, body

    @property
    def variables(self) -> dict[str, dict[str, Any]]:
        return self._labelled("variable")

    @property
    def outputs(self) -> dict[str, dict[str, Any]]:
        return self._labelled("output")

    @property
    def module_calls(self) -> dict[str, dict[str, Any]]:
        return self._labelled("module")

    @property
    def locals(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for entry in self.blocks.get("locals", []):
            out.update(entry)
        return out

    @property
    def terraform_blocks(self) -> list[dict[str, Any]]:
        return list(self.blocks.get("terraform", []))

    def variable_default(self, name: str) -> Any:
        variable = self.variables.get(name)
        if variable is None or "default" not in variable:
            raise LookupError(f"{self.path.name}: variable {name} has no default")
        return variable["default"]

    def value(self, expr: Any) -> Any:
        """A literal as is; ``var.x`` as x's default; anything else raises LookupError."""
        ref = reference(expr)
        if ref is None:
            return expr
        if ref.startswith("var.") and ref.count(".") == 1:
            return self.variable_default(ref[4:])
        raise LookupError(f"{self.path.name}: cannot resolve {expr!r} without evaluating it")


@dataclass(frozen=True)
class Tree:
    """A ``terraform/`` directory: modules/<name>, examples/<cloud>, docs beside it."""

    root: Path

    def module(self, name: str) -> Module:
        return Module.load(self.root / "modules" / name)

    def example(self, cloud: str) -> Module:
        return Module.load(self.root / "examples" / cloud)

    def readme(self, name: str) -> str:
        return (self.root / "modules" / name / "README.md").read_text()

    @property
    def docs(self) -> str:
        """docs/terraform.md beside the tree (a copy of the tree gets a copy of it)."""
        return (self.root.parent / "docs" / "terraform.md").read_text()

    def module_dirs(self) -> list[Path]:
        """Every root and child module: modules/* and examples/*."""
        return sorted(p for p in (self.root / "modules").iterdir() if p.is_dir()) + sorted(
            p for p in (self.root / "examples").iterdir() if p.is_dir()
        )


# ----------------------------------------------------------------- expressions


def reference(expr: Any) -> str | None:
    """The expression of a value that is one whole ``${...}`` (``"${aws_x.y.id}"`` -> ``"aws_x.y.id"``).

    None for literals and for templates that mix text and interpolations.
    """
    if not isinstance(expr, str) or not _INTERPOLATION.match(expr):
        return None
    depth = 0
    for index, char in enumerate(expr):
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0 and index != len(expr) - 1:
                return None  # "${a}-${b}": the first interpolation closes early
    return expr[2:-1].strip()


def mentions(expr: Any, name: str) -> bool:
    """Whether ``name`` (such as ``module.common.worker_tags``) appears as a whole reference in ``expr``."""
    return re.search(rf"(?<![\w.]){re.escape(name)}(?![\w])", str(expr)) is not None


def block(body: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The first nested block ``name`` of ``body``, or None."""
    found = body.get(name)
    if isinstance(found, list) and found and isinstance(found[0], dict):
        return found[0]
    return None


def blocks(body: dict[str, Any], name: str) -> list[dict[str, Any]]:
    found = body.get(name)
    return [b for b in found if isinstance(b, dict)] if isinstance(found, list) else []


def dynamic(body: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The ``dynamic "name"`` block of ``body``, or None."""
    for entry in blocks(body, "dynamic"):
        if name in entry:
            return entry[name]
    return None


def merge_args(expr: Any) -> list[str] | None:
    """Top-level arguments of ``merge(a, b, ...)``, or ``[ref]`` for a plain reference; None otherwise."""
    ref = reference(expr)
    if ref is None:
        return None
    match = re.fullmatch(r"merge\((.*)\)", ref, re.S)
    if not match:
        return [ref]
    args, depth, current = [], 0, ""
    for char in match.group(1):
        if char in "({[":
            depth += 1
        elif char in ")}]":
            depth -= 1
        if char == "," and depth == 0:
            args.append(current.strip())
            current = ""
        else:
            current += char
    args.append(current.strip())
    return args
