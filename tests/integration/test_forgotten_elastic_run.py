"""A script that forgets ``@hvd.elastic.run`` (review s63 rvU finding 1).

``state.commit()`` called in a training function that is not decorated: the job failed a run that trained to its
end ("exited with code 0 before its training function returned"), and with ``--checkpoint-dir`` it wrote no
checkpoint and retrained from step 0 for ever. Now the commit is refused at once, in one line naming the
decorator, and the job ends with that line, with or without ``--checkpoint-dir``. And a job resumed from a
checkpoint whose script no longer enters ``hvd.elastic.run`` (which is what loads the checkpoint) fails once
instead of retraining from its initial weights round after round.
"""

from __future__ import annotations

import sys
import textwrap

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

SCRIPT = textwrap.dedent('''
    import os, time, torch
    import cloud_elastic.torch as hvd
    hvd.init()
    model = torch.nn.Linear(4, 1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01))
    NO_RUN = os.environ.get("NO_RUN") == "1"
    STEPS = int(os.environ.get("STEPS", "80"))

    def train(state):
        while state.step < STEPS:
            opt.zero_grad(); model(torch.randn(8, 4)).sum().backward(); opt.step()
            state.step += 1
            if os.environ.get("COMMIT", "1") == "1":
                state.commit()
            time.sleep(0.025)

    state = hvd.elastic.TorchState(model, opt, step=0)
    (train if NO_RUN else hvd.elastic.run(train))(state)
    print("rank", hvd.rank(), "DONE at", state.step, flush=True)
''')

HOSTS = "127.0.0.1:1,127.0.0.2:1"
REFUSED = "UnsupportedError: state.commit() called outside hvd.elastic.run: decorate the training function"


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpoint-dir"])
def test_a_commit_outside_elastic_run_ends_the_job_at_once_naming_the_decorator(jobs, tmp_path, checkpointing):
    script = tmp_path / "forgot_run.py"
    script.write_text(SCRIPT)
    ckpt = tmp_path / "ckpt"
    extra = ["--checkpoint-dir", str(ckpt), "--checkpoint-interval", "1"] if checkpointing else []
    job = jobs(["run", "-np", "2", "-H", HOSTS, *extra, sys.executable, str(script)], env={"NO_RUN": "1"})
    assert job.finish(60) == 1, job.output()
    last, out = job.lines[-1], job.output()
    assert REFUSED in last and "@hvd.elastic.run" in last, last
    assert "DONE at" not in out, "a worker trained on past the refused commit"
    assert out.count("formed with") == 1, out  # no round re-formed: nothing trains again from step 0
    assert "before its training function returned" not in out and "lost every worker" not in out, out
    if checkpointing:
        assert not list(ckpt.glob("ckpt-*")), list(ckpt.iterdir())


def test_a_resumed_job_whose_script_skips_elastic_run_fails_once_rather_than_retrain(jobs, tmp_path):
    script = tmp_path / "maybe_run.py"
    script.write_text(SCRIPT)
    ckpt = tmp_path / "ckpt"
    args = ["run", "-np", "2", "-H", HOSTS, "--checkpoint-dir", str(ckpt), sys.executable, str(script)]
    # A few steps: the point is the checkpoint it leaves, then what the same command does from it (80 steps of
    # 25 ms in each run waited for nothing).
    first = jobs(args, env={"STEPS": "8"})
    assert first.finish(60) == 0, first.output()
    assert list(ckpt.glob("ckpt-*")), "the elastic run wrote no checkpoint"
    # The same command, its training function no longer run by hvd.elastic.run (and not committing): the job
    # resumes from the checkpoint, which no worker loads.
    again = jobs(args, env={"NO_RUN": "1", "COMMIT": "0", "STEPS": "8"})
    assert again.finish(60) == 1, again.output()
    last, out = again.lines[-1], again.output()
    assert "exited 0 without entering hvd.elastic.run, so none loaded the checkpoint this job resumes from" in last, last
    assert out.count("formed with") == 1, out  # failed once, not relaunched "from the latest checkpoint"
