"""Helpers shared by the unit tests that need real files: executable scripts."""

from __future__ import annotations

import functools
import textwrap
from pathlib import Path
from typing import Callable

import pytest

ScriptFactory = Callable[..., Path]


def write_script(directory: Path, body: str, *, name: str = "discover.sh", mode: int = 0o755) -> Path:
    """Write a ``/bin/sh`` script into ``directory`` and return its path.

    ``body`` is dedented; ``mode`` defaults to executable. ``{tmp}`` in the body
    is replaced by ``directory`` so a script can leave marker files there.
    """
    path = directory / name
    path.write_text("#!/bin/sh\n" + textwrap.dedent(body).replace("{tmp}", str(directory)))
    path.chmod(mode)
    return path


@pytest.fixture
def make_script(tmp_path: Path) -> ScriptFactory:
    """:func:`write_script` into this test's ``tmp_path``."""
    return functools.partial(write_script, tmp_path)
