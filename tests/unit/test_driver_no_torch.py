"""A driver never imports torch, with ``--checkpoint-dir`` too: it opens the store (its records, claims and signs of
life) and never a payload, and the import was most of its CPU at start-up (about 1.2 of 1.7 CPU-seconds for a job
of one worker; the suite starts some hundred such drivers, on a 2-core machine whose both cores it keeps busy)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(60)


def test_a_run_with_a_checkpoint_dir_imports_no_torch_in_the_driver(tmp_path) -> None:
    # The driver in this process (runpy), its worker a plain interpreter of its own that imports nothing (no fork
    # server, which would import torch in a process of its own): the job fails, its worker never having called
    # hvd.init(), after the driver opened the store, wrote the job's record, claimed the job and said it is alive.
    argv = ["cloud-elastic", "run", "--checkpoint-dir", str(tmp_path / "ckpt"), "-np", "1", "-H", "127.0.0.1:1",
            sys.executable, "-c", "pass"]
    code = (
        "import json, sys, runpy\n"
        f"sys.argv = {argv!r}\n"
        "try:\n    runpy.run_module('cloud_elastic.cli', run_name='__main__')\n"
        "except SystemExit as exc:\n    code = exc.code\n"
        "print(json.dumps({'code': code, 'torch': 'torch' in sys.modules}))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=50,
                            env={**os.environ, "CLOUD_ELASTIC_LOCAL_FORKSERVER": "0",
                                 "XDG_RUNTIME_DIR": str(tmp_path)}, stdin=subprocess.DEVNULL)
    assert "never called hvd.init()" in result.stdout + result.stderr, result.stdout + result.stderr
    assert (tmp_path / "ckpt" / "job.json").exists(), "the driver did not open the checkpoint store"
    assert json.loads(result.stdout.splitlines()[-1]) == {"code": 1, "torch": False}, result.stdout + result.stderr
