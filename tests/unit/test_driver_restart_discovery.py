"""A restarted driver's first discovery call that fails with an error the provider calls fatal.

A new job fails fast on it (a typo in a group name). A driver that resumes a job (its checkpoints) or adopts
its workers goes on with a job whose discovery answered before: the error is retried within
``--elastic-timeout`` with a WARNING. Found by review: AWS's NoCredentialsError, when the instance metadata
service timed out on a loaded VM during a driver restart, ended the job and lost everything since its last
durable checkpoint. A real Driver and checkpoint store, and a discovery provider of this test's own.
"""

from __future__ import annotations

import logging
import re
import time

import pytest

from cloud_elastic.config import JobConfig
from cloud_elastic.driver.restart.predecessor import open_store, plan_start
from cloud_elastic.driver.runtime.driver import Driver
from cloud_elastic.errors import FatalDiscoveryError, RetryableDiscoveryError
from cloud_elastic.providers.api import DiscoveredHosts, HostDiscovery

pytestmark = pytest.mark.timeout(60)

NO_CREDENTIALS = "NoCredentialsError: Unable to locate credentials"


class NoCredentialsOnce(HostDiscovery):
    """Its first call fails as boto3 does when the metadata service times out; its second stops the driver (a
    Ctrl-C then: the test needs no more of the job)."""

    name = "flaky"

    @classmethod
    def from_options(cls, *args, **kwargs) -> "NoCredentialsOnce":
        return cls()

    def __init__(self) -> None:
        self.finds = 0
        self.driver: Driver | None = None

    def find(self) -> DiscoveredHosts:
        self.finds += 1
        if self.finds == 1:
            raise FatalDiscoveryError(NO_CREDENTIALS)
        self.driver.stop("interrupted", 130)
        return DiscoveredHosts(ready={}, draining={})


def _run(tmp_path, monkeypatch, *, resumed: bool):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    config = JobConfig(command=("python", "train.py"), num_proc=1, min_np=1, max_np=1,
                       checkpoint_dir=str(tmp_path / "ckpt"), discovery_interval_s=0.1)
    if resumed:
        store = open_store(config)
        plan_start(config, store, job_id="j1")  # the job ran before, and wrote a checkpoint
        store.save(500, {"step": 500}, {"job_id": "j1"})
    discovery = NoCredentialsOnce()
    discovery.driver = Driver(config, discovery, job_id="j1")
    return discovery, discovery.driver.run()


def test_a_resumed_job_retries_a_fatal_first_discovery_error(tmp_path, monkeypatch, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="cloud_elastic")
    discovery, outcome = _run(tmp_path, monkeypatch, resumed=True)
    assert (outcome.exit_code, outcome.reason) == (130, "interrupted"), outcome  # not "host discovery failed"
    assert discovery.finds == 2
    warned = [r.getMessage() for r in caplog.records if NO_CREDENTIALS in r.getMessage()]
    assert len(warned) == 1 and "worked for this job's previous driver" in warned[0], warned


def test_a_new_job_still_fails_fast_on_a_fatal_first_discovery_error(tmp_path, monkeypatch) -> None:
    discovery, outcome = _run(tmp_path, monkeypatch, resumed=False)
    assert (outcome.exit_code, outcome.reason) == (1, f"host discovery failed: {NO_CREDENTIALS}")
    assert discovery.finds == 1


def test_a_driver_adopting_its_predecessors_workers_retries_a_fatal_first_discovery_error(tmp_path, monkeypatch,
                                                                                            caplog) -> None:
    from tests.unit.test_adoption_window import _predecessor

    caplog.set_level(logging.WARNING, logger="cloud_elastic")
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    ckpt = str(tmp_path / "ckpt")
    _predecessor(tmp_path, ckpt, "s" * 32)  # killed a moment ago: its worker may re-register
    config = JobConfig(command=("python", "train.py"), num_proc=1, min_np=1, max_np=1, checkpoint_dir=ckpt,
                       discovery_interval_s=0.1)
    discovery = NoCredentialsOnce()
    discovery.driver = Driver(config, discovery)
    outcome = discovery.driver.run()
    assert (outcome.exit_code, outcome.reason) == (130, "interrupted"), outcome
    assert discovery.finds == 2
    assert any("worked for this job's previous driver" in r.getMessage() for r in caplog.records)


def test_a_first_discovery_call_that_hangs_ends_a_new_job_at_its_start_timeout(tmp_path, monkeypatch) -> None:
    """Found by review: a cloud API trickling its answer held ``cloud-elastic run --start-timeout 10`` silent for
    minutes (an SDK's timeouts bound each socket read, not a request)."""
    import threading

    class Hanging(HostDiscovery):
        name = "hanging"

        @classmethod
        def from_options(cls, *args, **kwargs) -> "Hanging":
            return cls()

        def __init__(self) -> None:
            self.go = threading.Event()

        def find(self) -> DiscoveredHosts:
            self.go.wait(20)
            return DiscoveredHosts(ready={}, draining={})

    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    config = JobConfig(command=("python", "train.py"), num_proc=1, min_np=1, max_np=1, start_timeout_s=1.0,
                       discovery_interval_s=0.1)
    discovery = Hanging()
    started = time.monotonic()
    try:
        outcome = Driver(config, discovery, job_id="j1").run()
    finally:
        discovery.go.set()
    assert time.monotonic() - started < 10
    assert outcome.exit_code == 1 and re.match(
        r"host discovery kept failing for 1s \(--start-timeout\): the hanging provider gave no answer within "
        r"1\.\ds \(--discovery-timeout 30s\)", outcome.reason), outcome


@pytest.mark.parametrize("own_limit_s", [None, 10.0])
def test_a_start_timeout_that_cuts_a_retry_short_ends_the_job_on_the_real_failure(tmp_path, monkeypatch,
                                                                                   own_limit_s) -> None:
    """Seen in a loaded CI run: a script whose output was malformed failed, and the retry that --start-timeout
    cut short ended the job as "the script provider gave no answer within -0.1s", the script's own error lost.
    A provider that bounds its own calls longer than --discovery-timeout (a script given -o timeout_s) too."""
    import threading

    from cloud_elastic.errors import DiscoveryError

    class BadThenSlow(HostDiscovery):
        name = "badthenslow"

        @classmethod
        def from_options(cls, *args, **kwargs) -> "BadThenSlow":
            return cls()

        def __init__(self) -> None:
            self.finds, self.go = 0, threading.Event()

        def find(self) -> DiscoveredHosts:
            self.finds += 1
            if self.finds > 1:
                self.go.wait(20)  # slower than what is left of the start timeout
            raise DiscoveryError("line 1: slots must be >= 1")

        def find_limit_s(self, timeout_s: float) -> float:
            return own_limit_s or timeout_s

    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    start_s = 1.0 if own_limit_s is None else 3.0  # with its own limit: more left than --discovery-timeout
    config = JobConfig(command=("python", "train.py"), num_proc=1, min_np=1, max_np=1, start_timeout_s=start_s,
                       discovery_interval_s=0.1)
    discovery = BadThenSlow()
    try:
        outcome = Driver(config, discovery, job_id="j1", discovery_timeout_s=0.5 if own_limit_s else 30.0).run()
    finally:
        discovery.go.set()
    assert outcome.exit_code == 1 and outcome.reason == (
        f"host discovery kept failing for {start_s:g}s (--start-timeout): line 1: slots must be >= 1"), outcome


class AlwaysThrottled(HostDiscovery):
    name = "throttled"

    @classmethod
    def from_options(cls, *args, **kwargs) -> "AlwaysThrottled":
        return cls()

    def __init__(self) -> None:
        self.finds = 0

    def find(self) -> DiscoveredHosts:
        self.finds += 1
        raise RetryableDiscoveryError(f"Throttling: Rate exceeded (request {self.finds})")


def test_a_resumed_job_whose_discovery_keeps_failing_ends_at_its_elastic_timeout_not_a_back_off_later(
        tmp_path, monkeypatch) -> None:
    # The failing calls are spaced further apart each time (2 s, 4 s, ... up to 30 s): the job must still end at
    # --elastic-timeout, on the last real failure, not at the first call after it (here 6 s; up to 30 s late).
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    config = JobConfig(command=("python", "train.py"), num_proc=1, min_np=1, max_np=1,
                       checkpoint_dir=str(tmp_path / "ckpt"), discovery_interval_s=2.0, elastic_timeout_s=3.0)
    store = open_store(config)
    plan_start(config, store, job_id="j1")
    store.save(500, {"step": 500}, {"job_id": "j1"})
    discovery = AlwaysThrottled()
    started = time.monotonic()
    outcome = Driver(config, discovery, job_id="j1").run()
    took = time.monotonic() - started
    assert outcome.exit_code == 1 and re.match(
        r"host discovery kept failing for 3s \(--elastic-timeout\): Throttling: Rate exceeded \(request \d\)",
        outcome.reason), outcome
    assert 3.0 <= took < 5.5, took  # the next call after the limit would have come at 6 s
