"""Fake instance-metadata services for the three clouds: real HTTP servers on threads.

* :class:`FakeAWSMetadata`: IMDSv2. ``PUT /latest/api/token`` with a TTL header
  hands out tokens that expire; every read without a valid token gets 401.
  Serves ``spot/instance-action``, ``events/recommendations/rebalance`` and
  ``autoscaling/target-lifecycle-state`` (404 until set).
* :class:`FakeGCPMetadata`: answers only requests with ``Metadata-Flavor: Google``
  (403 otherwise) and sends the header back; ``wait_for_change=true`` with
  ``last_etag`` blocks until the value changes or ``timeout_sec`` passes.
* :class:`FakeAzureMetadata`: Scheduled Events (``Metadata: true`` required)
  with a document incarnation, ``compute/name``, and a record of every
  ``StartRequests`` acknowledgement.

All are settable at runtime (``fake.set_spot_action("terminate", when)``) and
can be told to misbehave for the next N requests to a path
(:meth:`FakeMetadata.fault`: a status, a raw body, or a hang).

:func:`per_host` starts one fake per loopback address on one shared port, so
that ``http://{host}:PORT`` reaches the right one from every "host"; it is
plain stdlib and importable from ``tests/integration``.
"""

from __future__ import annotations

import json
import re
import secrets
import sys
import threading
import time
from dataclasses import dataclass
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterable, Iterator, TypeVar
from urllib.parse import parse_qs, urlsplit
from contextlib import contextmanager

from tests.emulator.httpfake import SERVE_POLL_S

__all__ = [
    "FakeMetadata",
    "FakeAWSMetadata",
    "FakeGCPMetadata",
    "FakeAzureMetadata",
    "per_host",
    "aws_time",
    "rfc1123",
]


def aws_time(unix: float) -> str:
    """Unix seconds → the ``2017-09-18T08:22:00Z`` form IMDS uses."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(unix))


def rfc1123(unix: float) -> str:
    """Unix seconds → the ``Mon, 19 Sep 2016 18:29:47 GMT`` form Scheduled Events use."""
    return formatdate(unix, usegmt=True)


@dataclass
class Req:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]  # lower-case names
    body: bytes


@dataclass
class Resp:
    status: int = 200
    body: bytes = b""
    headers: dict[str, str] | None = None


@dataclass
class _Fault:
    pattern: re.Pattern
    remaining: int
    resp: Resp | None
    hang_s: float


class FakeMetadata:
    """A metadata fake bound to ``address:port`` (port 0 = any). Context manager or start()/stop()."""

    def __init__(self, address: str = "127.0.0.1", port: int = 0) -> None:
        self.address, self.port = address, port
        self._cond = threading.Condition()
        self._faults: list[_Fault] = []
        self.requests: list[tuple[str, str]] = []  # (method, path) of every request
        self._server: ThreadingHTTPServer | None = None
        self._stopping = threading.Event()

    # -- scripting -------------------------------------------------------------------

    def fault(self, path: str, times: int = 1, *, status: int = 500, body: bytes = b"", hang_s: float = 0.0,
              headers: dict[str, str] | None = None) -> None:
        """The next ``times`` requests whose path matches ``path`` (regex search) misbehave.

        With ``hang_s`` the server accepts the request and says nothing for that
        long (or until stopped), then closes; otherwise it answers ``status``
        with ``body`` as is.
        """
        resp = None if hang_s else Resp(status, body, headers)
        with self._cond:
            self._faults.append(_Fault(re.compile(path), times, resp, hang_s))

    def clear_faults(self) -> None:
        """Forget every pending fault."""
        with self._cond:
            self._faults.clear()

    def count(self, path: str = "", method: str | None = None) -> int:
        """Requests so far whose path matches ``path`` (regex search)."""
        rx = re.compile(path)
        with self._cond:
            return sum(1 for m, p in self.requests if rx.search(p) and method in (None, m))

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 20.0) -> bool:
        """Wait until ``predicate()`` (checked whenever a request arrives or state changes)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not predicate():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.1))
            return True

    def _changed(self) -> None:
        with self._cond:
            self._cond.notify_all()

    # -- for subclasses --------------------------------------------------------------

    def handle(self, req: Req) -> Resp:
        raise NotImplementedError

    # -- server ----------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://{self.address}:{self.port}"

    def start(self) -> "FakeMetadata":
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                split = urlsplit(self.path)
                query = {k: v[-1] for k, v in parse_qs(split.query, keep_blank_values=True).items()}
                req = Req(self.command, split.path, query, {k.lower(): v for k, v in self.headers.items()}, body)
                resp = fake._dispatch(req)
                if resp is None:  # a hang: say nothing, then drop the connection
                    self.close_connection = True
                    return
                self.send_response(resp.status)
                headers = {"Content-Type": "text/plain", **(resp.headers or {})}
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(resp.body)))
                self.end_headers()
                self.wfile.write(resp.body)

            do_GET = do_PUT = do_POST = _serve

        class Server(ThreadingHTTPServer):
            def handle_error(self, request: Any, client_address: Any) -> None:
                # A watcher killed or closed mid-request (a worker's end, a cut long-poll) is not news.
                if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
                    super().handle_error(request, client_address)

        self._server = Server((self.address, self.port), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, args=(SERVE_POLL_S,),
                         name=f"{type(self).__name__}-{self.address}", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._changed()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def _dispatch(self, req: Req) -> Resp | None:
        with self._cond:
            self.requests.append((req.method, req.path))
            self._cond.notify_all()
            fault = next((f for f in self._faults if f.remaining > 0 and f.pattern.search(req.path)), None)
            if fault is not None:
                fault.remaining -= 1
        if fault is not None:
            if fault.resp is None:
                self._stopping.wait(fault.hang_s)
            return fault.resp
        try:
            return self.handle(req)
        except Exception as exc:  # a fake's bug shows up as a 599 in the watcher's log, not a silent hang
            return Resp(599, f"fake error: {exc!r}".encode())


# ----------------------------------------------------------------------------- AWS


class FakeAWSMetadata(FakeMetadata):
    """IMDSv2 with the token flow and the three notice paths."""

    def __init__(self, address: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__(address, port)
        self.tokens: dict[str, float] = {}  # token -> expiry (monotonic)
        self.used_tokens: set[str] = set()  # tokens a read presented while valid: one a watcher (each takes its own)
        self.spot_action: bytes | None = None
        self.rebalance: bytes | None = None
        self.lifecycle_state: str | None = None

    def set_spot_action(self, action: str = "terminate", when: float | None = None) -> None:
        """Publish a Spot interruption notice (``when`` defaults to two minutes from now)."""
        when = time.time() + 120 if when is None else when
        self.set_raw_spot_action(json.dumps({"action": action, "time": aws_time(when)}).encode())

    def set_raw_spot_action(self, body: bytes | None) -> None:
        """Serve ``body`` verbatim at spot/instance-action (None: 404 again)."""
        with self._cond:
            self.spot_action = body
            self._cond.notify_all()

    def set_rebalance(self, when: float | None = None) -> None:
        with self._cond:
            self.rebalance = json.dumps({"noticeTime": aws_time(time.time() if when is None else when)}).encode()
            self._cond.notify_all()

    def set_lifecycle_state(self, state: str | None) -> None:
        with self._cond:
            self.lifecycle_state = state
            self._cond.notify_all()

    def expire_tokens(self) -> None:
        """Every token handed out so far stops working (as after its TTL)."""
        with self._cond:
            self.tokens.clear()

    def handle(self, req: Req) -> Resp:
        if req.path == "/latest/api/token":
            if req.method != "PUT":
                return Resp(405)
            try:
                ttl = int(req.headers.get("x-aws-ec2-metadata-token-ttl-seconds", ""))
            except ValueError:
                return Resp(400)
            if not 1 <= ttl <= 21600:
                return Resp(400)
            token = secrets.token_urlsafe(32)
            with self._cond:
                self.tokens[token] = time.monotonic() + ttl
            return Resp(200, token.encode(), {"X-aws-ec2-metadata-token-ttl-seconds": str(ttl)})
        with self._cond:
            expiry = self.tokens.get(req.headers.get("x-aws-ec2-metadata-token", ""))
            if expiry is None or expiry < time.monotonic():
                return Resp(401)
            self.used_tokens.add(req.headers["x-aws-ec2-metadata-token"])
            served = {
                "/latest/meta-data/spot/instance-action": self.spot_action,
                "/latest/meta-data/events/recommendations/rebalance": self.rebalance,
                "/latest/meta-data/autoscaling/target-lifecycle-state":
                    None if self.lifecycle_state is None else self.lifecycle_state.encode(),
                "/latest/meta-data/instance-id": b"i-0123456789abcdef0",
            }
        if req.method != "GET":
            return Resp(405)
        body = served.get(req.path)
        return Resp(404) if body is None else Resp(200, body)


# ----------------------------------------------------------------------------- GCP


class FakeGCPMetadata(FakeMetadata):
    """GCE metadata with the flavor header check and ``wait_for_change`` long-polls."""

    def __init__(self, address: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__(address, port)
        self.values = {"instance/preempted": "FALSE", "instance/maintenance-event": "NONE"}
        self.versions = {key: 0 for key in self.values}
        self.send_flavor = True
        self.waiting = 0  # long-polls blocked right now

    def set_value(self, key: str, value: str) -> None:
        with self._cond:
            if self.values.get(key) != value:
                self.values[key] = value
                self.versions[key] = self.versions.get(key, 0) + 1
                self._cond.notify_all()

    def set_preempted(self, preempted: bool = True) -> None:
        self.set_value("instance/preempted", "TRUE" if preempted else "FALSE")

    def set_maintenance_event(self, value: str) -> None:
        self.set_value("instance/maintenance-event", value)

    def _etag(self, key: str) -> str:
        return f"{abs(hash(key)) % 10**6:06d}-{self.versions[key]}"

    def handle(self, req: Req) -> Resp:
        if req.headers.get("metadata-flavor") != "Google":
            return Resp(403, b"Missing Metadata-Flavor:Google header.", self._flavor())
        key = req.path.removeprefix("/computeMetadata/v1/")
        with self._cond:
            if key not in self.values:
                return Resp(404, b"not found", self._flavor())
            if req.query.get("wait_for_change") == "true" and "last_etag" in req.query:
                timeout = float(req.query.get("timeout_sec") or 300)
                deadline = time.monotonic() + timeout
                self.waiting += 1
                self._cond.notify_all()
                try:
                    while self._etag(key) == req.query["last_etag"] and not self._stopping.is_set():
                        left = deadline - time.monotonic()
                        if left <= 0:
                            break
                        self._cond.wait(left)
                finally:
                    self.waiting -= 1
            return Resp(200, self.values[key].encode(), {**self._flavor(), "ETag": self._etag(key)})

    def _flavor(self) -> dict[str, str]:
        return {"Metadata-Flavor": "Google"} if self.send_flavor else {}


# --------------------------------------------------------------------------- Azure


class FakeAzureMetadata(FakeMetadata):
    """Azure IMDS: Scheduled Events with acknowledgements, and compute/name."""

    def __init__(self, address: str = "127.0.0.1", port: int = 0, vm_name: str = "workers_0") -> None:
        super().__init__(address, port)
        self.vm_name = vm_name
        self.events: list[dict[str, Any]] = []
        self.incarnation = 1
        self.acks: list[str] = []  # EventIds acknowledged, in order

    def add_event(self, event_type: str = "Preempt", resources: Iterable[str] | None = None,
                  not_before: float | None = None, event_id: str | None = None, **extra: Any) -> str:
        """Schedule an event (for this VM unless ``resources`` says otherwise); returns its EventId."""
        event_id = event_id or secrets.token_hex(4).upper() + "-0000-4000-8000-" + secrets.token_hex(6).upper()
        when = time.time() + 30 if not_before is None else not_before
        event = {
            "EventId": event_id,
            "EventStatus": "Scheduled",
            "EventType": event_type,
            "ResourceType": "VirtualMachine",
            "Resources": list(resources) if resources is not None else [self.vm_name],
            "NotBefore": rfc1123(when),
            "Description": f"fake {event_type}",
            "EventSource": "Platform",
            "DurationInSeconds": -1,
            **extra,
        }
        with self._cond:
            self.events.append(event)
            self.incarnation += 1
            self._cond.notify_all()
        return event_id

    def handle(self, req: Req) -> Resp:
        if req.headers.get("metadata") != "true":
            return Resp(400, b'{"error": "Bad request. Required metadata header not specified"}')
        if req.path == "/metadata/instance/compute/name":
            if req.query.get("format") != "text" or not req.query.get("api-version"):
                return Resp(400)
            return Resp(200, self.vm_name.encode())
        if req.path != "/metadata/scheduledevents" or not req.query.get("api-version"):
            return Resp(404 if req.path != "/metadata/scheduledevents" else 400)
        if req.method == "POST":
            try:
                ids = [r["EventId"] for r in json.loads(req.body)["StartRequests"]]
            except (ValueError, KeyError, TypeError):
                return Resp(400)
            with self._cond:
                self.acks.extend(ids)
                for event in self.events:
                    if event["EventId"] in ids:
                        event.update(EventStatus="Started", NotBefore="")
                self.incarnation += 1
                self._cond.notify_all()
            return Resp(200)
        with self._cond:
            doc = {"DocumentIncarnation": self.incarnation, "Events": self.events}
            return Resp(200, json.dumps(doc).encode(), {"Content-Type": "application/json"})


# ----------------------------------------------------------------------- per host

F = TypeVar("F", bound=FakeMetadata)


@contextmanager
def per_host(factory: Callable[[str, int], F], hosts: Iterable[str], attempts: int = 20) -> Iterator[dict[str, F]]:
    """One fake per host address, all on the same port: ``{host: fake}``.

    ``factory(address, port)`` builds a fake (e.g. ``FakeAWSMetadata``). The
    first binds an ephemeral port; the others take the same port on their own
    address, trying another port if one is taken there. Use with
    ``http://{host}:PORT`` in the endpoint variable (``fakes[h].port``).
    """
    hosts = list(hosts)
    for _ in range(attempts):
        started: list[F] = []
        try:
            first = factory(hosts[0], 0).start()
            started.append(first)
            for host in hosts[1:]:
                started.append(factory(host, first.port).start())
        except OSError:
            for fake in started:
                fake.stop()
            continue
        try:
            yield {fake.address: fake for fake in started}
        finally:
            for fake in started:
                fake.stop()
        return
    raise RuntimeError(f"could not bind one port on all of {hosts}")
