"""A fallback group across a driver crash, over moto: what the sign of life beside the checkpoints carries
(the real :class:`~cloud_elastic.checkpoint.alive.AliveRefresher` and ``read_driver_alive``) and what the driver
restarted for the job then does to the group (``providers/multi.py``, ``driver/runtime/raised.py``)."""

from __future__ import annotations

import time

import pytest

from cloud_elastic.checkpoint import CheckpointStore
from cloud_elastic.checkpoint.alive import AliveRefresher, read_driver_alive
from cloud_elastic.driver.runtime import raised
from cloud_elastic.errors import RetryableDiscoveryError
from cloud_elastic.providers.api import DiscoveredHosts
from cloud_elastic.providers.multi import MultiSourceDiscovery
from cloud_elastic.providers.selection import build_discovery, parse_discovery_args
from cloud_elastic.providers.sources import SourceSpec
from tests.emulator.moto_env import clients, make_group, set_member
from tests.emulator.test_multi_source import desired
from tests.unit.test_fallback_groups import _job, _run
from tests.unit.test_providers_multi import Scripted

pytestmark = [pytest.mark.emulator, pytest.mark.timeout(120)]


def _sources(aws, spot: Scripted, sim, group: str) -> MultiSourceDiscovery:
    od = build_discovery(parse_discovery_args(["--aws-asg", group, "--aws-region", "us-east-1",
                                               "--aws-endpoint-url", aws.url]))
    return MultiSourceDiscovery([(SourceSpec("spot-a", "scripted", price=1.0), spot),
                                 (SourceSpec("od", "aws", price=4.0, fallback=True), od)], clock=lambda: sim.now)


@pytest.mark.parametrize("case", ["held-back", "skipped", "sent"])
def test_the_driver_restarted_after_a_crash_sets_back_only_a_group_its_predecessor_raised(aws, tmp_path, case):
    """Review of 4f7dc85: the sign of life carried every raise the job asked for, so the restarted driver took an
    operator's group (DesiredCapacity 3, booting) over and set it to 0, though the crashed driver had sent it no
    call (its raise held back while spot had not answered, or skipped, the group being larger already)."""
    group = f"rs-{case}"
    size = 0 if case == "sent" else 3  # the operator's group, or the job's own fallback at 0
    members = make_group(aws.url, group, size=size, instance_type="g4dn.xlarge",
                         cidr=f"10.92.{['held-back', 'skipped', 'sent'].index(case) + 1}.0/24")
    clients(aws.url)[0].update_auto_scaling_group(AutoScalingGroupName=group, MaxSize=10)
    for member in members:
        set_member(group, member["id"], lifecycle="Pending")  # booting: shown by no discovery yet
    store = CheckpointStore(str(tmp_path / "ckpt"))
    # Driver 1: one spot slot wanted and none shown (throttled, or answered empty): od raised to 1.
    sim = _job(1)
    first = RetryableDiscoveryError("Throttling") if case == "held-back" else DiscoveredHosts()
    multi = _sources(aws, Scripted(first), sim, group)
    refresher = AliveRefresher(store, "job", 60.0, interval_s=60.0).start()
    try:
        _run(sim, multi, 3)
        assert sim.job.capacity.sourcing.raised() == {"od": 1}  # what the job asked
        raised.remember(sim.job, refresher, {})
    finally:
        refresher.close(stopped=False)  # its last refresh, as a crash leaves it: not "stopped"
        multi.close()
    calls = aws.count("SetDesiredCapacity")
    assert calls == (1 if case == "sent" else 0) and desired(aws, group) == (1 if case == "sent" else 3)
    carried = dict(read_driver_alive(store, now=time.time()).raised)
    assert carried == ({"od": 1} if case == "sent" else {})
    # Driver 2, restarted for the job: spot answers with its host now; it takes over what the sign of life says.
    sim2 = _job(1)
    multi2 = _sources(aws, Scripted(DiscoveredHosts(ready={"a0": 1})), sim2, group)
    try:
        raised.inherit(sim2.job, carried)
        _run(sim2, multi2, 5)
    finally:
        multi2.close()
    if case == "sent":  # the job's own raise: set back to 0 once no longer needed
        assert desired(aws, group) == 0 and aws.count("SetDesiredCapacity") == calls + 1
    else:
        assert desired(aws, group) == 3, "the operator's 3 instances were ended by a job that never raised them"
        assert aws.count("SetDesiredCapacity") == 0


def test_a_driver_killed_right_after_its_raise_leaves_the_group_to_the_restarted_driver(aws, tmp_path, caplog):
    """Review rv3 of f17d157: the sign of life said a raise only at its next 5 s refresh, so a driver killed -9
    right after "desired capacity set to 1" left the group raised (paid) after the job ended: the restarted driver
    never logged "the previous driver raised". What a kill leaves is the entry on disk when that line is logged."""
    import logging

    group = "rs-killed"
    make_group(aws.url, group, size=0, instance_type="g4dn.xlarge", cidr="10.92.4.0/24")
    clients(aws.url)[0].update_auto_scaling_group(AutoScalingGroupName=group, MaxSize=10)
    store = CheckpointStore(str(tmp_path / "ckpt"))
    at_kill: list[dict] = []

    class KillAtLine(logging.Handler):
        def emit(self, record):
            if "desired capacity set to 1" in record.getMessage() and not at_kill:
                at_kill.append(dict(read_driver_alive(store, now=time.time()).raised))

    caplog.set_level(logging.INFO, logger="cloud_elastic")
    sim = _job(1)
    multi = _sources(aws, Scripted(DiscoveredHosts()), sim, group)
    refresher = AliveRefresher(store, "job", 60.0, interval_s=60.0)  # no refresh due while the test runs
    raised.remember(sim.job, refresher, {})
    refresher.start()
    raised.write_ahead(multi, refresher)  # as the driver wires it (driver.py, _keep_alive_beside_checkpoints)
    handler = KillAtLine()
    logging.getLogger("cloud_elastic.providers.multi").addHandler(handler)
    try:
        _run(sim, multi, 3)
    finally:
        logging.getLogger("cloud_elastic.providers.multi").removeHandler(handler)
        refresher.close(stopped=False)
        multi.close()
    assert desired(aws, group) == 1 and at_kill, "driver 1 raised the group"
    # Driver 2, restarted for the job from what the kill left on disk: spot gives its slot now.
    sim2 = _job(1)
    multi2 = _sources(aws, Scripted(DiscoveredHosts(ready={"a0": 1})), sim2, group)
    try:
        raised.inherit(sim2.job, at_kill[0])
        _run(sim2, multi2, 5)
    finally:
        multi2.close()
    assert "the previous driver raised host source 'od' to 1" in caplog.text
    assert desired(aws, group) == 0, "the group the killed driver raised stays raised (paid) after the job"
