"""A raise AWS refused, with real botocore over moto (``tests/emulator/moto_env.py``): what the AWS provider proves
of it (``AWSAutoScalingGroup.capacity_refused``: botocore's ``RetryAttempts`` 0 and a 4xx) and what the driver
restarted after a crash then does to the group (``providers/multi.py``, ``driver/runtime/raised.py``)."""

from __future__ import annotations

import threading
import time

import pytest

from cloud_elastic.checkpoint import CheckpointStore
from cloud_elastic.checkpoint.alive import AliveRefresher, read_driver_alive
from cloud_elastic.driver.runtime import raised
from cloud_elastic.errors import CapacityError
from cloud_elastic.providers.api import DiscoveredHosts
from cloud_elastic.providers.multi import MultiSourceDiscovery
from cloud_elastic.providers.sources import SourceSpec
from tests.emulator.fixtures import aws_options, provider
from tests.emulator.moto_env import clients, make_group, set_member
from tests.emulator.test_multi_source import desired
from tests.unit.test_fallback_groups import _job, _run
from tests.unit.test_providers_multi import Scripted

pytestmark = [pytest.mark.emulator, pytest.mark.timeout(60)]


def _error(code: str) -> bytes:
    return (f'<ErrorResponse xmlns="http://autoscaling.amazonaws.com/doc/2011-01-01/"><Error><Type>Sender</Type>'
            f'<Code>{code}</Code><Message>{code} (test)</Message></Error><RequestId>t</RequestId></ErrorResponse>'
            ).encode()


def _group(aws, name: str, size: int, cidr: str) -> None:
    members = make_group(aws.url, name, size=size, instance_type="g4dn.xlarge", cidr=cidr)
    clients(aws.url)[0].update_auto_scaling_group(AutoScalingGroupName=name, MaxSize=10)
    for member in members:
        set_member(name, member["id"], lifecycle="Pending")  # booting: shown by no discovery yet


CASES = ["refused-at-first-attempt", "throttled-every-attempt", "landed-then-throttled"]


@pytest.mark.parametrize("case", CASES)
def test_aws_proves_a_refusal_only_when_botocore_sent_the_call_once(aws, case):
    """rv9 review of 512da6c (botocore_landed_then_throttled.py): botocore retries SetDesiredCapacity, so a 4xx
    answer does not prove the call did not happen: its first attempt can land while its answer is lost to the read
    timeout, and the retry is throttled (400). Proven refused only when its one attempt was answered with a 4xx."""
    group = f"rf-{case}"
    _group(aws, group, 0, f"10.93.{CASES.index(case) + 1}.0/24")
    od = provider("aws", aws_options(aws, group, max_attempts="3", timeout_s="1"))
    if case == "refused-at-first-attempt":  # a 4xx botocore does not retry (MaxSize lowered meanwhile)
        aws.fail("SetDesiredCapacity", 1, 400, _error("ValidationError"))
    elif case == "throttled-every-attempt":
        aws.fail("SetDesiredCapacity", 3, 400, _error("Throttling"))
    else:
        once = threading.Lock()

        def slow_answer(body: bytes) -> bytes:  # moto applied it; its answer comes after the client's read timeout
            if once.acquire(blocking=False):
                aws.fail("SetDesiredCapacity", 2, 400, _error("Throttling"))  # botocore's retries
                time.sleep(2.5)
            return body

        aws.rewrite("SetDesiredCapacity", slow_answer)
    with pytest.raises(CapacityError) as refused:
        od.set_capacity(1)
    retries = refused.value.__cause__.response["ResponseMetadata"]["RetryAttempts"]
    assert (retries, aws.count("SetDesiredCapacity")) == ((0, 1) if case == "refused-at-first-attempt" else (2, 3))
    assert od.capacity_refused(refused.value) is (case == "refused-at-first-attempt")
    assert desired(aws, group) == (1 if case == "landed-then-throttled" else 0)
    od.close()


def test_a_driver_restarted_after_a_raise_aws_refused_leaves_the_operators_group_alone(aws, tmp_path):
    """rv6 f5_refused_restart: a raise of an operator's group (at 1) that AWS refused at its only attempt stayed in
    the sign of life, and the driver restarted after a crash set the group to 0 at the job's end, ending the
    operator's instance. Proven refused, it is not carried: the restarted driver leaves the group as it is."""
    group = "rf-restart"
    _group(aws, group, 1, "10.93.9.0/24")
    aws.fail("SetDesiredCapacity", 100, 400, _error("ValidationError"))
    store = CheckpointStore(str(tmp_path / "ckpt"))

    def sources(sim, spot: Scripted) -> MultiSourceDiscovery:
        od = provider("aws", aws_options(aws, group, max_attempts="3", timeout_s="2"))
        return MultiSourceDiscovery([(SourceSpec("spot-a", "scripted", price=1.0), spot),
                                     (SourceSpec("od", "aws", price=4.0, fallback=True), od)], clock=lambda: sim.now)

    # Driver 1: three slots wanted, one spot host: od asked for 2, each call refused at its only attempt.
    sim = _job(3)
    multi = sources(sim, Scripted(DiscoveredHosts(ready={"a0": 1})))
    refresher = AliveRefresher(store, "job", 60.0, interval_s=60.0).start()
    raised.write_ahead(multi, refresher)  # as the driver wires it
    try:
        for _ in range(3):
            _run(sim, multi, 1)
            raised.remember(sim.job, refresher, {})  # the driver's tick
        assert sim.job.capacity.sourcing.raised() == {"od": 2}  # what the job asked
    finally:
        refresher.close(stopped=False)  # its last refresh, as a crash leaves it
        multi.close()
    calls = aws.count("SetDesiredCapacity")
    assert calls >= 2 and desired(aws, group) == 1
    carried = dict(read_driver_alive(store, now=time.time()).raised)
    assert carried == {}, "a raise AWS refused at its only attempt is carried to the restarted driver"
    # Driver 2, restarted for the job; the job ends.
    sim2 = _job(3)
    multi2 = sources(sim2, Scripted(DiscoveredHosts(ready={"a0": 1, "a1": 1, "a2": 1})))
    try:
        raised.inherit(sim2.job, carried)
        _run(sim2, multi2, 2)
        raised.lower(sim2.job, multi2, threading.Condition(), None, pause_s=0)
    finally:
        multi2.close()
    assert desired(aws, group) == 1, "the operator's instance was ended by a job whose raise AWS refused"
    assert aws.count("SetDesiredCapacity") == calls
