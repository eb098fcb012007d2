"""The signed JSON wire format (cloud_elastic.control)."""

from __future__ import annotations

import json

import pytest

from cloud_elastic.control import MAX_BODY, MAX_CLOCK_SKEW_S, PROTOCOL_VERSION, SIGNED_BEFORE_START, Codec
from cloud_elastic.errors import ControlPlaneError

pytestmark = pytest.mark.timeout(10)

SECRET = "s" * 64
NOW = 1_700_000_000.0


class Clock:
    """A settable clock for one codec."""

    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def codec(job: str = "job", secret: str = SECRET, at: float = NOW) -> Codec:
    return Codec(secret, job, clock=Clock(at))


def signed(receiver: Codec, message: object) -> tuple[bytes, str]:
    """A body signed with the right key, whatever it contains."""
    body = json.dumps(message).encode()
    return body, receiver.sign(body)


def well_formed(**overrides: object) -> dict[str, object]:
    message = {"v": PROTOCOL_VERSION, "job": "job", "kind": "poll", "ts": NOW, "nonce": "n1"}
    message.update(overrides)
    return {k: v for k, v in message.items() if v is not None}


def rejected(receiver: Codec, body: bytes, signature: str | None, match: str) -> None:
    with pytest.raises(ControlPlaneError, match=match):
        receiver.decode(body, signature)


def test_round_trip_keeps_payload_and_adds_envelope() -> None:
    body, sig = codec().encode("rendezvous", {"worker": "a[0]#1", "last_round": 3})
    message = codec().decode(body, sig)
    assert message["worker"] == "a[0]#1" and message["last_round"] == 3
    assert (message["kind"], message["job"], message["v"], message["ts"]) == ("rendezvous", "job", PROTOCOL_VERSION, NOW)
    assert isinstance(message["nonce"], str) and message["nonce"]


def test_nonces_differ_between_messages() -> None:
    sender = codec()
    first, second = (json.loads(sender.encode("poll", {})[0]) for _ in range(2))
    assert first["nonce"] != second["nonce"]


@pytest.mark.parametrize("signature", [None, "", "0" * 64], ids=["missing", "empty", "wrong"])
def test_bad_or_missing_signature(signature: str | None) -> None:
    body, _ = codec().encode("poll", {})
    rejected(codec(), body, signature, "bad or missing signature")


def test_signature_made_with_another_secret() -> None:
    body, sig = codec(secret="x" * 64).encode("poll", {})
    rejected(codec(), body, sig, "bad or missing signature")


def test_tampered_body() -> None:
    body, sig = codec().encode("poll", {"worker": "a[0]#1", "round": 1})
    rejected(codec(), body.replace(b'"round":1', b'"round":2'), sig, "bad or missing signature")


def test_other_jobs_message() -> None:
    body, sig = codec(job="other").encode("poll", {})
    rejected(codec(job="job"), body, sig, "another job")


@pytest.mark.parametrize("offset", [MAX_CLOCK_SKEW_S + 1, -(MAX_CLOCK_SKEW_S + 1)], ids=["old", "future"])
def test_stale_timestamp(offset: float) -> None:
    body, sig = codec(at=NOW - offset).encode("poll", {})
    rejected(codec(at=NOW), body, sig, "timestamp is .*s off")


def test_timestamp_within_skew_is_accepted() -> None:
    body, sig = codec(at=NOW - MAX_CLOCK_SKEW_S + 1).encode("poll", {})
    assert codec(at=NOW).decode(body, sig)["kind"] == "poll"


def test_replayed_message() -> None:
    receiver = codec()
    body, sig = codec().encode("completed", {"worker": "a[0]#1"})
    receiver.decode(body, sig)
    rejected(receiver, body, sig, "replayed message")


def test_a_codec_that_takes_over_a_secret_refuses_what_was_signed_before_it() -> None:
    """Hostile review: a restarted driver adopting its workers gets their secret but not its predecessor's nonces,
    and ran the handler of any message captured in the 300 s before the crash."""
    receiver = Codec(SECRET, "job", clock=Clock(NOW + 5), not_before=NOW)
    body, sig = codec(at=NOW - 0.001).encode("completed", {"worker": "a[0]#1"})
    rejected(receiver, body, sig, f"^{SIGNED_BEFORE_START} at {NOW!r}$")
    body, sig = codec(at=NOW).encode("completed", {"worker": "a[0]#1"})
    assert receiver.decode(body, sig)["kind"] == "completed"
    lagging = codec(at=NOW - 60)  # told the driver's start, it signs from there (not past the tolerated skew)
    lagging.sign_no_earlier_than(NOW)
    body, sig = lagging.encode("completed", {"worker": "a[0]#1"})
    assert receiver.decode(body, sig)["ts"] == NOW
    lagging.sign_no_earlier_than(NOW + 10 * MAX_CLOCK_SKEW_S)
    assert json.loads(lagging.encode("poll", {})[0])["ts"] == NOW - 60 + MAX_CLOCK_SKEW_S


def test_oversized_body_rejected_before_anything_else() -> None:
    body = b"{" + b" " * MAX_BODY + b"}"
    rejected(codec(), body, codec().sign(body), f"exceeds the {MAX_BODY}-byte limit")


def test_oversized_message_cannot_be_encoded() -> None:
    with pytest.raises(ControlPlaneError, match="exceeds"):
        codec().encode("poll", {"blob": "x" * MAX_BODY})


@pytest.mark.parametrize(
    ("message", "match"),
    [
        ([1, 2], "not a JSON object"),
        ("poll", "not a JSON object"),
        (well_formed(v=2), "unsupported protocol version 2"),
        (well_formed(v=None), "unsupported protocol version None"),
        (well_formed(nonce=None), "lacks ts, nonce or kind"),
        (well_formed(ts="yesterday"), "lacks ts, nonce or kind"),
        (well_formed(kind=None), "lacks ts, nonce or kind"),
    ],
    ids=["array", "string", "version-2", "no-version", "no-nonce", "text-ts", "no-kind"],
)
def test_signed_but_malformed_message(message: object, match: str) -> None:
    receiver = codec()
    rejected(receiver, *signed(receiver, message), match)


@pytest.mark.parametrize("body", [b"{not json", b"\xff\xfe"], ids=["syntax", "not-utf8"])
def test_signed_but_unparseable_body(body: bytes) -> None:
    receiver = codec()
    rejected(receiver, body, receiver.sign(body), "malformed JSON")


def test_well_formed_hand_made_message_is_accepted() -> None:
    receiver = codec()
    assert receiver.decode(*signed(receiver, well_formed()))["nonce"] == "n1"


def test_short_secret_refused() -> None:
    with pytest.raises(ValueError, match="too short"):
        Codec("short", "job")


def test_a_replay_is_refused_while_its_timestamp_is_valid_even_after_4096_other_messages() -> None:
    """A nonce is remembered as long as its message's own timestamp is acceptable, not by arrival.

    A message from a sender whose clock runs ahead (within the allowed skew) stays
    acceptable for longer than the skew after it arrived; a captured copy of it,
    replayed after 4096 other messages, is still refused.
    """
    clock = Clock(NOW)
    receiver = Codec(SECRET, "job", clock=clock)
    body, sig = codec(at=NOW + MAX_CLOCK_SKEW_S - 1).encode("completed", {"worker": "a[0]#1"})
    receiver.decode(body, sig)
    clock.now = NOW + MAX_CLOCK_SKEW_S + 100  # the message's timestamp is still within the skew
    traffic = codec(at=clock.now)
    for _ in range(4096):
        receiver.decode(*traffic.encode("poll", {}))
    rejected(receiver, body, sig, "replayed message")
