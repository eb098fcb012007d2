"""What every GPU test needs: a CUDA GPU (or two), else a one-line skip, or a failure when one was promised.

Every test here is marked ``gpu``; ``@pytest.mark.gpus(n)`` asks for ``n`` visible
GPUs (default 1). Without enough, the test is skipped in its setup, before any
fixture starts a job, with the reason in one line. ``CLOUD_ELASTIC_REQUIRE_GPU=1``
(``scripts/gpu-check.sh`` sets it) turns a missing CUDA into a failure of every
test, so a GPU run that found no GPU cannot pass by skipping everything; a test
that needs more GPUs than the machine has is still skipped. Only
``torch.cuda.is_available()`` and ``torch.cuda.device_count()`` are asked here:
no CUDA context is created in the pytest process (the tests' workers are
processes of their own).
"""

from __future__ import annotations

import os

import pytest

from tests.gpu.support import visible_gpus
from tests.integration.conftest import jobs  # noqa: F401  (the fixture that kills what a test leaves running)

_MISSING = pytest.StashKey[str]()


def required() -> bool:
    return os.environ.get("CLOUD_ELASTIC_REQUIRE_GPU", "").strip().lower() in ("1", "true", "yes", "on")


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("gpu") is None:
        return
    marker = item.get_closest_marker("gpus")
    need = int(marker.args[0]) if marker else 1
    have, why = visible_gpus()
    if have >= need:
        return
    if have == 0 and required():
        # Failed in the call phase (below), so it reads as a failed test, not a setup error.
        item.stash[_MISSING] = f"needs a CUDA GPU, and CLOUD_ELASTIC_REQUIRE_GPU=1 says there is one: {why}"
        return
    pytest.skip(f"needs {need} CUDA GPU(s): {why}" if have == 0 else f"needs {need} CUDA GPUs, {have} visible")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> None:
    missing = item.stash.get(_MISSING, None)
    if missing:
        pytest.fail(missing, pytrace=False)


_REPORT = pytest.StashKey[list]()


@pytest.fixture
def gpu_report(request: pytest.FixtureRequest):
    """``gpu_report(line)``: a measurement for the run's summary ("GPU test measurements"), shown even with -q."""
    lines = request.config.stash.setdefault(_REPORT, [])

    def add(line: str) -> None:
        lines.append(f"{request.node.name}: {line}")

    return add


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:  # noqa: ANN001 (pytest's hook)
    lines = config.stash.get(_REPORT, [])
    if lines:
        terminalreporter.section("GPU test measurements")
        for line in lines:
            terminalreporter.write_line(line)
