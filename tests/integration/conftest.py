import pytest

# Owners of event kinds must check them (events_check.OWNERS): the hooks that record and enforce it.
from tests.integration.events_check import pytest_runtest_call, pytest_runtest_makereport  # noqa: F401
from tests.integration.harness import Job


@pytest.fixture
def jobs():
    """Start jobs with ``jobs(args)``; every job still running at the end is killed with its workers."""
    started: list[Job] = []

    def start(args: list[str], **kw) -> Job:
        job = Job(args, **kw)
        started.append(job)
        return job

    yield start
    for job in started:
        if job.proc.poll() is None:
            job.kill()

