"""The control-plane wire format shared by the driver and the workers.

Every message, in both directions, is one JSON object sent as an HTTP body
with an HMAC-SHA256 signature (per-job secret) in the ``X-Cloud-Elastic-Signature``
header. The object carries the protocol version ``v``, the ``job`` id, a
timestamp ``ts`` and a random ``nonce``; the receiver rejects a bad signature,
another job's message, a stale or non-finite timestamp, a replayed nonce, malformed JSON and
bodies over :data:`MAX_BODY` bytes (a request over :data:`MAX_REQUEST`: the driver reads no more of one, and a
worker signs no more). Nothing is ever unpickled. A driver that adopts its predecessor's
workers keeps their secret but not the predecessor's memory of nonces: its codec also refuses whatever
was signed before it started (``not_before``; :data:`SIGNED_BEFORE_START`), and a worker signs again.

The secret reaches workers out of band (a local child's environment, ssh's
stdin) and never travels on the wire: only signatures do.
"""

from __future__ import annotations

import hmac
import json
import math
import secrets
import threading
import time
from typing import Any, Callable

from cloud_elastic.errors import ControlPlaneError

__all__ = [
    "PROTOCOL_VERSION",
    "MAX_BODY",
    "MAX_REQUEST",
    "SIGNATURE_HEADER",
    "MAX_CLOCK_SKEW_S",
    "SIGNED_BEFORE_START",
    "new_secret",
    "round_namespace",
    "host_namespace",
    "Codec",
]

PROTOCOL_VERSION = 1
#: The most bytes of a request to the driver (a worker's, or ``cloud-elastic status``'s): the driver reads no more
#: of one, signed or not (a stranger's body waits in its memory until it is whole), and a worker's largest is a few KiB.
MAX_REQUEST = 64 * 1024
#: The most bytes of any message, the driver's replies included; a reply past it is answered 500
#: (``driver.net.control_server``), never sent. No reply grows with the job's size any more: an assignment and a
#: heartbeat's plan of the next round name no other member (``protocol.Assignment``), and a status reply caps its rows;
#: the bound is a bound, not what a job needs.
MAX_BODY = 16 * 1024 * 1024
SIGNATURE_HEADER = "X-Cloud-Elastic-Signature"
#: Workers run on other VMs; their clocks are NTP-synchronised but not perfectly.
MAX_CLOCK_SKEW_S = 300.0
#: The refusal of a message timestamped before ``not_before``: the worker's client signs it again (``worker/link``).
SIGNED_BEFORE_START = "message signed before this driver started"


def new_secret() -> str:
    """A fresh per-job secret (256 bits, hex)."""
    return secrets.token_hex(32)


def round_namespace(secret: str, job_id: str, round_: int) -> str:
    """The rendezvous store's key prefix of ``round_``: unguessable without ``secret``, the same on every worker
    (see ``worker/rounds/signed_store.py``); the driver computes it too, to delete a finished round's keys."""
    tag = hmac.new(secret.encode(), f"cloud-elastic/v1/{job_id}/round/{round_}".encode(), "sha256")
    return f"r{round_}-{tag.hexdigest()[:32]}"


def host_namespace(secret: str, job_id: str, host_key: str) -> str:
    """The store key prefix of one incarnation of a host's own group (``hvd.shard``), as :func:`round_namespace`."""
    tag = hmac.new(secret.encode(), f"cloud-elastic/v1/{job_id}/host/{host_key}".encode(), "sha256")
    return f"h-{tag.hexdigest()[:32]}"


def _bounded_int(text: str) -> int:
    """A JSON integer of at most 64 bits: none of the protocol's counts, sizes or times is larger, and a larger one
    (JSON's 1 followed by 400 zeros) failed later, in a conversion to float, as the driver's own error."""
    value = int(text)
    if not -(1 << 63) <= value < 1 << 64:
        raise ValueError(f"integer of {len(text)} digits is past 64 bits")
    return value


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:40]} is not finite")
    return value


def _no_constant(text: str) -> float:
    raise ValueError(f"{text} is not a number")


class Codec:
    """Signs outgoing messages and verifies incoming ones for one job.

    Thread-safe. Remembers nonces for ``MAX_CLOCK_SKEW_S`` so a captured
    message cannot be replayed while its timestamp is still acceptable.
    ``not_before`` (Unix seconds): refuse messages timestamped earlier, for a
    codec that takes over a secret whose earlier nonces it never saw.
    """

    def __init__(self, secret: str, job_id: str, *, clock: Callable[[], float] = time.time,
                 not_before: float = -math.inf) -> None:
        if len(secret) < 32:
            raise ValueError("the control-plane secret is too short")
        self._key = secret.encode()
        self.job_id = job_id
        self._clock = clock
        self._not_before = not_before
        self._floor = -math.inf  # see sign_no_earlier_than
        self._seen: dict[str, float] = {}
        self._prune_at = 4096
        self._lock = threading.Lock()

    def sign(self, body: bytes) -> str:
        """Hex HMAC-SHA256 of ``body``."""
        # hmac.digest is OpenSSL's one-shot HMAC: the same bytes as hmac.new(...).hexdigest(),
        # without building an HMAC object per message (the driver signs and verifies thousands a second).
        return hmac.digest(self._key, body, "sha256").hex()

    def signed(self, body: bytes, signature: str | None) -> bool:
        """Whether ``signature`` is this codec's of ``body`` (a reply that carries no message of its own)."""
        given = (signature or "").strip().encode("latin-1", "replace")
        return bool(given) and hmac.compare_digest(self.sign(body).encode(), given)

    def sign_no_earlier_than(self, ts: float) -> None:
        """Timestamp what this codec signs ``ts`` or later (a driver that started at ``ts`` by its clock refuses
        earlier ones: :data:`SIGNED_BEFORE_START`); at most the tolerated skew ahead of this codec's clock."""
        if math.isfinite(ts):
            self._floor = max(self._floor, min(ts, self._clock() + MAX_CLOCK_SKEW_S))

    def encode(self, kind: str, payload: dict[str, Any], *, limit: int = MAX_REQUEST) -> tuple[bytes, str]:
        """Return ``(body, signature)`` for a message of ``kind``; ControlPlaneError past ``limit`` bytes (a request's,
        unless the caller says otherwise: the driver's replies may hold up to :data:`MAX_BODY`)."""
        message = dict(payload)
        message.update(v=PROTOCOL_VERSION, job=self.job_id, kind=kind, ts=max(self._clock(), self._floor),
                       nonce=secrets.token_hex(12))
        body = json.dumps(message, separators=(",", ":")).encode()
        if len(body) > limit:
            raise ControlPlaneError(f"{kind} message of {len(body)} bytes exceeds the {limit}-byte limit")
        return body, self.sign(body)

    def decode(self, body: bytes, signature: str | None) -> dict[str, Any]:
        """Verify and parse ``body``; raise ControlPlaneError with a one-line reason."""
        if len(body) > MAX_BODY:
            raise ControlPlaneError(f"message of {len(body)} bytes exceeds the {MAX_BODY}-byte limit")
        if not self.signed(body, signature):
            raise ControlPlaneError("bad or missing signature")
        try:
            message = json.loads(body, parse_int=_bounded_int, parse_float=_finite_float, parse_constant=_no_constant)
        # ValueError: bad UTF-8 or JSON, an integer past 64 bits, a number that is not finite (NaN, Infinity, 1e400:
        # a NaN deadline compares false with every time); RecursionError: deep nesting.
        except (ValueError, RecursionError) as exc:
            raise ControlPlaneError(f"malformed JSON: {exc}") from None
        if not isinstance(message, dict):
            raise ControlPlaneError("message is not a JSON object")
        if message.get("v") != PROTOCOL_VERSION:
            raise ControlPlaneError(f"unsupported protocol version {message.get('v')!r}")
        if message.get("job") != self.job_id:
            raise ControlPlaneError("message belongs to another job")
        ts, nonce = message.get("ts"), message.get("nonce")
        if not isinstance(ts, (int, float)) or not isinstance(nonce, str) or not isinstance(message.get("kind"), str):
            raise ControlPlaneError("message lacks ts, nonce or kind")
        now = self._clock()
        try:
            ts = float(ts)
        except OverflowError:  # an integer past the floats' range (JSON's 1 followed by 400 zeros)
            ts = math.inf
        # NaN compares false with everything, so a NaN (or infinite) ts would otherwise pass the window.
        if not math.isfinite(ts):
            raise ControlPlaneError("message timestamp is not a finite number")
        if abs(now - ts) > MAX_CLOCK_SKEW_S:
            raise ControlPlaneError(f"message timestamp is {now - ts:+.0f}s off")
        if ts < self._not_before:  # the time a worker lagging behind this clock signs from next (client.py)
            raise ControlPlaneError(f"{SIGNED_BEFORE_START} at {self._not_before!r}")
        with self._lock:
            if nonce in self._seen:
                raise ControlPlaneError("replayed message")
            # Remember a nonce for as long as its timestamp is acceptable, not merely since arrival.
            self._seen[nonce] = max(now, ts)
            if len(self._seen) > self._prune_at:
                horizon = now - MAX_CLOCK_SKEW_S
                self._seen = {n: t for n, t in self._seen.items() if t >= horizon}
                # Many workers keep many nonces live; prune again only when the cache doubles.
                self._prune_at = max(4096, 2 * len(self._seen))
        return message
