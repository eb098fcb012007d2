"""A local worker's output while no driver reads it: kept in the job directory, bounded, then relayed to the
driver that adopts it (``worker.link.kept_output`` in a real worker-like process, ``driver.restart.relay`` here).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from cloud_elastic.driver.restart.relay import OutputRelay
from cloud_elastic.worker.link.kept_output import KEEP_BYTES, TRIM_AT, output_paths

pytestmark = pytest.mark.timeout(60)

JOB, WORKER = "job1", "127.0.0.1[0]#1"
LINE = 100  # bytes of each numbered line the child prints

CHILD = textwrap.dedent("""
    import os, sys, time
    from cloud_elastic.worker.link import kept_output
    from cloud_elastic.worker.link.kept_output import _survive_output_loss
    job, worker, here, lines = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    _survive_output_loss()
    keeper = kept_output.keep_for(job, worker)
    print("ready", flush=True)
    while not os.path.exists(os.path.join(here, "closed")):
        time.sleep(0.01)
    keeper.tend()  # the heartbeat's tick notices the broken pipe before anything is written
    os.write(1, b"native 1\\n")  # what native code writes goes to the kept file too
    for i in range(lines):
        print(f"line {i:07d} " + "x" * 86)
    os.write(2, b"native 2\\n")
    keeper.tend()
    open(os.path.join(here, "printed"), "w").close()
    while not os.path.exists(os.path.join(here, "relay")):
        time.sleep(0.01)
    while keeper.detached:  # each tick tries the FIFO of the driver that adopted it
        keeper.tend()
        time.sleep(0.05)
    print("after the switch", flush=True)
    print("on stderr", file=sys.stderr, flush=True)
""")


def _wait(path: Path, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 30
    while not path.exists():
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else proc.returncode
        assert time.monotonic() < deadline, f"no {path.name}"
        time.sleep(0.01)


def _child(tmp_path: Path, lines: int) -> tuple[subprocess.Popen, Path, Path]:
    root = tmp_path / "run"
    (root / "cloud-elastic" / JOB).mkdir(parents=True, mode=0o700)
    (root / "cloud-elastic" / JOB / "driver.json").write_text("{}")
    env = {**os.environ, "XDG_RUNTIME_DIR": str(root), "PYTHONUNBUFFERED": "1"}
    env.pop("CLOUD_ELASTIC_EXIT_REPORT", None)
    proc = subprocess.Popen([sys.executable, "-c", CHILD, JOB, WORKER, str(tmp_path), str(lines)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    assert proc.stdout.readline() == b"ready\n"
    proc.stdout.close()  # the driver died
    (tmp_path / "closed").touch()
    kept, fifo = output_paths(JOB, WORKER, root / "cloud-elastic")
    return proc, kept, fifo


def test_output_written_while_detached_is_kept_bounded_and_relayed_before_what_follows(tmp_path):
    lines = 3 * KEEP_BYTES // LINE
    proc, kept, fifo = _child(tmp_path, lines)
    try:
        _wait(tmp_path / "printed", proc)
        assert kept.stat().st_size <= TRIM_AT and kept.stat().st_mode & 0o777 == 0o600
        got: list[str] = []
        relay = OutputRelay(fifo, got.append, WORKER, kept=kept)
        relay.start()
        (tmp_path / "relay").touch()
        assert proc.wait(30) == 0
        deadline = time.monotonic() + 10
        while not relay.drained(time.monotonic() - 1) and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        proc.kill()
    assert got[0].startswith(f"cloud-elastic: worker {WORKER}: ") and "were dropped" in got[0], got[:2]
    dropped = int(got[0].split(": ")[2].split()[0])
    numbered = [int(line.split()[1]) for line in got if line.startswith("line ")]
    # The newest lines, in order, up to the bound; the dropped count is what is missing before them.
    assert numbered == list(range(numbered[0], lines)), numbered[:3]
    assert (len(numbered) + 1) * LINE > KEEP_BYTES - LINE and len(numbered) * LINE <= KEEP_BYTES
    assert dropped == len("native 1\n") + numbered[0] * LINE
    assert got[-4:] == [f"line {lines - 1:07d} " + "x" * 86, "native 2", "after the switch", "on stderr"]
    assert len(got) == len(numbered) + 4, "a line twice, or one that is none of these"
    assert not kept.exists() and not fifo.exists(), "kept output or the FIFO left behind"


def test_a_worker_that_ends_before_it_opened_the_fifo_has_its_kept_output_relayed_from_the_file(tmp_path):
    proc, kept, fifo = _child(tmp_path, 20)
    try:
        _wait(tmp_path / "printed", proc)
        proc.kill()  # never reached the relay
        proc.wait(10)
    finally:
        proc.kill()
    got: list[str] = []
    relay = OutputRelay(fifo, got.append, WORKER, kept=kept)
    relay.start()
    assert relay.drained(time.monotonic())
    assert got == ["native 1"] + [f"line {i:07d} " + "x" * 86 for i in range(20)] + ["native 2"]
    assert not kept.exists() and not fifo.exists()


# A worker (this script) keeping its output and a child forked from it (review s60 rvW): the child's pipe breaks,
# it prints; then the worker goes detached, forks a second child, removes its kept file (as at the switch to a
# restarted driver) and that child prints again.
_CHILDREN = """
import os, sys, time
from pathlib import Path
from cloud_elastic.worker.link import kept_output as ko
here = Path(sys.argv[1])
r, w = os.pipe()
os.dup2(w, 1)
keeper = ko.KeptOutput("w1", here / ".out-w1.log", here / ".out-w1.fifo")
ko._current = keeper
pid = os.fork()
if pid == 0:  # a child whose pipe broke (the driver died): it prints
    time.sleep(0.3)
    kept = keeper.broken()
    os.write(1, b"child line\\n" * 100)
    os._exit(3 if kept else 0)
os.close(r)
_, status = os.waitpid(pid, 0)
print("first child", os.waitstatus_to_exitcode(status), "file", keeper.log_path.exists(), file=sys.stderr)
keeper.broken()  # the worker itself: its output kept in the file
pid = os.fork()
if pid == 0:  # forked while the worker is detached: its descriptor 1 is the worker's kept file
    time.sleep(0.5)  # the worker removed the file meanwhile
    keeper.wrote(1)
    os._exit(0 if os.readlink("/proc/self/fd/1") == "/dev/null" else 4)
os.unlink(keeper.log_path)
_, status = os.waitpid(pid, 0)
print("second child", os.waitstatus_to_exitcode(status), file=sys.stderr)
"""


def test_a_forked_child_never_creates_nor_follows_the_workers_kept_output(tmp_path):
    done = subprocess.run([sys.executable, "-c", _CHILDREN, str(tmp_path)], capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0, done.stderr
    # The child's output went to /dev/null: no kept file of the worker's created by it, never relayed nor trimmed.
    assert "first child 0 file False" in done.stderr, done.stderr
    # A child writing into the worker's kept file leaves it once the worker removed it (not unseen, unbounded).
    assert "second child 0" in done.stderr, done.stderr
