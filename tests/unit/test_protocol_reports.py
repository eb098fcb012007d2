"""The drain, unhealthy, notice and checkpoint messages as typed values: what they carry, and one-line refusals
that name the field (cloud_elastic.protocol_reports)."""

from __future__ import annotations

import pytest

from cloud_elastic.errors import ControlPlaneError
from cloud_elastic.protocol_reports import CheckpointReport, DrainRequest, NoticeReport, UnhealthyReport

pytestmark = pytest.mark.timeout(10)


@pytest.mark.parametrize("value", [
    DrainRequest("10.0.0.1"), DrainRequest("10.0.0.1", 3), UnhealthyReport("CUDA error"),
    NoticeReport("aws-imds", "terminate", "spot interruption", 1.7e9),
    NoticeReport("sigterm", "terminate", "x", None, True),
    CheckpointReport("saved", 7, "s3://b/step-7", duration_s=0.5, bytes=9), CheckpointReport("loaded", 7, "p", 40),
    CheckpointReport("failed", reason="torn file"),
])
def test_each_message_comes_back_from_the_wire_as_it_was_sent(value) -> None:
    assert type(value).from_wire(value.to_wire()) == value


@pytest.mark.parametrize("kind, msg, error", [
    (DrainRequest, {"host": ""}, "malformed drain request: 'host' must be a host name of 1 to 255 characters"),
    (DrainRequest, {"host": "h" * 256}, "'host' must be a host name"),
    (DrainRequest, {"host": "h", "slot": True}, "malformed drain request: 'slot' must be a non-negative integer"),
    (UnhealthyReport, {"reason": None}, "malformed unhealthy report: 'reason' must be a non-empty string"),
    (NoticeReport, {"source": "aws", "notice": "meteor", "reason": "x"}, "malformed notice message: 'notice' must be"),
    (NoticeReport, {"source": 1, "notice": "terminate", "reason": "x"}, "'source' must be a string, got 1"),
    (NoticeReport, {"source": "a", "notice": "terminate", "reason": "x", "deadline": True}, "'deadline' must be"),
    (CheckpointReport, {"event": "eaten"}, "malformed checkpoint message: 'event' must be one of"),
    (CheckpointReport, {"event": "saved", "step": 1.0, "path": "p"}, "'step' must be an integer, got 1.0"),
    (CheckpointReport, {"event": "loaded", "step": 1, "path": "p", "commit_seq": "4"}, "'commit_seq' must be"),
    (CheckpointReport, {"event": "failed"}, "malformed checkpoint message: 'reason' must be a string, got None"),
])
def test_a_malformed_message_is_refused_in_one_line_naming_its_field(kind, msg, error) -> None:
    with pytest.raises(ControlPlaneError, match=error.replace("(", r"\(")) as refused:
        kind.from_wire(msg)
    assert "\n" not in str(refused.value)


def test_long_texts_are_cut_and_a_wrongly_typed_size_is_left_out() -> None:
    notice = NoticeReport.from_wire({"source": "s" * 99, "notice": "rebalance", "reason": "r" * 999})
    assert (len(notice.source), len(notice.reason), notice.own) == (40, 200, False)
    assert UnhealthyReport.from_wire({"reason": "first\nsecond"}).reason == "first"
    saved = CheckpointReport.from_wire({"event": "saved", "step": 1, "path": "p" * 2000, "bytes": 1.5,
                                        "duration_s": "fast"})
    assert (len(saved.path), saved.bytes, saved.duration_s) == (1000, None, None)
