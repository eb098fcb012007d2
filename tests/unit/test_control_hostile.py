"""Signed messages whose values break arithmetic or the JSON reader (issue 44 #8): each is refused
with a one-line ControlPlaneError, never accepted and never another exception (which the control
plane reports as a driver bug)."""

from __future__ import annotations

import pytest

from cloud_elastic.control import PROTOCOL_VERSION, Codec
from cloud_elastic.errors import ControlPlaneError

pytestmark = pytest.mark.timeout(10)

SECRET = "s" * 64
NOW = 1_700_000_000.0


def codec() -> Codec:
    return Codec(SECRET, "job", clock=lambda: NOW)


def head(ts: str) -> bytes:
    return (f'{{"v":{PROTOCOL_VERSION},"job":"job","kind":"poll","nonce":"n1","ts":{ts}}}').encode()


@pytest.mark.parametrize("ts", ["NaN", "Infinity", "-Infinity", "1" + "0" * 400, "-" + "1" * 400],
                         ids=["nan", "inf", "minus-inf", "int-past-floats", "negative-int-past-floats"])
def test_a_signed_message_with_a_timestamp_that_is_not_a_finite_time_is_refused(ts: str) -> None:
    """Issue 44 #8: ``"ts": NaN`` passed the replay window (NaN compares false with everything), so a
    captured message could be replayed for ever once its nonce was pruned."""
    receiver = codec()
    body = head(ts)
    with pytest.raises(ControlPlaneError, match="^malformed JSON: (NaN|Infinity|-Infinity) is not a number$|past 64"):
        receiver.decode(body, receiver.sign(body))


@pytest.mark.parametrize("value", ["NaN", "Infinity", "1e400", "1" + "0" * 400, "-" + "9" * 40],
                         ids=["nan", "inf", "float-past-floats", "int-past-floats", "int-past-64-bits"])
def test_a_number_that_no_field_can_hold_is_refused_wherever_it_stands(value: str) -> None:
    """Review h2 (2026-12-01): only ``ts`` was checked; ``"waiting_s": 1e400`` (an integer) failed in a conversion to
    float as the driver's own error (HTTP 500, "a bug; please report it"), and a NaN deadline in a notice parsed
    (it compares false with every time)."""
    receiver = codec()
    body = (f'{{"v":{PROTOCOL_VERSION},"job":"job","kind":"poll","nonce":"n1","ts":{NOW!r},'
            f'"link":{{"mb_s":{{"w2":{value}}}}}}}').encode()
    with pytest.raises(ControlPlaneError, match="^malformed JSON: .*(not a number|not finite|past 64 bits)$"):
        receiver.decode(body, receiver.sign(body))


@pytest.mark.parametrize("body", [b"[" * 30_000 + b"]" * 30_000, b'{"n":' + b"9" * 5000 + b"}"],
                         ids=["nested-too-deep", "int-over-4300-digits"])
def test_a_signed_body_python_cannot_read_is_malformed_json(body: bytes) -> None:
    receiver = codec()
    with pytest.raises(ControlPlaneError, match="malformed JSON"):
        receiver.decode(body, receiver.sign(body))


def test_a_finite_timestamp_in_the_window_is_still_accepted() -> None:
    receiver = codec()
    body = head(repr(NOW - 1))
    assert receiver.decode(body, receiver.sign(body))["ts"] == NOW - 1
    big = (f'{{"v":{PROTOCOL_VERSION},"job":"job","kind":"poll","nonce":"n2","ts":{int(NOW)},"bytes":{(1 << 64) - 1},'
           f'"low":-{1 << 63},"tiny":1e-300}}').encode()  # every 64-bit count and a small float still pass
    assert receiver.decode(big, receiver.sign(big))["bytes"] == (1 << 64) - 1
