"""SIGTERM inside ``elastic.run`` (worker/termination.py) in real processes, and the driver's answer to it
(driver/runtime/control_plane.py, on a Driver that was never started)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import pytest

from cloud_elastic.driver.job.workers import WorkerState
from tests.unit.test_control_plane import plane

pytestmark = pytest.mark.timeout(60)

# A process with the handler installed; ``ask`` answers as the test says, after writing "asked".
_PROGRAM = textwrap.dedent("""
    import os, select, signal, sys, time
    from cloud_elastic.worker.termination import TermHandler

    answer = sys.argv[1]
    def ask(deadline):
        print("asked", round(deadline - time.time()), flush=True)
        if answer == "raise":
            raise OSError("the driver cannot be reached")
        return answer == "stay"

    if sys.argv[2] == "user-handler":
        signal.signal(signal.SIGTERM, lambda *_: print("the script's own handler", flush=True))
    handler = TermHandler(ask, 40.0, label="w1")
    print("installed", handler.install(), flush=True)
    if sys.argv[2] == "uninstall":
        handler.uninstall()
        print("default again", signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, flush=True)
    if sys.argv[2] == "fork":
        started, ready = os.pipe()
        child = os.fork()
        if child == 0:  # says it runs (a signal just after fork() is lost to Python's own reset of its flags)
            os.write(ready, b"D" if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL else b"H")
            time.sleep(60)
            os._exit(0)
        action = {b"D": "default", b"H": "handler"}[os.read(started, 1)]
        os.kill(child, signal.SIGTERM)
        print("child", os.waitpid(child, 0)[1], action, flush=True)
    print("ready", flush=True)
    while True:  # each line: the test's next step
        # Between short waits, as a training loop runs Python between steps: the kernel may give a SIGTERM sent
        # to the process to another thread (the handler's own), and a main thread blocked in a read of stdin
        # would then not run the handler until the next line came (a clean-clone run waited out 60 s so).
        if not select.select([sys.stdin], [], [], 0.05)[0]:
            continue
        line = sys.stdin.readline()
        if not line:
            break
        if line.strip() == "state":
            print("stays", handler.stays, flush=True)
        if line.strip() == "reinstall":  # hvd.init's handler gone, elastic.run's comes
            handler.uninstall()
            print("reinstalled", TermHandler(ask, 40.0, label="w1").install(), flush=True)
    time.sleep(60)
""")


class Worker:
    def __init__(self, answer: str, mode: str = "") -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", _PROGRAM, answer, mode], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []

    def read_until(self, prefix: str) -> str:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            if line.startswith(prefix):
                return line.rstrip("\n")
        raise AssertionError(f"no {prefix!r} line: {self.lines}; stderr: {self.proc.stderr.read()}")

    def ask(self, what: str) -> str:
        assert self.proc.stdin is not None
        self.proc.stdin.write(what + "\n")
        self.proc.stdin.flush()
        return self.read_until("stays")

    def answered(self, timeout_s: float = 20.0) -> str:
        """The handler's ``stays`` once the driver's answer is in: "asked" is printed inside ``ask``, before the
        handler's thread has stored what it returned."""
        import time

        deadline = time.monotonic() + timeout_s
        while (state := self.ask("state")) == "stays None" and time.monotonic() < deadline:
            time.sleep(0.05)
        return state

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


@pytest.fixture
def worker():
    started: list[Worker] = []

    def start(answer: str, mode: str = "") -> Worker:
        started.append(Worker(answer, mode))
        return started[-1]

    yield start
    for w in started:
        w.close()


def test_a_worker_the_driver_keeps_survives_the_first_sigterm_and_dies_of_the_second(worker):
    w = worker("stay")
    assert w.read_until("installed") == "installed True"
    w.read_until("ready")
    w.proc.send_signal(signal.SIGTERM)
    assert w.read_until("asked") == "asked 40"  # the deadline: CLOUD_ELASTIC_TERM_GRACE_S ahead
    assert w.answered() == "stays True"
    assert w.proc.poll() is None
    w.proc.send_signal(signal.SIGTERM)
    assert w.proc.wait(30) == -signal.SIGTERM
    assert "SIGTERM: leaving at the next commit" in w.proc.stderr.read()


@pytest.mark.parametrize("answer", ["exit", "raise"])
def test_a_worker_the_driver_does_not_keep_or_cannot_answer_dies_of_the_sigterm(worker, answer):
    w = worker(answer)
    w.read_until("ready")
    w.proc.send_signal(signal.SIGTERM)
    w.read_until("asked")
    assert w.proc.wait(30) == -signal.SIGTERM
    if answer == "raise":
        assert "could not report its SIGTERM to the driver: the driver cannot be reached" in w.proc.stderr.read()


def test_after_a_reported_sigterm_no_handler_is_installed_again_and_the_next_one_ends_the_worker(worker):
    # A SIGTERM while joining the first round (hvd.init), then elastic.run: the second TERM still ends it at once.
    w = worker("stay")
    w.read_until("ready")
    w.proc.send_signal(signal.SIGTERM)
    w.read_until("asked")
    assert w.answered() == "stays True"
    assert w.proc.stdin is not None
    w.proc.stdin.write("reinstall\n")
    w.proc.stdin.flush()
    assert w.read_until("reinstalled") == "reinstalled False"
    w.proc.send_signal(signal.SIGTERM)
    assert w.proc.wait(30) == -signal.SIGTERM
    assert " ".join(w.lines).count("asked") == 1


def test_a_script_that_handles_sigterm_keeps_its_handler(worker):
    w = worker("stay", "user-handler")
    assert w.read_until("installed") == "installed False"
    w.read_until("ready")
    w.proc.send_signal(signal.SIGTERM)
    w.read_until("the script's own handler")
    assert w.ask("state") == "stays None" and "asked" not in " ".join(w.lines)


def test_uninstall_gives_sigterm_its_default_action_back(worker):
    w = worker("stay", "uninstall")
    assert w.read_until("default again") == "default again True"
    w.read_until("ready")
    w.proc.send_signal(signal.SIGTERM)
    assert w.proc.wait(30) == -signal.SIGTERM and "asked" not in " ".join(w.lines)


def test_a_forked_child_dies_of_sigterm_as_by_default(worker):
    # The child has SIGTERM's default action from its start, not Python's handler: a SIGTERM that came between
    # the child's last check for signals and its sleep waited out the sleep (60 s; twice in 800 runs under load).
    w = worker("stay", "fork")
    assert w.read_until("child") == f"child {signal.SIGTERM} default"  # waitpid's status: killed by SIGTERM
    assert "asked" not in " ".join(w.lines)


def _own(p, worker: str) -> dict:
    return p.handle("notice", {"worker": worker, "source": "sigterm", "notice": "terminate",
                               "reason": f"SIGTERM to worker {worker}", "deadline": 2e9, "own": True})


def _to(job, worker: str, state: WorkerState) -> None:
    job.workers[worker].state = state


def test_the_driver_keeps_a_worker_of_a_round_and_drains_its_host() -> None:
    p, job, _, _ = plane()
    worker = sorted(job.workers)[0]
    _to(job, worker, WorkerState.RUNNING)
    assert _own(p, worker) == {"ok": True, "stay": True}
    (host, drain, source, soft, watcher), = job.notices
    assert (host, drain.deadline, source, soft, watcher) == ("127.0.0.1", 2e9, "sigterm", False, worker)


def test_the_driver_keeps_a_worker_on_its_way_to_its_first_round_and_drains_its_host() -> None:
    p, job, _, _ = plane()
    worker = sorted(job.workers)[0]
    assert job.workers[worker].state is WorkerState.CONNECTED  # registered, not yet at rendezvous
    assert _own(p, worker) == {"ok": True, "stay": True}
    (host, drain, source, soft, watcher), = job.notices
    assert (host, source, soft, watcher) == ("127.0.0.1", "sigterm", False, worker)


def test_the_driver_keeps_no_worker_it_stops_itself() -> None:
    p, job, _, _ = plane()
    first, second = sorted(job.workers)
    _to(job, first, WorkerState.EXITING)  # e.g. its host left discovery: the driver sent the TERM
    assert _own(p, first) == {"ok": True, "stay": False}
    assert not job.notices
    _to(job, second, WorkerState.RUNNING)
    job.end(False, "stopped by SIGTERM", 143)  # the job's end: the driver stops every worker
    assert _own(p, second) == {"ok": True, "stay": False}
    assert not job.notices
    assert p.handle("notice", {"worker": "stranger", "source": "sigterm", "notice": "terminate",
                               "reason": "x", "deadline": None, "own": True}) == {"ok": False}


def test_the_grace_comes_from_the_environment_and_a_bad_one_is_refused() -> None:
    from cloud_elastic.errors import ConfigError
    from cloud_elastic.worker.settings import WorkerSettings

    assert WorkerSettings.from_environ({}).term_grace_s == 30.0  # the kubelet's default grace period
    assert WorkerSettings.from_environ({"CLOUD_ELASTIC_TERM_GRACE_S": "120"}).term_grace_s == 120.0
    for bad in ("-1", "soon", "nan"):
        with pytest.raises(ConfigError, match="CLOUD_ELASTIC_TERM_GRACE_S"):
            WorkerSettings.from_environ({"CLOUD_ELASTIC_TERM_GRACE_S": bad})
