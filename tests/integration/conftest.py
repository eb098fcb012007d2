import pytest

# Owners of event kinds must check them (events_check.OWNERS): the hooks that record and enforce it.
from tests.integration.events_check import pytest_runtest_call, pytest_runtest_makereport  # noqa: F401
from tests.integration.harness import Job


@pytest.fixture
def jobs(tmp_path_factory):
    """Start jobs with ``jobs(args)``; every job still running at the end is killed with its workers.

    The test's drivers keep their records in a directory of the test's own (``XDG_RUNTIME_DIR``, unless the test
    passes one): a driver killed in one test (its record left behind, as a killed driver's is) is otherwise a dead
    driver of the same command to every later job of that command on the machine, which waits out its
    ``--driver-grace`` before starting (two clean clones side by side: a Kubernetes test waited 64 s for one)."""
    started: list[Job] = []
    run = tmp_path_factory.mktemp("run")

    def start(args: list[str], **kw) -> Job:
        kw["env"] = {"XDG_RUNTIME_DIR": str(run), **(kw.get("env") or {})}
        job = Job(args, **kw)
        started.append(job)
        return job

    yield start
    for job in started:
        if job.proc.poll() is None:
            # A job still running here usually means a hang the test's timeout cut short: its output (shown
            # with a failing test's report) is the only record of where it stood.
            print(f"--- output of a job still running at the end of the test: {' '.join(job.cmd[-6:])}")
            print(job.output()[-30000:])
            job.kill()



@pytest.fixture
def full_sync(monkeypatch):
    """Admissions by the whole state sync (``CLOUD_ELASTIC_FOLLOW=0``): a newcomer holds the state at its first entry.
    For the tests of that sync itself (its transfer from peers, kills inside it); follow-mode admission (the default,
    ``worker/commit/follow.py``), where a newcomer holds it a few commits later, has its own
    (``test_follow_admission.py``, ``test_follow_safety.py``)."""
    monkeypatch.setenv("CLOUD_ELASTIC_FOLLOW", "0")
