"""The final sharded checkpoint holds the final state, whatever changed after the last commit, and a host of 3 slots
loads what a host of 2 wrote.

Found in review: a training function that halved its weights after its last checkpointed commit (an EMA or SWA swap,
the best weights loaded back, would do the same) ended with success, yet no final checkpoint was written (no step
since that commit, ``state.pt`` unchanged) and a rerun resumed from the last commit's weights. Here only local rank 1
changes its shards (``tests/integration/shard_probe.py --scale-after-training 1``): local rank 0, which decided for
the host, saw nothing change.

1. One host of 2 slots, a checkpoint at every commit (each as soon as the previous one is done), 3 steps, then the
   change: the final checkpoint holds it.
2. One host of 3 slots on the same folder, 3 steps asked: it trains none, and enters with the first job's final
   state bitwise, resharded from 2 workers to 3 (uneven shards, and empty ones: the last layer's single row).
"""

from __future__ import annotations

import sys

import pytest

from tests.integration.harness import REPO

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

PROBE = REPO / "tests" / "integration" / "shard_probe.py"


def _args(ckpt, slots: int, *extra: str) -> list[str]:
    return ["run", "-np", str(slots), "--min-np", str(slots), "--slots-per-host", str(slots), "--whole-hosts",
            "-H", f"127.0.0.1:{slots}", "--checkpoint-dir", str(ckpt), "--checkpoint-interval", "0.001",
            sys.executable, str(PROBE), "--steps", "3", "--full-checksum", *extra]


def test_weights_changed_after_the_last_checkpointed_commit_are_in_the_final_checkpoint_and_3_slots_load_it(
        jobs, tmp_path):
    ckpt = tmp_path / "ckpt"
    first = jobs(_args(ckpt, 2, "--step-sleep", "0.5", "--scale-after-training", "1"))
    assert first.finish(timeout=150) == 0, first.output()
    done = {e["full"] for e in first.of("done")}
    last = {e["full"] for e in first.of("commit") if e["step"] == 3}
    assert len(done) == 1 and len(last) == 1 and done != last, (done, last)  # the change after the last commit

    second = jobs(_args(ckpt, 3, "--step-sleep", "0"))
    assert second.finish(timeout=150) == 0, second.output()
    entered = second.of("entered")
    assert len(entered) == 3 and {(e["step"], e["full"]) for e in entered} == {(3, done.pop())}, entered  # before
    # the fix: the last commit's state
    held = sorted(e["held"] for e in second.of("hello"))
    assert len(set(held)) > 1 and sum(held) > 0, held  # 3 workers share the model unevenly
