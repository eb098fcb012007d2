"""A metadata request's host-name lookup ends by the request's time limit (``notices._polling._addresses``): the
system resolver has no limit of ours, and GCP's watcher reads ``metadata.google.internal`` by name.

A resolver that does not answer cannot be made here without changing the machine's DNS settings, so
``socket.getaddrinfo`` is replaced by one that waits (for this name only); the HTTP service is real."""

from __future__ import annotations

import http.server
import socket
import threading
import time

import pytest

from cloud_elastic.notices._polling import Unreachable, request

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def service():
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = b"TRUE"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_a_lookup_that_does_not_answer_ends_at_the_requests_limit_and_one_that_does_reaches_the_service(
        service, monkeypatch):
    real = socket.getaddrinfo
    answer = threading.Event()
    lookups = []

    def resolver(host, port, *args, **kwargs):
        if host != "metadata.test":
            return real(host, port, *args, **kwargs)
        lookups.append(host)
        answer.wait(30)  # a DNS server that does not answer, until the test lets it
        return real("127.0.0.1", port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", resolver)
    url = f"http://metadata.test:{service}/computeMetadata/v1/instance/preempted"
    began = time.monotonic()
    with pytest.raises(Unreachable, match="looking up metadata.test took longer than the request's time limit"):
        request("GET", url, timeout_s=0.5, what="preempted")
    assert time.monotonic() - began < 5  # the resolver would have held it 30 s
    # The next poll while that lookup still runs starts no second one: one thread at most per name.
    with pytest.raises(Unreachable, match="looking up metadata.test still runs"):
        request("GET", url, timeout_s=0.5, what="preempted")
    assert lookups == ["metadata.test"]
    answer.set()  # the resolver answers: the lookup ends, and the next request reaches the real service
    deadline = time.monotonic() + 10
    while True:
        try:
            got = request("GET", url, timeout_s=2.0, what="preempted")
            break
        except Unreachable:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    assert (got.status, got.text()) == (200, "TRUE")
    assert request("GET", f"http://127.0.0.1:{service}/x", timeout_s=2.0, what="x").status == 200  # no lookup
