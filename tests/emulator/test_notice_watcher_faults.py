"""The metadata watchers against fakes that answer badly in ways that once blinded them.

Each test scripts one bad answer (a garbled token, a too-deep JSON body, a date
that overflows, a long-poll that never returns) next to a real notice, and
checks that the notice still reaches the report callback, as a worker's driver
would get it. Waits are bounded; nothing is a timed assertion.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from email.utils import formatdate

import pytest

from cloud_elastic.notices import (
    MAINTENANCE,
    TERMINATE,
    AWSMetadataWatcher,
    AzureScheduledEventsWatcher,
    GCPMetadataWatcher,
)
from tests.emulator.fake_metadata import FakeAWSMetadata, FakeAzureMetadata, FakeGCPMetadata, Req, Resp
from tests.emulator.test_notice_watchers import FAST, Sink, more_polls, run  # noqa: F401 - run: a fixture

pytestmark = [pytest.mark.emulator, pytest.mark.timeout(60)]

BOUND = 15.0  # seconds a notice may take here; before these fixes it never came at all




# ------------------------------------------------------------------------------ AWS


@pytest.mark.parametrize("token", [b"<html>\nproxy hiccup\n</html>", b"cut\rshort", "snow\u2603man".encode()],
                         ids=["html-page", "carriage-return", "not-latin-1"])
def test_aws_a_garbled_token_answer_does_not_blind_the_watcher_until_the_tokens_renewal(run, token):
    """A proxy's HTML page as the token answer was kept as the token for its 6 h TTL; every read then failed
    before it reached the service (an invalid header value), neither as a 401 nor as a bad answer."""
    with FakeAWSMetadata() as fake:
        fake.fault("/latest/api/token", 1, status=200, body=token)
        sink = run(AWSMetadataWatcher(fake.url, **FAST))
        assert fake.wait_for(lambda: fake.count("/latest/api/token", "PUT") >= 1, BOUND)
        when = int(time.time()) + 120
        fake.set_spot_action("terminate", when)
        [notice] = sink.wait(timeout=BOUND)
        assert (notice.kind, notice.deadline) == (TERMINATE, when)
        assert fake.count("/latest/api/token", "PUT") >= 2  # the bad one was not kept


def test_aws_a_garbled_token_at_a_renewal_costs_one_cycle_not_the_tokens_lifetime(run):
    """A watcher that has been reading fine renews its token (expired: a 401) and gets a proxy's HTML page."""
    with FakeAWSMetadata() as fake:
        watcher = AWSMetadataWatcher(fake.url, poll_interval_s=0.05, request_timeout_s=0.5)  # 10 s "unreachable"
        sink = run(watcher)
        more_polls(fake, "/latest/meta-data/spot/instance-action", 3)
        fake.fault("/latest/api/token", 1, status=200, body=b"<html>\nproxy hiccup\n</html>")
        fake.expire_tokens()
        assert fake.wait_for(lambda: fake.count("/latest/api/token", "PUT") >= 2, BOUND)
        fake.set_spot_action("terminate")
        assert [n.kind for n in sink.wait(timeout=BOUND)] == [TERMINATE]


def test_aws_too_deep_json_on_one_path_does_not_hide_a_notice_on_another(run, caplog):
    caplog.set_level("WARNING", logger="cloud_elastic.notices")
    with FakeAWSMetadata() as fake:
        fake.set_lifecycle_state("Terminated")
        fake.set_raw_spot_action(b"[" * 200_000)  # under MAX_BODY, too deep for the parser
        sink = run(AWSMetadataWatcher(fake.url, **FAST))
        [notice] = sink.wait(timeout=BOUND)
        assert (notice.kind, notice.event_id) == (TERMINATE, "aws-lifecycle:Terminated")
    messages = [r.getMessage() for r in caplog.records]
    assert any("spot/instance-action: not JSON" in m for m in messages), messages
    assert not any("RecursionError" in m for m in messages), messages


# ------------------------------------------------------------------------------ GCP


class NoLongPoll(FakeGCPMetadata):
    """A metadata proxy that answers plain reads but holds ``wait_for_change`` requests without answering."""

    def handle(self, req: Req) -> Resp:
        if req.query.get("wait_for_change") == "true":
            self._stopping.wait(30)
            return Resp(504)
        return super().handle(req)


def test_gcp_long_polls_that_stall_fall_back_to_plain_reads_and_maintenance_is_still_read(run):
    with NoLongPoll() as fake:
        sink = run(GCPMetadataWatcher(fake.url, long_poll_s=1, poll_interval_s=0.05, request_timeout_s=0.5))
        assert fake.wait_for(lambda: fake.count("preempted") >= 2, BOUND)  # the first long-poll is under way
        fake.set_preempted(True)
        fake.set_maintenance_event("TERMINATE_ON_HOST_MAINTENANCE")
        notices = sink.wait(2, timeout=BOUND)
        assert {n.event_id for n in notices} == {"gcp-preempted", "gcp-maintenance:TERMINATE_ON_HOST_MAINTENANCE"}


def test_gcp_after_a_failed_long_poll_the_watcher_keeps_polling_plainly(run):
    """One stalled long-poll costs at most its own time: later reads do not stall again and again."""
    with NoLongPoll() as fake:
        sink = run(GCPMetadataWatcher(fake.url, long_poll_s=1, poll_interval_s=0.05, request_timeout_s=0.5))
        assert fake.wait_for(lambda: fake.count("maintenance-event") >= 3, BOUND)
        plain = fake.count("preempted")
        more_polls(fake, "maintenance-event", 20)  # 20 cycles: 30 s if each one waited out a long-poll
        assert fake.count("preempted") >= plain + 20
        fake.set_maintenance_event("MIGRATE_ON_HOST_MAINTENANCE")
        assert [n.kind for n in sink.wait(timeout=BOUND)] == [MAINTENANCE]


# ---------------------------------------------------------------------------- Azure


def test_azure_a_notbefore_that_overflows_does_not_hide_the_other_events(run, caplog):
    caplog.set_level("WARNING", logger="cloud_elastic.notices")
    with FakeAzureMetadata(vm_name="workers_3") as fake:
        fake.add_event("Freeze", event_id="BAD-1", NotBefore="Mon, 19 Sep 99999999999999999999 18:29:47 GMT")
        when = int(time.time()) + 30
        good = fake.add_event("Preempt", not_before=when)
        sink = run(AzureScheduledEventsWatcher(fake.url, **FAST))
        [notice] = sink.wait(timeout=BOUND)
        assert (notice.event_id, notice.kind, notice.deadline) == (good, TERMINATE, when)
    assert any("event BAD-1: unreadable NotBefore" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("zone", ["-0000", ""], ids=["minus-zero", "none"])
def test_azure_a_notbefore_without_a_zone_is_utc_not_the_hosts_local_time(run, monkeypatch, zone):
    monkeypatch.setenv("TZ", "XXX+08")  # eight hours behind UTC, whatever this machine's zone
    time.tzset()
    try:
        with FakeAzureMetadata(vm_name="workers_3") as fake:
            when = int(time.time()) + 60
            stamp = formatdate(when, usegmt=True).replace(" GMT", f" {zone}".rstrip())
            event_id = fake.add_event("Preempt", NotBefore=stamp)
            sink = run(AzureScheduledEventsWatcher(fake.url, **FAST))
            [notice] = sink.wait(timeout=BOUND)
            assert (notice.event_id, notice.deadline) == (event_id, when)
    finally:
        monkeypatch.undo()
        time.tzset()


def test_azure_by_hand_with_acknowledge_acknowledges_the_terminate_event():
    """``python -m cloud_elastic.notices azure --acknowledge`` printed the event and never acknowledged it."""
    with FakeAzureMetadata() as fake:
        event_id = fake.add_event("Preempt", not_before=time.time() + 60)
        fake.add_event("Freeze", event_id="FREEZE-1")  # soft: not acknowledged
        result = subprocess.run([sys.executable, "-m", "cloud_elastic.notices", "azure", "--acknowledge", "--for", "3"],
                                capture_output=True, text=True, timeout=30,
                                env={**os.environ, "CLOUD_ELASTIC_AZURE_IMDS_ENDPOINT": fake.url})
        assert result.returncode == 0, result.stderr
        assert {json.loads(line)["event_id"] for line in result.stdout.splitlines()} == {event_id, "FREEZE-1"}
        assert fake.acks == [event_id], result.stderr
        assert f"acknowledged Azure scheduled events {event_id}" in result.stderr
