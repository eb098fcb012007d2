"""The three metadata notice watchers against fake metadata services over real HTTP.

Each test starts a watcher on its daemon thread against a fake from
fake_metadata.py, changes the fake, and waits (with a generous bound, never
a timed assertion) for what the watcher reports. "Nothing reported" is
checked after the fake has served enough further polls that a notice would
have been seen.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator

import pytest

from cloud_elastic.driver.job.notice_policy import notice_action
from cloud_elastic.driver.job.workers import WorkerState
from cloud_elastic.notices import (
    MAINTENANCE,
    REBALANCE,
    TERMINATE,
    AWSMetadataWatcher,
    AzureScheduledEventsWatcher,
    GCPMetadataWatcher,
    Notice,
    NoticeWatcher,
    watcher_for,
)
from tests.emulator.fake_metadata import (
    FakeAWSMetadata,
    FakeAzureMetadata,
    FakeGCPMetadata,
    aws_time,
    per_host,
)

pytestmark = [pytest.mark.emulator, pytest.mark.timeout(60)]

FAST = dict(poll_interval_s=0.05, request_timeout_s=0.5, unreachable_retry_s=0.2)
SPOT = "/latest/meta-data/spot/instance-action"
REBALANCE_PATH = "/latest/meta-data/events/recommendations/rebalance"
LIFECYCLE = "/latest/meta-data/autoscaling/target-lifecycle-state"
EVENTS = "/metadata/scheduledevents"
BOUND = 20.0  # seconds any expected event may take on a loaded 2-core machine


class Sink:
    """The report callback: records notices and lets a test wait for them."""

    def __init__(self) -> None:
        self.notices: list[Notice] = []
        self._cond = threading.Condition()

    def __call__(self, notice: Notice) -> None:
        with self._cond:
            self.notices.append(notice)
            self._cond.notify_all()

    def wait(self, count: int = 1, timeout: float = BOUND) -> list[Notice]:
        with self._cond:
            assert self._cond.wait_for(lambda: len(self.notices) >= count, timeout), (
                f"waited for {count} notice(s), got {self.notices}")
            return list(self.notices)


@pytest.fixture
def run() -> Iterator:
    """``run(watcher)`` starts it with a fresh Sink; every watcher is closed at the end."""
    started: list[NoticeWatcher] = []

    def start(watcher: NoticeWatcher) -> Sink:
        sink = Sink()
        watcher.start(sink)
        started.append(watcher)
        return sink

    yield start
    for watcher in started:
        watcher.close()


def more_polls(fake, path: str, n: int = 5) -> None:
    """Wait until ``path`` has been asked ``n`` more times: the watcher has looked again since now."""
    target = fake.count(path) + n
    assert fake.wait_for(lambda: fake.count(path) >= target, BOUND), f"the watcher stopped polling {path}"


def watcher_alive(watcher) -> bool:
    return any(t.name == f"notice-watcher-{watcher.source}" and t.is_alive() for t in threading.enumerate())


# ------------------------------------------------------------------------------ AWS


@pytest.fixture
def aws_fake() -> Iterator[FakeAWSMetadata]:
    with FakeAWSMetadata() as fake:
        yield fake


def test_aws_spot_notice_is_reported_once_with_its_deadline(aws_fake, run):
    sink = run(AWSMetadataWatcher(aws_fake.url, **FAST))
    more_polls(aws_fake, SPOT)
    assert sink.notices == []
    when = int(time.time()) + 120
    aws_fake.set_spot_action("terminate", when)
    [notice] = sink.wait()
    assert (notice.source, notice.kind, notice.deadline) == ("aws-imds", TERMINATE, when)
    assert aws_time(when) in notice.reason
    more_polls(aws_fake, SPOT)
    assert sink.notices == [notice]  # still there on every poll, reported once


def test_aws_stop_and_hibernate_are_terminations_too(aws_fake, run):
    sink = run(AWSMetadataWatcher(aws_fake.url, **FAST))
    aws_fake.set_spot_action("hibernate", time.time() + 60)
    assert [n.kind for n in sink.wait()] == [TERMINATE]


def test_aws_rebalance_is_soft_and_lifecycle_terminated_is_hard(aws_fake, run):
    sink = run(AWSMetadataWatcher(aws_fake.url, **FAST))
    aws_fake.set_lifecycle_state("InService")
    more_polls(aws_fake, LIFECYCLE)
    assert sink.notices == []
    aws_fake.set_rebalance()
    [rebalance] = sink.wait(1)
    assert (rebalance.kind, rebalance.deadline, rebalance.soft) == (REBALANCE, None, True)
    aws_fake.set_lifecycle_state("Terminated")
    [_, lifecycle] = sink.wait(2)
    assert (lifecycle.kind, lifecycle.deadline, lifecycle.soft) == (TERMINATE, None, False)


def test_aws_reads_need_the_token_and_an_expired_token_is_renewed(aws_fake, run):
    sink = run(AWSMetadataWatcher(aws_fake.url, **FAST))
    more_polls(aws_fake, SPOT)
    assert aws_fake.count("/latest/api/token", "PUT") == 1  # one token serves many reads
    aws_fake.expire_tokens()
    more_polls(aws_fake, SPOT)
    assert aws_fake.count("/latest/api/token", "PUT") == 2
    aws_fake.set_spot_action()
    assert sink.wait()[0].kind == TERMINATE


def test_aws_token_is_renewed_before_its_ttl_runs_out(aws_fake, run):
    run(AWSMetadataWatcher(aws_fake.url, token_ttl_s=1, **FAST))
    # A 1 s token renewed at 80% of its life: several PUTs while polling, and
    # no read ever answered 401 (the fake would count a refused read).
    assert aws_fake.wait_for(lambda: aws_fake.count("/latest/api/token", "PUT") >= 3, BOUND)


def test_aws_malformed_answers_are_ignored_and_the_watcher_keeps_going(aws_fake, run, caplog):
    caplog.set_level(logging.WARNING, logger="cloud_elastic.notices")
    watcher = AWSMetadataWatcher(aws_fake.url, **FAST)
    aws_fake.fault(REBALANCE_PATH, times=6, status=500)
    aws_fake.fault(LIFECYCLE, times=2, hang_s=3)
    aws_fake.set_raw_spot_action(b"{not json")
    sink = run(watcher)
    more_polls(aws_fake, SPOT, 8)
    aws_fake.set_raw_spot_action(json.dumps({"action": "terminate", "time": "yesterday"}).encode())
    more_polls(aws_fake, SPOT, 3)
    assert sink.notices == [] and watcher_alive(watcher)
    messages = [r.getMessage() for r in caplog.records]
    assert sum("HTTP 500" in m for m in messages) == 1, messages  # six 500s, one line
    assert sum("not JSON" in m for m in messages) == 1, messages
    assert any("no answer within" in m for m in messages), messages
    assert any("unreadable time 'yesterday'" in m for m in messages), messages
    aws_fake.set_spot_action("terminate", time.time() + 100)
    assert sink.wait()[0].kind == TERMINATE


def test_aws_spot_action_it_does_not_know_still_drains_the_host_and_says_so(aws_fake, run, caplog):
    # The path answers only while EC2 is about to take the instance: a new action name must not hide that.
    caplog.set_level(logging.WARNING, logger="cloud_elastic.notices")
    when = time.time() + 90
    aws_fake.set_raw_spot_action(json.dumps({"action": "explode", "time": aws_time(when)}).encode())
    sink = run(AWSMetadataWatcher(aws_fake.url, **FAST))
    [notice] = sink.wait()
    assert notice.kind == TERMINATE and abs(notice.deadline - when) < 1  # the notice's time is in whole seconds
    assert "unknown action 'explode'" in notice.reason
    more_polls(aws_fake, SPOT, 5)
    assert len(sink.notices) == 1
    assert sum("unknown action 'explode'" in r.getMessage() for r in caplog.records) == 1


def test_aws_spot_notice_whose_time_moves_at_every_read_is_reported_once(aws_fake, run):
    sink = run(AWSMetadataWatcher(aws_fake.url, **FAST))
    first = time.time() + 120
    for step in range(6):
        aws_fake.set_spot_action("terminate", first + step)
        more_polls(aws_fake, SPOT, 2)
    aws_fake.set_rebalance(time.time())
    more_polls(aws_fake, REBALANCE_PATH, 2)
    aws_fake.set_rebalance(time.time() + 5)
    more_polls(aws_fake, REBALANCE_PATH, 3)
    assert [n.kind for n in sink.notices] == [TERMINATE, REBALANCE]
    assert abs(sink.notices[0].deadline - first) < 1 and sink.notices[1].deadline is None  # the first time, in seconds


def test_aws_unreachable_service_is_logged_once_and_retried_slowly(run, caplog):
    caplog.set_level(logging.DEBUG, logger="cloud_elastic.notices")
    with FakeAWSMetadata() as fake:
        url = fake.url
    watcher = AWSMetadataWatcher(url, **FAST)  # nothing listens there any more
    sink = run(watcher)
    deadline = time.monotonic() + BOUND
    while sum("still unreachable" in r.getMessage() for r in caplog.records) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    infos = [r for r in caplog.records if r.levelno == logging.INFO and "no usable aws-imds metadata service" in r.getMessage()]
    assert len(infos) == 1 and watcher_alive(watcher)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert sink.notices == []


def test_aws_report_callback_failure_does_not_stop_the_watcher_and_is_tried_again(aws_fake):
    calls: list[Notice] = []

    def report(notice: Notice) -> None:
        calls.append(notice)
        raise RuntimeError("driver unreachable")

    watcher = AWSMetadataWatcher(aws_fake.url, **FAST)
    watcher.start(report)
    try:
        aws_fake.set_rebalance()
        assert aws_fake.wait_for(lambda: len(calls) >= 2, BOUND)  # not lost: reported again at its next sighting
        aws_fake.set_spot_action()
        assert aws_fake.wait_for(lambda: TERMINATE in {n.kind for n in calls}, BOUND)
        assert {n.kind for n in calls} == {REBALANCE, TERMINATE}
        assert watcher.reported == ()  # none went through
    finally:
        watcher.close()
    assert not watcher_alive(watcher)


def test_an_answer_that_trickles_in_does_not_hold_up_a_notice(run):
    """Each read gets its byte before the timeout, but the request as a whole does not: it is cut off."""

    class Trickle(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def _send(self, code: int, body: bytes = b"") -> None:
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_PUT(self) -> None:
            self._send(200, b"token")

        def do_GET(self) -> None:
            if self.path == SPOT:
                return self._send(200, json.dumps({"action": "terminate", "time": aws_time(time.time() + 120)}).encode())
            if self.path != REBALANCE_PATH:
                return self._send(404)
            self.send_response(200)
            self.send_header("Content-Length", "600")
            self.end_headers()
            try:
                for _ in range(600):
                    self.wfile.write(b" ")
                    self.wfile.flush()
                    time.sleep(0.2)
            except OSError:
                pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Trickle)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        # The spot notice is read first; the trickling rebalance answer comes next, in every cycle. A notice
        # (the spot one again, once its first report failed) must still come through, cycle after cycle.
        failed = []

        def report(notice: Notice) -> None:
            if not failed:
                failed.append(notice)
                raise OSError("the driver was busy")
            sink(notice)

        sink = Sink()
        watcher = AWSMetadataWatcher(f"http://127.0.0.1:{server.server_port}", **FAST)
        watcher.start(report)
        try:
            assert [n.kind for n in sink.wait()] == [TERMINATE]
        finally:
            watcher.close()
    finally:
        server.shutdown()
        server.server_close()


def test_host_placeholder_points_each_loopback_host_at_its_own_fake(run):
    hosts = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
    with per_host(FakeAWSMetadata, hosts) as fakes:
        port = fakes[hosts[0]].port
        assert {f.port for f in fakes.values()} == {port}
        env = {"AWS_EC2_METADATA_SERVICE_ENDPOINT": f"http://{{host}}:{port}"}
        sinks = {h: run(watcher_for("aws", h, env, **FAST)) for h in hosts}
        fakes["127.0.0.3"].set_spot_action("terminate", time.time() + 90)
        sinks["127.0.0.3"].wait()
        for host in ("127.0.0.2", "127.0.0.4"):
            more_polls(fakes[host], SPOT)
            assert sinks[host].notices == [], host
        assert [n.kind for n in sinks["127.0.0.3"].notices] == [TERMINATE]


# ------------------------------------------------------------------------------ GCP


@pytest.fixture
def gcp_fake() -> Iterator[FakeGCPMetadata]:
    with FakeGCPMetadata() as fake:
        yield fake


def test_gcp_long_poll_wakes_on_preemption(gcp_fake, run):
    # A long-poll of 60 s against a 20 s wait: the notice can only come from
    # the server answering the blocked request when the value changed.
    sink = run(GCPMetadataWatcher(gcp_fake.url, long_poll_s=60, **FAST))
    assert gcp_fake.wait_for(lambda: gcp_fake.waiting == 1, BOUND)
    polls = gcp_fake.count("preempted")
    before = time.time()
    gcp_fake.set_preempted()
    [notice] = sink.wait()
    after = time.time()
    assert (notice.source, notice.kind) == ("gcp-metadata", TERMINATE)
    assert before + 30 <= notice.deadline <= after + 30
    # Answered by the request that was waiting (at most the next long-poll has started since).
    assert gcp_fake.count("preempted") <= polls + 1
    assert gcp_fake.wait_for(lambda: gcp_fake.waiting == 1, BOUND)  # long-polling again
    assert sink.notices == [notice]


def test_gcp_preemption_already_true_at_start_is_reported(gcp_fake, run):
    gcp_fake.set_preempted()
    sink = run(GCPMetadataWatcher(gcp_fake.url, **FAST))
    assert [n.kind for n in sink.wait()] == [TERMINATE]


def test_gcp_maintenance_event_is_soft_and_a_later_one_is_new(gcp_fake, run):
    sink = run(GCPMetadataWatcher(gcp_fake.url, long_poll_s=1, **FAST))
    gcp_fake.set_maintenance_event("MIGRATE_ON_HOST_MAINTENANCE")
    [first] = sink.wait()
    assert (first.kind, first.soft, first.deadline) == (MAINTENANCE, True, None)
    assert "MIGRATE_ON_HOST_MAINTENANCE" in first.reason
    gcp_fake.set_maintenance_event("NONE")
    more_polls(gcp_fake, "maintenance-event", 2)
    gcp_fake.set_maintenance_event("MIGRATE_ON_HOST_MAINTENANCE")
    assert [n.kind for n in sink.wait(2)] == [MAINTENANCE, MAINTENANCE]


UPCOMING = "instance/upcoming-maintenance"


def rfc3339(when: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when))


@pytest.mark.parametrize("upcoming", [
    None,  # no such key: 404
    "{ }",
    "NONE",
    '{ "error": "no notifications have been received yet, try again later" }',
    '{"maintenance_status": "ONGOING", "window_start_time": "2024-12-01T19:00:01Z"}',  # open: when is not said
    '{"window_start_time": "soon"}',
    "[" * 5000,
], ids=["absent", "empty", "none", "error", "past", "garbled", "deep"])
def test_gcp_terminate_on_host_maintenance_drains_the_host_with_no_made_up_deadline(gcp_fake, run, upcoming):
    """GCE stops the VM (from 60 s to an hour later): a hard notice, whose workers leave at their next commit.

    No deadline is made up: one (60 s after it was seen) had the driver remove a GPU VM's workers by force
    and roll back the steps since their last commit, with most of the hour still to go.
    """
    if upcoming is not None:
        gcp_fake.set_value(UPCOMING, upcoming)
    sink = run(GCPMetadataWatcher(gcp_fake.url, long_poll_s=1, **FAST))
    gcp_fake.set_maintenance_event("TERMINATE_ON_HOST_MAINTENANCE")
    [notice] = sink.wait()
    assert (notice.kind, notice.soft, notice.deadline) == (TERMINATE, False, None)
    action = notice_action(notice.kind, own=False, state=WorkerState.RUNNING, job_over=False)
    assert action.drain and not action.soft


@pytest.mark.parametrize("wrapped", [False, True], ids=["flat", "wrapped"])
def test_gcp_terminate_on_host_maintenance_deadline_is_the_window_start(gcp_fake, run, wrapped):
    """``instance/upcoming-maintenance`` says when the window opens: that is the deadline."""
    start = int(time.time()) + 2400
    upcoming = {"maintenance_status": "PENDING", "type": "SCHEDULED", "window_start_time": rfc3339(start),
                "window_end_time": rfc3339(start + 7200)}
    gcp_fake.set_value(UPCOMING, json.dumps({"Upcoming maintenance": upcoming} if wrapped else upcoming))
    sink = run(GCPMetadataWatcher(gcp_fake.url, long_poll_s=1, **FAST))
    gcp_fake.set_maintenance_event("TERMINATE_ON_HOST_MAINTENANCE")
    [notice] = sink.wait()
    assert (notice.kind, notice.deadline) == (TERMINATE, start)


def test_gcp_terminate_on_host_maintenance_is_reported_again_while_it_lasts(gcp_fake, run):
    """Reported once, a notice without a deadline lapsed 2 minutes later while GCE had not stopped the VM yet,
    and the driver placed workers on the host again; reported every ``renew_s``, the driver keeps it."""
    sink = run(GCPMetadataWatcher(gcp_fake.url, long_poll_s=1, renew_s=0.2, **FAST))
    gcp_fake.set_maintenance_event("TERMINATE_ON_HOST_MAINTENANCE")
    notices = sink.wait(3)
    assert {(n.kind, n.event_id) for n in notices} == {(TERMINATE, "gcp-maintenance:TERMINATE_ON_HOST_MAINTENANCE")}
    gcp_fake.set_maintenance_event("NONE")
    more_polls(gcp_fake, "maintenance-event", 2)
    reported = len(sink.notices)
    more_polls(gcp_fake, "maintenance-event", 3)
    assert len(sink.notices) == reported  # over: no longer renewed


def test_gcp_a_new_etag_with_every_answer_does_not_make_the_watcher_spin(run):
    """A server (or proxy) that never holds a long-poll and changes the ETag each time: one cycle per interval."""

    class NewETagEachTime(FakeGCPMetadata):
        answers = 0

        def _etag(self, key: str) -> str:
            self.answers += 1
            return f"etag-{self.answers}"

    with NewETagEachTime() as fake:
        watcher = GCPMetadataWatcher(fake.url, poll_interval_s=0.5, request_timeout_s=0.5)
        run(watcher)
        time.sleep(2.0)
        watcher.close()
        # Two reads a cycle, a cycle per half second: about 10 (it was thousands, at a full core).
        assert fake.count("preempted") <= 12, fake.count("preempted")


def test_gcp_answers_without_the_flavor_header_are_not_believed(gcp_fake, run, caplog):
    caplog.set_level(logging.INFO, logger="cloud_elastic.notices")
    gcp_fake.send_flavor = False
    gcp_fake.set_preempted()
    watcher = GCPMetadataWatcher(gcp_fake.url, **FAST)
    sink = run(watcher)
    more_polls(gcp_fake, "preempted")
    assert sink.notices == [] and watcher_alive(watcher)
    # Never a real server here yet: "no usable service", once, at INFO.
    assert [r.levelno for r in caplog.records if "Metadata-Flavor" in r.getMessage()] == [logging.INFO]
    gcp_fake.send_flavor = True
    assert sink.wait()[0].kind == TERMINATE


def test_gcp_malformed_answers_are_ignored(gcp_fake, run):
    gcp_fake.fault("preempted", times=2, status=200, body=b"MAYBE", headers={"Metadata-Flavor": "Google"})
    gcp_fake.fault("preempted", times=2, status=503, headers={"Metadata-Flavor": "Google"})
    gcp_fake.fault("maintenance-event", times=3, hang_s=3)
    watcher = GCPMetadataWatcher(gcp_fake.url, long_poll_s=1, **FAST)
    sink = run(watcher)
    more_polls(gcp_fake, "maintenance-event", 5)
    assert sink.notices == [] and watcher_alive(watcher)
    gcp_fake.set_preempted()
    assert [n.kind for n in sink.wait()] == [TERMINATE]


def test_gcp_host_placeholder_in_gce_metadata_host(run):
    hosts = ["127.0.0.2", "127.0.0.3"]
    with per_host(FakeGCPMetadata, hosts) as fakes:
        env = {"GCE_METADATA_HOST": f"{{host}}:{fakes[hosts[0]].port}"}
        sinks = {h: run(watcher_for("gcp", h, env, long_poll_s=1, **FAST)) for h in hosts}
        fakes["127.0.0.2"].set_preempted()
        sinks["127.0.0.2"].wait()
        more_polls(fakes["127.0.0.3"], "preempted", 2)
        assert sinks["127.0.0.3"].notices == []


# ---------------------------------------------------------------------------- Azure


@pytest.fixture
def azure_fake() -> Iterator[FakeAzureMetadata]:
    with FakeAzureMetadata(vm_name="workers_3") as fake:
        yield fake


def test_azure_preempt_for_this_vm_is_reported_and_acknowledged(azure_fake, run):
    watcher = AzureScheduledEventsWatcher(azure_fake.url, **FAST)  # learns its name from compute/name
    sink = run(watcher)
    not_before = int(time.time()) + 30
    event_id = azure_fake.add_event("Preempt", not_before=not_before)
    [notice] = sink.wait()
    assert (notice.source, notice.kind, notice.deadline, notice.event_id) == (
        "azure-scheduled-events", TERMINATE, not_before, event_id)
    assert azure_fake.acks == []  # reporting is not acknowledging
    assert watcher.acknowledge() == (event_id,)
    assert azure_fake.acks == [event_id]
    assert watcher.acknowledge() == ()  # once only
    more_polls(azure_fake, EVENTS)  # the event is now Started; still the same notice
    assert azure_fake.acks == [event_id] and sink.notices == [notice]


def test_azure_acknowledgement_waits_for_the_hosts_other_workers_or_the_deadline(azure_fake, run):
    """Azure evicts the VM at the acknowledgement: a leaving watcher waits until the others have left."""
    watcher = AzureScheduledEventsWatcher(azure_fake.url, **FAST)
    sink = run(watcher)
    event_id = azure_fake.add_event("Preempt", not_before=time.time() + 60)
    sink.wait()
    vacated = threading.Event()
    acked: list[tuple[str, ...]] = []
    thread = threading.Thread(target=lambda: acked.append(watcher.acknowledge(until=vacated.is_set)))
    thread.start()
    thread.join(0.5)
    assert thread.is_alive() and azure_fake.acks == []  # rank 0 is still writing its checkpoint
    vacated.set()
    thread.join(BOUND)
    assert acked == [(event_id,)] and azure_fake.acks == [event_id]
    # Past its deadline (the platform goes ahead then anyway) it waits no longer.
    late = azure_fake.add_event("Terminate", not_before=time.time() - 1)
    sink.wait(2)
    assert watcher.acknowledge(until=lambda: False) == (late,)


def test_azure_an_event_with_a_newline_in_it_does_not_hide_the_others(azure_fake, run):
    azure_fake.add_event("Freeze", event_id="BAD\nID")
    azure_fake.add_event("Freeze", event_id="FREEZE-1", EventSource="Plat\nform")
    preempt = azure_fake.add_event("Preempt", not_before=time.time() + 30)
    sink = run(AzureScheduledEventsWatcher(azure_fake.url, vm_name="workers_3", **FAST))
    notices = sink.wait(2)
    assert sorted(n.event_id for n in notices) == sorted(["FREEZE-1", preempt])
    more_polls(azure_fake, EVENTS, 3)
    assert len(sink.notices) == 2


def test_azure_other_vms_events_and_duplicates_are_ignored(azure_fake, run):
    sink = run(AzureScheduledEventsWatcher(azure_fake.url, **FAST))
    azure_fake.add_event("Preempt", resources=["workers_7"])
    azure_fake.add_event("Terminate", resources=["workers_30"])  # a prefix of nobody's
    more_polls(azure_fake, EVENTS)
    assert sink.notices == []
    azure_fake.add_event("Freeze", event_id="FREEZE-1", resources=["workers_7", "workers_3"])
    azure_fake.add_event("Freeze", event_id="FREEZE-1", resources=["workers_3"])  # listed twice
    [freeze] = sink.wait()
    assert (freeze.kind, freeze.event_id, freeze.soft) == (MAINTENANCE, "FREEZE-1", True)
    terminate = azure_fake.add_event("Terminate", not_before=time.time() + 300)
    assert [n.event_id for n in sink.wait(2)] == ["FREEZE-1", terminate]
    more_polls(azure_fake, EVENTS)
    assert len(sink.notices) == 2


def test_azure_only_terminate_events_are_acknowledged(azure_fake, run):
    watcher = AzureScheduledEventsWatcher(azure_fake.url, vm_name="workers_3", **FAST)
    sink = run(watcher)
    azure_fake.add_event("Reboot", event_id="REBOOT-1")
    azure_fake.add_event("Terminate", event_id="TERM-1")
    sink.wait(2)
    assert watcher.acknowledge() == ("TERM-1",)
    assert azure_fake.acks == ["TERM-1"]
    assert azure_fake.count("compute/name") == 0  # configured name: not asked


def test_azure_failed_acknowledgement_is_retried_by_the_next_call(azure_fake, run):
    watcher = AzureScheduledEventsWatcher(azure_fake.url, **FAST)
    sink = run(watcher)
    event_id = azure_fake.add_event("Preempt")
    sink.wait()
    azure_fake.fault(EVENTS, times=1000, status=500)
    assert watcher.acknowledge() == ()
    azure_fake.clear_faults()
    assert watcher.acknowledge() == (event_id,)
    assert azure_fake.acks == [event_id]


def test_azure_malformed_answers_are_ignored(azure_fake, run):
    watcher = AzureScheduledEventsWatcher(azure_fake.url, **FAST)
    azure_fake.fault(EVENTS, times=2, status=200, body=b"<html>captive portal</html>")
    azure_fake.fault(EVENTS, times=2, status=500)
    azure_fake.fault(EVENTS, times=2, status=200, body=b'{"DocumentIncarnation": 3, "Events": "none"}')
    azure_fake.fault(EVENTS, times=1, hang_s=3)
    sink = run(watcher)
    more_polls(azure_fake, EVENTS, 10)
    azure_fake.add_event("Preempt", event_id="BAD-DATE", NotBefore="someday")
    azure_fake.add_event("Preempt", EventId=None)
    azure_fake.add_event("Preempt", Resources="workers_3")
    more_polls(azure_fake, EVENTS)
    assert sink.notices == [] and watcher_alive(watcher)
    good = azure_fake.add_event("Preempt")
    assert [n.event_id for n in sink.wait()] == [good]


def test_azure_endpoint_variable_with_host_placeholder(run):
    hosts = ["127.0.0.2", "127.0.0.3"]

    def fake(address: str, port: int) -> FakeAzureMetadata:
        return FakeAzureMetadata(address, port, vm_name=f"vm-{address.rsplit('.', 1)[1]}")

    with per_host(fake, hosts) as fakes:
        env = {"CLOUD_ELASTIC_AZURE_IMDS_ENDPOINT": f"http://{{host}}:{fakes[hosts[0]].port}"}
        watchers = {h: watcher_for("azure", h, env, **FAST) for h in hosts}
        sinks = {h: run(w) for h, w in watchers.items()}
        event_id = fakes["127.0.0.3"].add_event("Preempt")
        assert [n.event_id for n in sinks["127.0.0.3"].wait()] == [event_id]
        assert watchers["127.0.0.3"].acknowledge() == (event_id,)
        assert fakes["127.0.0.3"].acks == [event_id] and fakes["127.0.0.2"].acks == []
        more_polls(fakes["127.0.0.2"], EVENTS)
        assert sinks["127.0.0.2"].notices == []


# ----------------------------------------------------------------- by hand (CLI)


def _by_hand(args: list[str], env: dict[str, str]) -> "subprocess.CompletedProcess[str]":
    import os
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "cloud_elastic.notices", *args], capture_output=True, text=True,
                          timeout=30, env={**os.environ, **env})


def test_by_hand_prints_each_notice_as_a_json_line(aws_fake):
    aws_fake.set_spot_action("terminate", 1800000000)
    # The emulator suite's hermetic environment disables IMDS for boto3; undo that here.
    env = {"AWS_EC2_METADATA_SERVICE_ENDPOINT": aws_fake.url, "AWS_EC2_METADATA_DISABLED": "false"}
    result = _by_hand(["aws", "--for", "2"], env)
    assert result.returncode == 0, result.stderr
    [line] = result.stdout.splitlines()
    assert json.loads(line) == {"source": "aws-imds", "kind": "terminate", "deadline": 1800000000,
                                "reason": "EC2 Spot interruption: terminate at 2027-01-15T08:00:00Z",
                                "event_id": "aws-spot:terminate"}


def test_by_hand_with_a_bad_endpoint_variable_says_so_in_one_line():
    result = _by_hand(["gcp", "--for", "1"], {"GCE_METADATA_HOST": "http://metadata.test"})
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: GCE_METADATA_HOST is host[:port] without a scheme or path, got 'http://metadata.test'"]


def test_close_cuts_a_long_poll_short(gcp_fake, caplog):
    caplog.set_level(logging.WARNING, logger="cloud_elastic.notices")
    watcher = GCPMetadataWatcher(gcp_fake.url, long_poll_s=120, **FAST)
    watcher.start(Sink())
    assert gcp_fake.wait_for(lambda: gcp_fake.waiting == 1, BOUND)
    watcher.close()  # joins for at most about one request timeout
    assert not watcher_alive(watcher)  # so the 120 s long-poll was cut, not waited out
    assert not caplog.records  # and the broken request was not reported as trouble
