"""cloud_elastic/protocol.py: typed messages survive the wire, and malformed ones are refused in one line."""

from __future__ import annotations

import json

import pytest

from cloud_elastic.errors import ControlPlaneError
from cloud_elastic.protocol import (
    Assignment,
    ExitOrder,
    PollReply,
    PollRequest,
    RankInfo,
    RendezvousRequest,
    WaitReply,
    parse_rendezvous_reply,
)

pytestmark = pytest.mark.timeout(10)


def _wire(obj) -> dict:
    return json.loads(json.dumps(obj.to_wire()))


@pytest.mark.parametrize("reply", [
    Assignment(4, RankInfo(1, 3, 1, 2, 0, 2), needs_sync=True, update_gen=7),
    ExitOrder("host h is draining"),
    WaitReply(),
])
def test_rendezvous_replies_round_trip(reply):
    assert parse_rendezvous_reply(_wire(reply)) == reply


def test_requests_and_poll_replies_round_trip():
    assert RendezvousRequest.from_wire(_wire(RendezvousRequest(3, "failure"))) == RendezvousRequest(3, "failure")
    assert PollRequest.from_wire(_wire(PollRequest(2, 1, 0))) == PollRequest(2, 1, 0)
    assert PollReply.from_wire(_wire(PollReply(2, 1, 1, True))) == PollReply(2, 1, 1, True)


@pytest.mark.parametrize("mutate,message", [
    (lambda m: m.pop("local_rank"), "'local_rank' must be a non-negative integer"),
    (lambda m: m.update(rank="0"), "'rank' must be a non-negative integer"),
    (lambda m: m.update(local_rank=2), "ranks out of range"),
    (lambda m: m.update(needs_sync=1), "'needs_sync' must be true or false"),
    (lambda m: m.update(status="bogus"), "unknown status 'bogus'"),
])
def test_a_malformed_assignment_is_refused(mutate, message):
    msg = _wire(Assignment(1, RankInfo(0, 2, 1, 2, 0, 1), needs_sync=False, update_gen=0))
    mutate(msg)
    with pytest.raises(ControlPlaneError, match=message):
        parse_rendezvous_reply(msg)


def test_a_rendezvous_request_with_an_unknown_reason_is_refused():
    with pytest.raises(ControlPlaneError, match="reason must be one of"):
        RendezvousRequest.from_wire({"last_round": 0, "reason": "bored"})
