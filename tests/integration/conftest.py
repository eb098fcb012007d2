import pytest

from tests.integration import events_check
from tests.integration.harness import Job

_SEEN = pytest.StashKey[set]()


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


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """Record which event kinds (and fields) the test picks out of its events files (events_check.py)."""
    with events_check.recording() as seen:
        item.stash[_SEEN] = seen
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """An owner of event kinds (events_check.OWNERS) that passed without checking all of them fails."""
    report = yield
    if call.when == "call" and report.passed and hasattr(item, "originalname"):
        owner = events_check.owner_id(item.path, item.originalname)
        missing = events_check.unchecked(owner, item.stash.get(_SEEN, set()))
        if missing:
            report.outcome = "failed"
            report.longrepr = (f"{item.nodeid} passed without checking the event facets it owns "
                               f"(tests/integration/events_check.py OWNERS): {', '.join(missing)}")
    return report
