"""The control plane's answers on their own: a :class:`ControlPlane` over a :class:`FakeJob`, no server, no driver.

Each test sends the messages a worker (or ``cloud-elastic drain``) sends and checks the reply and
what the job was asked to do; the job's own rules are tested with the job (tests/unit/test_job*.py).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from cloud_elastic.config import JobConfig
from cloud_elastic.driver.job.actions import Phase
from cloud_elastic.driver.job.notice_policy import watched_cloud
from cloud_elastic.driver.runtime.condition import JobCondition
from cloud_elastic.driver.runtime.control_plane import POLLS_PER_S, ControlPlane
from cloud_elastic.errors import ControlPlaneError
from tests.unit.job_view import T0, FakeJob, S

pytestmark = pytest.mark.timeout(60)


class RecordingJob(FakeJob):
    """FakeJob with the job's side of the messages the tests send, recorded instead of carried out."""

    def __init__(self, np: int = 2) -> None:
        super().__init__(np)
        self.notices: list[tuple[str, Any, str, bool, str | None]] = []  # (host, drain, source, soft, watcher)
        self.drains: list[tuple[str, int | None]] = []
        self.loaded: list[tuple[int, int | None, str]] = []
        self.saved: list[tuple[int, int | None]] = []
        self.unhealthy_slots: list[tuple[str, str]] = []
        self.alive_count = 0

    def registered(self, worker_id: str, now: float) -> bool:
        return worker_id in self.workers

    def notice(self, host: str, drain: Any, now: float, *, source: str, soft: bool, watcher: str | None = None) -> None:
        self.notices.append((host, drain, source, soft, watcher))

    def drain(self, host: str, slot: int | None, now: float) -> tuple[bool, str]:
        self.drains.append((host, slot))
        return True, f"draining {host}"

    def checkpoint_loaded(self, step: int, commit_seq: int | None, path: str, trained: str = "") -> None:
        self.loaded.append((step, commit_seq, path))

    def checkpoint_saved(self, step: int, commit_seq: int | None) -> None:
        self.saved.append((step, commit_seq))

    def unhealthy(self, worker_id: str, reason: str, now: float) -> None:
        self.unhealthy_slots.append((worker_id, reason))

    def take_rendezvous_news(self) -> list[str]:
        return []

    def rank_of(self, worker_id: str) -> int | None:
        w = self.workers.get(worker_id)
        return None if w is None else w.rank


class Sink:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def emit(self, kind: str, **fields: Any) -> None:
        self.events.append((kind, fields))


def plane(job: RecordingJob | None = None, clock: Any = lambda: T0,
          **config: Any) -> tuple[ControlPlane, RecordingJob, list[tuple[str, int]], Sink]:
    job = job or RecordingJob()
    for index in range(2):
        job.worker("127.0.0.1", index, S.CONNECTED)
    stops: list[tuple[str, int]] = []
    sink = Sink()
    base = dict(command=("python", "train.py"), num_proc=2, min_np=1, max_np=2)
    cond = JobCondition()
    cond.watch(job)
    return ControlPlane(job, cond, JobConfig(**(base | config)), sinks=SimpleNamespace(sink=sink, metrics=None),
                        clock=clock, stop=lambda reason, code: stops.append((reason, code)),
                        record_events=lambda: None, watch_cloud=watched_cloud(config.get("notice_watcher", "auto"),
                                                                               "static")), job, stops, sink


def _notice(worker: str, **fields: Any) -> dict[str, Any]:
    return {"worker": worker, "source": "aws", "notice": "terminate", "reason": "spot interruption",
            "deadline": None} | fields


def test_an_unknown_kind_or_a_message_without_a_worker_is_refused() -> None:
    p, _, _, _ = plane()
    with pytest.raises(ControlPlaneError, match="unknown message kind 'nope'"):
        p.handle("nope", {"worker": "x"})
    with pytest.raises(ControlPlaneError, match="lacks a worker id"):
        p.handle("register", {})


def test_register_knows_only_the_jobs_workers_and_names_the_hosts_notice_watcher() -> None:
    p, job, _, _ = plane(notice_watcher="aws")
    first, second = sorted(job.workers)
    assert p.handle("register", {"worker": "stranger"})["ok"] is False
    reply = p.handle("register", {"worker": first})
    assert reply["ok"] is True and reply["notice_watcher"] == "aws"  # the first live worker of its host
    assert p.handle("register", {"worker": second})["notice_watcher"] is None
    job.workers[first].state = S.LOST  # the watcher went: the next worker of the host to ask takes over
    assert p.handle("register", {"worker": second})["notice_watcher"] == "aws"


def test_a_malformed_notice_is_refused_by_field_and_a_good_one_drains_the_host() -> None:
    p, job, _, _ = plane()
    worker = sorted(job.workers)[0]
    with pytest.raises(ControlPlaneError, match="malformed notice message: 'notice' must be one of"):
        p.handle("notice", _notice(worker, notice="meteor"))
    with pytest.raises(ControlPlaneError, match="malformed notice message: 'deadline' must be a number"):
        p.handle("notice", _notice(worker, deadline="soon"))
    assert job.notices == []
    assert p.handle("notice", _notice(worker)) == {"ok": True}
    (host, drain, source, soft, watcher), = job.notices
    assert (host, drain.reason, source, soft, watcher) == ("127.0.0.1", "spot interruption", "aws", False, worker)
    assert p.handle("notice", _notice(worker, notice="rebalance")) == {"ok": True}
    assert job.notices[-1][3] is True  # a recommendation: soft
    assert p.handle("notice", _notice("stranger")) == {"ok": False}


def test_a_notice_names_the_worker_that_reported_it_as_its_watcher() -> None:
    """0d8f148 (rv4 mutant_watcher): a notice re-sent by the same watcher (a GCE maintenance event renewed) keeps the
    host's drain pending; another watcher of the host reporting it (its first one left, the next took over) is not a
    re-send. The job tells them apart by the worker the control plane names, the one that sent the message: without
    it every hand-off counted as a re-send and a spot notice held the host for an hour instead of lapsing."""
    p, job, _, _ = plane()
    first, second = sorted(job.workers)
    for worker in (first, second, first):
        assert p.handle("notice", _notice(worker, source="gcp", notice="maintenance")) == {"ok": True}
    assert [watcher for *_, watcher in job.notices] == [first, second, first]


def test_a_checkpoint_rank_0_cannot_load_stops_the_job_and_a_malformed_report_is_refused() -> None:
    p, job, stops, sink = plane()
    worker = sorted(job.workers)[0]
    with pytest.raises(ControlPlaneError, match="malformed checkpoint message: 'step' must be an integer"):
        p.handle("checkpoint", {"worker": worker, "event": "saved", "step": "7", "path": "p"})
    assert p.handle("checkpoint", {"worker": worker, "event": "saved", "step": 7, "path": "p", "bytes": 9,
                                   "duration_s": 0.5}) == {"ok": True}
    assert sink.events == [("checkpoint_saved", {"step": 7, "path": "p", "duration_s": 0.5, "bytes": 9})]
    assert p.handle("checkpoint", {"worker": worker, "event": "loaded", "step": 7, "path": "p",
                                   "commit_seq": 40}) == {"ok": True}
    assert job.loaded == [(7, 40, "p")]
    assert p.handle("checkpoint", {"worker": worker, "event": "failed", "reason": "torn file"}) == {"ok": True}
    assert stops == [("training state lost: cannot resume from the checkpoint: torn file", 1)]
    assert p.handle("checkpoint", {"worker": "stranger", "event": "failed", "reason": "x"}) == {"ok": False}


def test_checkpoints_that_keep_failing_before_any_was_written_end_the_job_in_one_line() -> None:
    now = [T0]
    p, job, stops, _ = plane(clock=lambda: now[0], checkpoint_dir="s3://b/x", checkpoint_interval_s=30.0)
    worker = sorted(job.workers)[0]
    why = "could not read s3://b/x/job.json: Unable to locate credentials"
    for _ in range(3):  # attempts every 30 s: 60 s of them, below the 90 s window
        assert p.handle("checkpoint", {"worker": worker, "event": "not_written", "reason": why, "step": 3}) == {"ok": True}
        now[0] += 30.0
    assert stops == []
    p.handle("checkpoint", {"worker": worker, "event": "not_written", "reason": why})
    assert stops == [(f"cannot write the checkpoints --checkpoint-dir asks for: {why} (no checkpoint written in "
                      "90s: 4 attempts failed)", 1)]


@pytest.mark.parametrize("known", ["resumed", "loaded"])
def test_failing_checkpoints_do_not_end_a_job_that_has_one_this_driver_did_not_write(known: str) -> None:
    now = [T0]
    p, job, stops, _ = plane(clock=lambda: now[0], checkpoint_dir="s3://b/x", checkpoint_interval_s=30.0)
    worker = sorted(job.workers)[0]
    if known == "resumed":  # a restarted driver resuming from (or adopting workers beside) a checkpoint
        job.resumed = True
    else:  # rank 0 of the first round loaded the checkpoint
        p.handle("checkpoint", {"worker": worker, "event": "loaded", "step": 40, "commit_seq": 40, "path": "s3://b/x/40"})
    for _ in range(20):  # storage down for 10 minutes, past the 90 s window
        p.handle("checkpoint", {"worker": worker, "event": "not_written", "reason": "SlowDown"})
        now[0] += 30.0
    assert stops == []


def test_a_drain_names_its_host_and_an_unhealthy_report_its_first_line() -> None:
    p, job, _, _ = plane()
    worker = sorted(job.workers)[0]
    with pytest.raises(ControlPlaneError, match="malformed drain request: 'slot' must be a non-negative integer"):
        p.handle("drain", {"worker": "cli:status", "host": "10.0.0.1", "slot": -1})
    assert p.handle("drain", {"worker": "cli:status", "host": "10.0.0.1", "slot": 1}) == {
        "ok": True, "message": "draining 10.0.0.1"}
    assert job.drains == [("10.0.0.1", 1)]
    with pytest.raises(ControlPlaneError, match="malformed unhealthy report: 'reason' must be a non-empty string"):
        p.handle("unhealthy", {"worker": worker, "reason": ""})
    assert p.handle("unhealthy", {"worker": worker, "reason": "CUDA error\ntraceback"}) == {"ok": True}
    assert job.unhealthy_slots == [(worker, "CUDA error")]


def test_heartbeats_are_held_longer_only_in_a_very_large_group() -> None:
    p, job, _, _ = plane(heartbeat_interval_s=0.5, heartbeat_timeout_s=60.0)
    assert p.poll_hold_s() == 0.5
    job.alive_count = 8000
    assert p.poll_hold_s() == 8000 / POLLS_PER_S
    job.alive_count = 10**6
    assert p.poll_hold_s() == 15.0  # never more than a quarter of the heartbeat timeout


class Holding:
    """An interceptor that answers ``adopt`` itself and lets everything else through."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def intercept(self, kind: str, worker_id: str, msg: dict[str, Any]) -> dict[str, Any] | None:
        self.seen.append(kind)
        return {"ok": True, "by": "interceptor"} if kind == "adopt" else None


def test_the_interceptor_sees_every_message_first_and_may_answer_it() -> None:
    p, job, _, _ = plane()
    interceptor = Holding()
    p = ControlPlane(job, JobCondition(), JobConfig(command=("x",), num_proc=2, min_np=1, max_np=2),
                     sinks=SimpleNamespace(sink=Sink(), metrics=None), clock=lambda: T0, stop=lambda r, c: None,
                     record_events=lambda: None, interceptor=interceptor)
    assert p.handle("adopt", {"worker": "w"}) == {"ok": True, "by": "interceptor"}
    assert p.handle("register", {"worker": sorted(job.workers)[0]})["ok"] is True
    with pytest.raises(ControlPlaneError, match="unknown message kind 'nope'"):
        p.handle("nope", {"worker": "w"})
    assert interceptor.seen == ["adopt", "register", "nope"]


def test_the_notice_watcher_follows_the_provider_unless_told() -> None:
    assert watched_cloud("auto", "aws") == "aws" and watched_cloud("auto", "static") is None
    assert watched_cloud("none", "aws") is None and watched_cloud("gcp", "static") == "gcp"


class HeartbeatJob(RecordingJob):
    """RecordingJob that records when each heartbeat says its worker was heard."""

    def __init__(self) -> None:
        super().__init__()
        self.heard_at: list[float] = []
        self.silence = SimpleNamespace(heard=lambda *args: None)
        self.rounds = SimpleNamespace(next=SimpleNamespace(offer_to=lambda worker_id: None), planned=0)

    def heartbeat(self, worker_id: str, now: float, *args: Any, **kwargs: Any) -> Any:
        from cloud_elastic.protocol import PollReply

        self.heard_at.append(now)
        return PollReply(0, 0, 0, False)


def test_a_held_heartbeat_counts_its_worker_alive_at_its_arrival_not_at_its_later_looks() -> None:
    """A worker that dies while its poll is held must be found silent a heartbeat timeout after that
    poll arrived: the hold's later looks at the job (the deadline's, a wake's) are no news of it."""
    job = HeartbeatJob()
    now = [T0]
    p, _, _, _ = plane(job)
    p._clock = lambda: now[0]
    worker = sorted(job.workers)[0]
    held = p.handle("poll", {"worker": worker, "round": 0, "update_gen": 0, "abort_round": 0})
    assert not isinstance(held, dict)  # nothing changed: the poll is held
    now[0] = T0 + p.poll_hold_s()
    p._cond.wake()
    assert held._on_deadline()["round"] == 0  # answered at the deadline
    assert job.heard_at and set(job.heard_at) == {T0}


def test_register_tells_a_worker_to_join_after_its_set_up_once_the_job_runs_or_keeps_spares() -> None:
    """worker.context: such a worker joins at its first call that needs the round, not inside hvd.init()."""
    p, job, _, _ = plane()
    first = sorted(job.workers)[0]
    assert p.handle("register", {"worker": first})["running"] is False  # the first round's workers join in init()
    job.phase = Phase.RUNNING
    assert p.handle("register", {"worker": first})["running"] is True
    p, job, _, _ = plane(spares=1)  # any worker of the first launch may end up a spare
    assert p.handle("register", {"worker": sorted(job.workers)[0]})["running"] is True


def test_a_checkpoint_not_written_is_an_event_with_the_run_of_failures_so_far() -> None:
    now = [T0]
    p, job, stops, sink = plane(clock=lambda: now[0], checkpoint_dir="s3://b/x", checkpoint_interval_s=30.0)
    job.resumed = True  # a checkpoint exists: failures only warn, and the event is what an alert can see
    worker = sorted(job.workers)[0]
    for _ in range(3):
        p.handle("checkpoint", {"worker": worker, "event": "not_written", "reason": "SlowDown"})
        now[0] += 30.0
    assert [e for e in sink.events if e[0] == "checkpoint_failed"] == [
        ("checkpoint_failed", {"reason": "SlowDown", "failed_in_a_row": n, "since_s": 30.0 * (n - 1)}) for n in (1, 2, 3)]
    assert stops == []
