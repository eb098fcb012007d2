"""Fuzzing the driver's two parsers of strangers' bytes (issue 44, "How to check"), with hypothesis:
the rendezvous store's (torch's store protocol) and the control plane's (HTTP, the signed JSON codec,
the typed messages). Each server runs in a child process, as in the driver, with its default bounds.

For every input: the server does not crash (the process lives and logs no bug), its memory stays
bounded, and a real worker-side client, signed as a worker's is, is served throughout. Bounded in
time: a fixed number of examples, no hypothesis deadline (the machine is shared), pytest-timeout.
"""

from __future__ import annotations

import json
import secrets
import socket
import struct
import subprocess
import sys
import threading
import time
from datetime import timedelta

import pytest
import torch.distributed as dist
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cloud_elastic.control import MAX_REQUEST, PROTOCOL_VERSION, SIGNATURE_HEADER, Codec, new_secret
from cloud_elastic.driver.net.store_server import (
    MAGIC, MAX_KEY_BYTES, MAX_PAYLOAD_BYTES, MAX_STORE_BYTES, PING, VALIDATE, ProtocolError,
    _command as store_command,
)
from cloud_elastic.worker.link.client import DriverClient
from cloud_elastic.worker.rounds.signed_store import SignedStore

pytestmark = pytest.mark.timeout(300)

#: No example database (no .hypothesis/ folder in the checkout), no deadline (a shared machine).
FUZZ = settings(max_examples=150, deadline=None, database=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

SECRET = new_secret()

_STORE = """
import logging, socket, sys
logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
from cloud_elastic.driver.net.store_server import StoreServer
sock = socket.socket(); sock.bind(("127.0.0.1", 0)); sock.listen(1024)
server = StoreServer(sock).start()
print(server.port, flush=True)
sys.stdin.read()
"""

_CONTROL = """
import logging, sys
logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
from cloud_elastic import protocol
from cloud_elastic.control import Codec
from cloud_elastic.driver.net.control_server import ControlServer
from cloud_elastic.errors import ControlPlaneError

PARSERS = {"rendezvous": protocol.RendezvousRequest.from_wire, "poll": protocol.PollRequest.from_wire,
           "completed": protocol.CompletedReport.from_wire, "stacks": protocol.StacksReport.from_wire,
           "adopt": protocol.AdoptRequest.from_wire}

def handle(kind, message):
    if not isinstance(message.get("worker"), str):
        raise ControlPlaneError("message lacks a worker id")
    if kind in PARSERS:
        PARSERS[kind](message)
    elif kind != "register":
        raise ControlPlaneError(f"unknown message kind {kind!r}")
    return {"ok": True}

server = ControlServer(Codec(sys.argv[1], "fuzz"), handle)
server.start()
print(server.port, flush=True)
sys.stdin.read()
"""


class Child:
    """A server script in a child process: its port, what it logs, its memory."""

    def __init__(self, script: str, *argv: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", script, *argv], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.port = int(self.proc.stdout.readline())
        self.logged: list[str] = []
        threading.Thread(target=lambda: self.logged.extend(iter(self.proc.stderr.readline, "")), daemon=True).start()

    def rss(self) -> int:
        for line in open(f"/proc/{self.proc.pid}/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS")

    def healthy(self) -> None:
        assert self.proc.poll() is None, "\n".join(self.logged)
        bugs = [line for line in self.logged if line.startswith(("ERROR", "CRITICAL")) or "Traceback" in line]
        assert bugs == [], "\n".join(self.logged)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(10)


def _send_and_leave(port: int, data: bytes, chunks: list[int] | None = None) -> None:
    """Send ``data`` (in pieces of the sizes ``chunks`` cycles through) and close without waiting."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # no TIME_WAIT pile-up
        pos, i = 0, 0
        try:
            while pos < len(data):
                n = chunks[i % len(chunks)] if chunks else len(data)
                s.sendall(data[pos:pos + n])
                pos, i = pos + n, i + 1
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server hung up on it: a refusal


# ------------------------------------------------------------------------------------------- the store
def _vec(b: bytes) -> bytes:
    return struct.pack("<Q", len(b)) + b


_small = st.binary(max_size=40)
#: A length prefix: honest, or one that lies (a little, or past every bound).
_length = st.one_of(st.integers(0, 64), st.sampled_from([8 * 1024 + 1, 8 * 1024 * 1024 + 1, 1 << 40, (1 << 64) - 1]))
_field = st.one_of(_small.map(_vec), st.tuples(_length, _small).map(lambda t: struct.pack("<Q", t[0]) + t[1]),
                   st.integers(-(1 << 63), (1 << 63) - 1).map(lambda n: struct.pack("<q", n)))
_command = st.tuples(st.integers(0, 20), st.lists(_field, max_size=5)).map(
    lambda t: bytes([t[0]]) + b"".join(t[1]))
_validated = st.lists(_command, min_size=1, max_size=6).map(
    lambda cs: bytes([VALIDATE]) + struct.pack("<I", MAGIC) + b"".join(cs))
_store_input = st.one_of(st.binary(max_size=300), _validated)


@settings(FUZZ, max_examples=400)
@given(data=st.one_of(st.binary(max_size=200), _command, _validated.map(lambda b: b[5:])), validated=st.booleans())
def test_the_store_parser_finishes_refuses_or_waits_and_asks_for_no_field_past_its_bounds(data, validated):
    """The parser alone, as the server drives it: it asks for its next field's size and gets exactly those
    bytes. It finishes, refuses with ProtocolError, or waits for more; it never asks past a bound."""
    parser = store_command(validated)
    pos = 0
    try:
        need = next(parser)
        while True:
            assert 0 < need <= max(MAX_KEY_BYTES, MAX_PAYLOAD_BYTES)
            if len(data) - pos < need:
                return  # an unfinished command: the server waits for the rest
            field = data[pos:pos + need]
            pos += need
            need = parser.send(field)
    except StopIteration as done:
        command, fields = done.value
        assert isinstance(fields, list) and (validated or command == VALIDATE)
        if not validated:
            assert pos == 5  # VALIDATE and its magic number, nothing else
    except ProtocolError as exc:
        assert exc.kind and str(exc)


@pytest.fixture(scope="module")
def store():
    child = Child(_STORE)
    base = dist.TCPStore("127.0.0.1", child.port, None, False, timeout=timedelta(seconds=30))
    yield child, SignedStore(base, "fuzz-round", SECRET)
    child.close()


@settings(FUZZ, max_examples=200)
@given(data=_store_input, chunks=st.lists(st.integers(1, 64), min_size=1, max_size=4))
def test_the_store_survives_any_bytes_and_serves_a_signed_worker_throughout(store, data, chunks):
    child, worker = store
    _send_and_leave(child.port, data, chunks)
    key = secrets.token_hex(4)
    worker.set(key, b"still served")
    assert worker.get(key) == b"still served"
    child.healthy()
    assert child.rss() < MAX_STORE_BYTES + 128 * 1024 * 1024


_valid_commands = st.lists(st.one_of(
    st.tuples(st.just("set"), _small, _small), st.tuples(st.just("get"), _small),
    st.tuples(st.just("add"), _small, st.integers(-1000, 1000)), st.tuples(st.just("ping"), st.integers(0, 2**32 - 1)),
), min_size=1, max_size=12)


def _encode(commands: list[tuple], prefix: bytes) -> tuple[bytes, int]:
    """Valid store commands on fresh keys: their bytes and how many answer bytes they get."""
    out, answers = b"", 0
    for c in commands:
        if c[0] == "set":
            out += bytes([1]) + _vec(prefix + c[1]) + _vec(c[2])
        elif c[0] == "get":
            out += bytes([3]) + _vec(prefix + b"g" + c[1])  # never set: answered with an empty value
            answers += 8
        elif c[0] == "add":
            out += bytes([4]) + _vec(prefix + b"a" + c[1]) + struct.pack("<q", c[2])
            answers += 8
        else:
            out += bytes([PING]) + struct.pack("<I", c[1])
            answers += 4
    return out, answers


def _answers(port: int, data: bytes, n: int, chunks: list[int]) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(bytes([VALIDATE]) + struct.pack("<I", MAGIC))
        pos, i = 0, 0
        while pos < len(data):
            s.sendall(data[pos:pos + chunks[i % len(chunks)]])
            pos, i = pos + chunks[i % len(chunks)], i + 1
        got = b""
        while len(got) < n:
            chunk = s.recv(n - len(got))
            assert chunk, "the store closed a connection that sent only valid commands"
            got += chunk
        return got


@settings(FUZZ, max_examples=60)
@given(commands=_valid_commands, chunks=st.lists(st.integers(1, 16), min_size=1, max_size=4))
def test_valid_commands_get_the_same_answers_whatever_pieces_their_bytes_arrive_in(store, commands, chunks):
    """The parser resumes where a piece ends (each byte read once): split anywhere, answered the same."""
    child, _ = store
    data, n = _encode(commands, b"w-" + secrets.token_hex(4).encode())
    whole = _answers(child.port, data, n, [len(data)])
    data2, _ = _encode(commands, b"p-" + secrets.token_hex(4).encode())
    assert _answers(child.port, data2, n, chunks) == whole


# ----------------------------------------------------------------------------------- the control plane
@pytest.fixture(scope="module")
def control():
    child = Child(_CONTROL, SECRET)
    yield child, DriverClient(f"127.0.0.1:{child.port}", Codec(SECRET, "fuzz"), "w0")
    child.close()


_token = st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=12)
_http = st.builds(
    lambda method, path, headers, length, body: (
        f"{method} {path} HTTP/1.1\r\n".encode() + b"".join(f"{k}: {v}\r\n".encode() for k, v in headers)
        + (f"Content-Length: {length}\r\n".encode() if length is not None else b"") + b"\r\n" + body),
    st.sampled_from(["POST", "GET", "PUT", "POST\x00"]),
    st.one_of(st.sampled_from(["/v1/poll", "/v1/register", "/v1/", "/"]), _token.map(lambda t: "/v1/" + t)),
    st.lists(st.tuples(_token, _token), max_size=4),
    st.one_of(st.none(), st.integers(-5, 200), st.sampled_from([MAX_REQUEST + 1, 10**30])),
    st.binary(max_size=200),
)
_control_input = st.one_of(st.binary(max_size=400), _http)

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12)
_fields = ["round", "update_gen", "abort_round", "last_round", "reason", "commits", "commit_seq", "progress",
           "steps", "waiting_s", "compute_s", "holds_commit", "rolled_back", "error", "elastic", "request", "text",
           "ranks", "worker", "kind", "ts", "nonce", "v", "job"]


@settings(FUZZ, max_examples=200)
@given(data=_control_input)
def test_the_control_plane_survives_any_bytes_and_serves_a_signed_worker_throughout(control, data):
    child, worker = control
    _send_and_leave(child.port, data)
    assert worker.call("register")["ok"] is True
    child.healthy()
    assert child.rss() < 256 * 1024 * 1024


@FUZZ
@given(kind=st.sampled_from(["register", "rendezvous", "poll", "completed", "stacks", "adopt"]),
       message=st.dictionaries(st.sampled_from(_fields), _json, max_size=10),
       ts=st.one_of(st.none(), st.sampled_from([float("nan"), float("inf"), -1e308, 10**400])))
def test_a_signed_message_with_any_fields_is_answered_or_refused_never_a_driver_bug(control, kind, message, ts):
    """What only a holder of the job secret can send (a buggy or newer worker): 200 or a 4xx, never a 500."""
    child, worker = control
    body_obj = {"worker": "w1", **message, "v": PROTOCOL_VERSION, "job": "fuzz", "kind": kind,
                "nonce": secrets.token_hex(8), "ts": time.time() if ts is None else ts}
    body = json.dumps(body_obj).encode()
    signature = Codec(SECRET, "fuzz").sign(body)
    with socket.create_connection(("127.0.0.1", child.port), timeout=30) as s:
        s.sendall(f"POST /v1/{kind} HTTP/1.1\r\nContent-Length: {len(body)}\r\n{SIGNATURE_HEADER}: {signature}\r\n"
                  "Connection: close\r\n\r\n".encode() + body)
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    status = int(answer.split(b" ", 2)[1])
    assert status == 200 or 400 <= status < 500, answer[:300]
    if ts is not None:
        assert status == 401 or status == 400, answer[:300]  # no finite time: refused at the replay window
    assert worker.call("register")["ok"] is True
    child.healthy()
