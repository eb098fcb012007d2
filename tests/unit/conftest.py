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


@pytest.fixture(autouse=True)
def fresh_commit_window(request: pytest.FixtureRequest) -> None:
    """Each test starts a new training loop: the process's commit window has seen none of the others' steps.

    The standalone worker context is one per process; what one test's loop taught
    it (``worker.ledger.CommitWindow``) would otherwise decide how the next test's commits are kept.
    ``@pytest.mark.commit_mode("snapshot")`` runs a test as ``CLOUD_ELASTIC_COMMIT_MODE=snapshot``.
    """
    from cloud_elastic.worker import context
    from cloud_elastic.worker.ledger import CommitWindow

    marker = request.node.get_closest_marker("commit_mode")
    mode = marker.args[0] if marker else "auto"
    ctx = context.init() if marker else context._CONTEXT
    if ctx is not None:
        ctx.ledger.window = CommitWindow(mode)
        ctx.ledger.holds_commit = True
        # A flag an earlier test's step carried and no commit read (which test ran before depends on how
        # xdist shares the files out) would answer this test's first commit instead of its own check.
        ctx._carried_update = None
