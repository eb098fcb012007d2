"""The driver's rooms on their own: the control-plane handlers (driver/runtime/control_plane.py) and the durable
record of a restarted job (driver/restart/predecessor.py), on a Driver that was never started."""

from __future__ import annotations

import subprocess
import sys

import pytest

from cloud_elastic.config import JobConfig
from cloud_elastic.driver.runtime.driver import Driver
from cloud_elastic.driver.runtime.control_plane import POLLS_PER_S, watch_cloud
from cloud_elastic.driver.restart.predecessor import driver_alive
from cloud_elastic.errors import ControlPlaneError
from cloud_elastic.providers.api import DiscoveredHosts
from cloud_elastic.providers.static import StaticHosts

pytestmark = pytest.mark.timeout(60)


def driver(tmp_path=None, **config) -> Driver:
    base = dict(command=("python", "train.py"), num_proc=2, min_np=1, max_np=2)
    d = Driver(JobConfig(**(base | config)), StaticHosts({"127.0.0.1": 2}), job_id="j1", clock=lambda: 1000.0)
    with d._cond:
        d._job.start(1000.0)
        d._job.discovered(DiscoveredHosts(ready={"127.0.0.1": 2}), 1000.0)
    return d


def test_an_unknown_kind_or_a_message_without_a_worker_is_refused() -> None:
    d = driver()
    with pytest.raises(ControlPlaneError, match="unknown message kind 'nope'"):
        d._handle("nope", {"worker": "x"})
    with pytest.raises(ControlPlaneError, match="lacks a worker id"):
        d._handle("register", {})


def test_register_knows_only_the_jobs_workers_and_names_the_hosts_notice_watcher() -> None:
    d = driver(notice_watcher="aws")
    first, second = sorted(d._job.workers)
    assert d._handle("register", {"worker": "stranger"})["ok"] is False
    reply = d._handle("register", {"worker": first})
    assert reply["ok"] is True and reply["notice_watcher"] == "aws"  # the first live worker of its host
    assert d._handle("register", {"worker": second})["notice_watcher"] is None


def test_a_malformed_notice_is_refused_and_a_good_one_drains_the_host() -> None:
    d = driver()
    worker = sorted(d._job.workers)[0]
    with pytest.raises(ControlPlaneError, match="malformed notice"):
        d._handle("notice", {"worker": worker, "source": "aws", "notice": "meteor", "reason": "x", "deadline": None})
    reply = d._handle("notice", {"worker": worker, "source": "aws", "notice": "terminate",
                                 "reason": "spot interruption", "deadline": None})
    assert reply == {"ok": True} and "127.0.0.1" in d._job.hosts.draining


def test_a_checkpoint_rank_0_cannot_load_stops_the_job_and_a_malformed_report_is_refused() -> None:
    d = driver()
    worker = sorted(d._job.workers)[0]
    with pytest.raises(ControlPlaneError, match="malformed checkpoint"):
        d._handle("checkpoint", {"worker": worker, "event": "saved", "step": "7", "path": "p"})
    assert d._handle("checkpoint", {"worker": worker, "event": "failed", "reason": "torn file"}) == {"ok": True}
    assert d._stop_reason == ("training state lost: cannot resume from the checkpoint: torn file", 1)


def test_heartbeats_are_held_longer_only_in_a_very_large_group() -> None:
    d = driver(heartbeat_interval_s=0.5, heartbeat_timeout_s=60.0)
    assert d._poll_hold_s() == 0.5
    d._job._alive_count = 8000
    assert d._poll_hold_s() == 8000 / POLLS_PER_S
    d._job._alive_count = 10**6
    assert d._poll_hold_s() == 15.0  # never more than a quarter of the heartbeat timeout


def test_the_notice_watcher_follows_the_provider_unless_told() -> None:
    assert watch_cloud("auto", "aws") == "aws" and watch_cloud("auto", "static") is None
    assert watch_cloud("none", "aws") is None and watch_cloud("gcp", "static") == "gcp"


def test_a_new_checkpoint_dir_records_the_job_and_a_second_driver_takes_its_identity(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    ckpt = str(tmp_path / "ckpt")
    first = driver(checkpoint_dir=ckpt)
    first._open_durable()
    assert not first._job.resumed  # no checkpoint yet: training starts from the beginning
    second = Driver(JobConfig(command=("python", "train.py"), num_proc=2, min_np=1, max_np=2, checkpoint_dir=ckpt),
                    StaticHosts({"127.0.0.1": 2}), job_id="other")
    second._open_durable()
    assert second.job_id == "j1" and second._job.job_id == "j1"


def test_a_dead_pid_is_no_live_driver() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert not driver_alive(proc.pid)
