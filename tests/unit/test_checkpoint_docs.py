"""The examples of docs/checkpoints.md run, and load back exactly what was checkpointed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.timeout(60)

DOC = Path(__file__).resolve().parents[2] / "docs" / "checkpoints.md"


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)


def test_the_doc_examples_write_then_load_the_committed_state(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    write, load_plain, load_store = _python_blocks()
    scope: dict = {"checkpoint_dir": str(tmp_path)}
    exec(compile(write, f"{DOC}:write", "exec"), scope)
    committed = {k: v.clone() for k, v in scope["state"].model.state_dict().items()}
    momentum = [s["momentum_buffer"].clone() for s in scope["state"].optimizer.state_dict()["state"].values()]

    exec(compile(load_plain, f"{DOC}:load", "exec"), scope)
    for key, value in committed.items():
        assert torch.equal(scope["model"].state_dict()[key], value), key
    loaded_momentum = [s["momentum_buffer"] for s in scope["optimizer"].state_dict()["state"].values()]
    assert len(loaded_momentum) == len(momentum) == 2
    assert all(torch.equal(a, b) for a, b in zip(loaded_momentum, momentum))
    assert "resuming at step 3: epoch 0, batch 3" in capsys.readouterr().out
    assert len(list(tmp_path.glob("ckpt-*"))) == 2  # keep=2

    # The store example loads the newest checkpoint into the state the first example built.
    scope["state"].batch = 99
    exec(compile(load_store, f"{DOC}:store", "exec"), scope)
    assert scope["state"].batch == 3 and scope["latest"].info.step == 3
