"""Streams that are never quiet but never useful, through the real ``kubernetes`` client, over HTTP, against the
fake API server (``tests/emulator/fake_kubernetes.py``) or, for a list whose body trickles in, a server of a few
lines below.

Review s61 rvK: a pods watch that trickled a newline every 2 s was never cut (every byte reset the read timeout),
so the driver never reconnected and a healthy job failed ("host discovery kept failing for 45s"); a list whose
body came a byte a second ran past 60 s against its documented 12 s bound; a watch answered 410 Gone right after
each relist relisted ~15 times a second; a watch answered with a List (a proxy that drops ?watch=true) counted as
healthy: 43 requests a second, a new pod never seen, no error. And a cluster of more nodes than a list keeps
failed at start with no word of ``-o node_selector``.

Review s62 rvH2: a watch was read a whole chunk at a time (or, not chunked, to its end), so a server that sent one
huge line made the driver hold all of it (512 MiB in 0.5 s) before the line bound was checked; and the client reads
the whole body of an error answer (a 503 with 256 MiB took the driver's RSS up by 512 MiB).
"""

from __future__ import annotations

import json
import re
import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from cloud_elastic.errors import FatalDiscoveryError, RetryableDiscoveryError
from cloud_elastic.providers.kubernetes_watch import MAX_ITEMS, MAX_LINE, PAGE_SIZE
from tests.emulator.fake_kubernetes import TOKEN, kubernetes, kubernetes_options, kubernetes_server  # noqa: F401
from tests.emulator.fixtures import hermetic_cloud_env, provider  # noqa: F401
from tests.emulator.httpfake import CutStream, Reply
from tests.emulator.test_kubernetes import watched  # noqa: F401
from tests.kubernetes.test_watch_outages import _find_until

pytestmark = pytest.mark.timeout(60)



def _pod_watches(kubernetes, ns: str) -> int:
    return kubernetes.count(re.escape(f"/namespaces/{ns}/pods?watch"))


def _pod_lists(kubernetes, ns: str) -> int:
    return kubernetes.count(f"/namespaces/{ns}/pods$")


def _deletion_seen_past(kubernetes, watched, ns: str, ip: str, over: threading.Event) -> None:
    """Pod p0 of ``ns`` (at ``ip``), deleted while the first pods watch of ``ns`` is a bad one, is seen deleted
    through a later watch; ``over`` is set at the end, whatever happened."""
    try:
        w = watched(ns, watch_s="1", stale_after_s="30")  # timeoutSeconds 1: cut 4 s after it opened
        kubernetes.delete_pod("p0", grace_s=120, namespace=ns)  # what the bad stream never brings
        snapshot = _find_until(w.discovery, lambda r: not isinstance(r, Exception) and ip in r.draining,
                               "the deletion, through a new watch", 20)
    finally:
        over.set()
    assert snapshot.draining[ip].reason == "pod deleted"


def _trickle(over: threading.Event, data: bytes, every_s: float):
    """A watch body that sends ``data`` a piece at a time, ``every_s`` apart, until ``over`` (then cut)."""
    piece = 0
    while not over.wait(every_s):
        yield data[piece % len(data):piece % len(data) + 1] if len(data) > 1 else data
        piece += 1
    raise CutStream()


@pytest.mark.parametrize("data", [b"\n", json.dumps({"type": "BOOKMARK", "object": {}}).encode() * 100],
                         ids=["blank-lines", "a-line-byte-by-byte"])
def test_a_watch_that_trickles_is_cut_and_reopened_and_the_change_behind_it_is_seen(kubernetes, watched,
                                                                                    monkeypatch, data):
    ns = f"ns-trickle-{len(data)}"
    kubernetes.add_pod("p0", "10.76.0.1", namespace=ns, node="trickle-n")
    serve, over, trickled = kubernetes._watch, threading.Event(), []

    def proxy(request, resource, where, match):  # the first pods watch of this namespace trickles
        if resource == "pods" and where == ns and not trickled:
            trickled.append(time.monotonic())
            return Reply(200, stream=_trickle(over, data, 0.2))
        return serve(request, resource, where, match)

    monkeypatch.setattr(kubernetes, "_watch", proxy)
    _deletion_seen_past(kubernetes, watched, ns, "10.76.0.1", over)
    assert len(trickled) == 1 and _pod_watches(kubernetes, ns) >= 2


def test_a_watch_answered_with_a_list_is_a_warned_failure_with_back_off_until_one_answers_with_events(
        kubernetes, watched, monkeypatch, caplog):
    ns = "ns-watch-gets-list"
    kubernetes.add_pod("p0", "10.77.0.1", namespace=ns, node="list-n")
    serve = kubernetes._watch

    def proxy(request, resource, where, match):  # drops ?watch=true: the pods watch gets the list
        if resource == "pods" and where == ns:
            return kubernetes._serve(type(request)(request.method, request.path, {}, request.headers, b""),
                                     resource, where)
        return serve(request, resource, where, match)

    caplog.set_level(logging.INFO, logger="cloud_elastic.providers.kubernetes_watch")
    monkeypatch.setattr(kubernetes, "_watch", proxy)
    w = watched(ns, stale_after_s="2")
    started = time.monotonic()
    kubernetes.add_pod("p1", "10.77.0.2", namespace=ns, node="list-n")  # only a watch would bring it
    error = _find_until(w.discovery, lambda r: isinstance(r, RetryableDiscoveryError), "discovery failing", 15)
    assert "the pods watch has been down for" in str(error) and "not a watch event (a PodList" in str(error)
    time.sleep(max(0.0, 6 - (time.monotonic() - started)))
    # Back-off 0.5 s doubling: about 5 requests in 6 s, where there were hundreds.
    assert _pod_watches(kubernetes, ns) <= 8
    warned = [r for r in caplog.records if r.levelno == logging.WARNING and "not a watch event" in r.getMessage()]
    assert len(warned) == 1 and warned[0].getMessage().startswith("pods watch:"), caplog.text

    monkeypatch.setattr(kubernetes, "_watch", serve)
    snapshot = _find_until(w.discovery, lambda r: not isinstance(r, Exception) and "10.77.0.2" in r.ready,
                           "the watch back, with the new pod", 45)
    assert "10.77.0.1" in snapshot.ready


@pytest.mark.parametrize("how", ["error-event", "http-410"])
def test_watches_answered_410_after_each_relist_relist_with_back_off_and_the_view_still_follows(
        kubernetes, watched, monkeypatch, caplog, how):
    ns = f"ns-gone-storm-{how}"
    kubernetes.add_pod("p0", "10.78.0.1", namespace=ns, node="gone-n")
    serve = kubernetes._watch
    expired = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Expired", "code": 410,
               "message": "too old resource version"}

    def proxy(request, resource, where, match):  # a watch cache that cannot serve the list's own version
        if resource == "pods" and where == ns:
            if how == "http-410":
                return Reply(410, expired)
            return Reply(200, stream=iter([json.dumps({"type": "ERROR", "object": expired}).encode() + b"\n"]))
        return serve(request, resource, where, match)

    caplog.set_level(logging.INFO, logger="cloud_elastic.providers.kubernetes_watch")
    monkeypatch.setattr(kubernetes, "_watch", proxy)
    w = watched(ns)
    started = time.monotonic()
    kubernetes.add_pod("p1", "10.78.0.2", namespace=ns, node="gone-n")  # seen at a relist
    snapshot = _find_until(w.discovery, lambda r: not isinstance(r, Exception) and "10.78.0.2" in r.ready,
                           "the new pod, through a relist", 15)
    assert "10.78.0.1" in snapshot.ready
    time.sleep(max(0.0, 6 - (time.monotonic() - started)))
    # The first 410 relists at once, then 0.5, 1, 2 s (± 25%) apart: at most 5 lists in 6 s, where there were ~90.
    assert 2 <= _pod_lists(kubernetes, ns) - 1 <= 6
    warned = [r for r in caplog.records if r.levelno == logging.WARNING and "410 Gone" in r.getMessage()]
    assert len(warned) == 1 and warned[0].getMessage().startswith("pods watch: 3 watches in a row"), caplog.text
    w.discovery.find()  # with the defaults the back-off stays inside the silence bound: no outage reported


def _flood(head: bytes, total: int, sent: list[int], over: threading.Event):
    """``head``, then ``total`` bytes with no newline in 64 KiB pieces (``sent`` counts those written), then
    silence until ``over``."""
    yield head
    piece = b"x" * (1 << 16)
    for _ in range(total // len(piece)):
        yield piece
        sent[0] += len(piece)  # the server asks for the next piece once this one is written
    over.wait(30)
    raise CutStream()


#: One chunk that says it is 1 GiB long, or a body with no chunked encoding, ended only by the connection's close.
_HUGE = {"one-huge-chunk": ({"Transfer-Encoding": "chunked"}, b"%x\r\n" % (1 << 30)),
         "no-chunked-encoding": ({"Connection": "close"}, b"")}


@pytest.mark.parametrize("how", list(_HUGE))
def test_a_watch_line_past_the_bound_is_refused_after_reading_little_more_and_the_watch_goes_on(
        kubernetes, watched, monkeypatch, caplog, how):
    ns = f"ns-flood-{how}"
    kubernetes.add_pod("p0", "10.80.0.1", namespace=ns, node="flood-n")
    serve, over, sent, flooded = kubernetes._watch, threading.Event(), [0], []
    headers, head = _HUGE[how]
    total = 32 * MAX_LINE  # 128 MiB, sent as fast as the driver reads it

    def proxy(request, resource, where, match):  # the first pods watch of this namespace floods
        if resource == "pods" and where == ns and not flooded:
            flooded.append(request)
            return Reply(200, headers=headers, framed=True, stream=_flood(head, total, sent, over))
        return serve(request, resource, where, match)

    caplog.set_level(logging.INFO, logger="cloud_elastic.providers.kubernetes_watch")
    monkeypatch.setattr(kubernetes, "_watch", proxy)
    _deletion_seen_past(kubernetes, watched, ns, "10.80.0.1", over)
    # Read whole, the driver held all of it (512 MiB in 0.5 s, review s62 rvH2). Now: the line bound and a piece,
    # plus what the sockets' buffers took before the connection was closed (Linux grows a receive buffer up to
    # tcp_rmem's 32 MiB at most, a send buffer to 4 MiB): 6-10 MiB seen here.
    assert sent[0] <= 12 * MAX_LINE, f"{sent[0] >> 20} MiB sent before the driver let go"
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warned == [f"pods watch: NotAnEvent: the watch was answered with a line longer than {MAX_LINE} bytes, "
                      "which no watch event is (the API server keeps an object under 1.5 MiB); retrying with "
                      "back-off, and no change reaches the view until a watch is answered with events"], caplog.text


@pytest.mark.parametrize("framing", ["content-length", "until-close"])
def test_a_watch_answered_with_an_error_and_a_huge_body_reads_little_of_it_and_the_watch_goes_on(
        kubernetes, watched, monkeypatch, framing):
    ns = f"ns-error-body-{framing}"
    kubernetes.add_pod("p0", "10.85.0.1", namespace=ns, node="error-body-n")
    serve, over, sent, answered = kubernetes._watch, threading.Event(), [0], []
    total = 32 * MAX_LINE
    headers = {"Content-Length": str(total)} if framing == "content-length" else {"Connection": "close"}

    def proxy(request, resource, where, match):  # the first pods watch of this namespace: 503, and 128 MiB
        if resource == "pods" and where == ns and not answered:
            answered.append(request)
            return Reply(503, headers=headers, framed=True, stream=_flood(b"", total, sent, over))
        return serve(request, resource, where, match)

    monkeypatch.setattr(kubernetes, "_watch", proxy)
    _deletion_seen_past(kubernetes, watched, ns, "10.85.0.1", over)
    # The client read such a body whole into its error (256 MiB: RSS + 512 MiB with a Content-Length).
    assert sent[0] <= 12 * MAX_LINE, f"{sent[0] >> 20} MiB sent before the driver let go"


def test_a_list_answered_with_an_error_and_a_huge_body_fails_in_one_line_having_read_little(kubernetes, monkeypatch):
    ns = "ns-error-body-list"
    serve, over, sent = kubernetes._serve, threading.Event(), [0]

    def proxy(request, resource, where):
        if resource == "pods" and where == ns:
            return Reply(503, headers={"Connection": "close"}, framed=True,
                         stream=_flood(b"", 32 * MAX_LINE, sent, over))
        return serve(request, resource, where)

    monkeypatch.setattr(kubernetes, "_serve", proxy)
    discovery = provider("kubernetes", kubernetes_options(kubernetes, ns))
    try:
        with pytest.raises(RetryableDiscoveryError, match="^kubernetes pods 'app=llm': listing pods: HTTP 503 ") as err:
            discovery.find()
    finally:
        over.set()
        discovery.close()
    assert "\n" not in str(err.value) and len(str(err.value)) < 400
    assert sent[0] <= 12 * MAX_LINE, f"{sent[0] >> 20} MiB sent before the driver let go"


class _TrickledList(BaseHTTPRequestHandler):
    """A pods list whose body (with a Content-Length) comes one byte every 0.1 s."""

    protocol_version = "HTTP/1.1"
    body = json.dumps({"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "1"},
                       "items": [{"metadata": {"name": f"p{i}"}} for i in range(100)]}).encode()

    def log_message(self, *args):
        pass

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        try:
            for i in range(len(self.body)):
                self.wfile.write(self.body[i:i + 1])
                self.wfile.flush()
                time.sleep(0.1)
        except OSError:  # the client shut the connection
            pass


def test_a_list_whose_body_trickles_in_fails_at_its_deadline(tmp_path, kubernetes):
    import kubernetes as _client  # noqa: F401  (imported before the clock starts: its import takes seconds)

    server = ThreadingHTTPServer(("127.0.0.1", 0), _TrickledList)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        config = tmp_path / "kubeconfig"
        url = f"http://127.0.0.1:{server.server_address[1]}"
        config.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "t",
            "clusters": [{"name": "t", "cluster": {"server": url}}], "users": [{"name": "u", "user": {"token": TOKEN}}],
            "contexts": [{"name": "t", "context": {"cluster": "t", "user": "u"}}]}))
        discovery = provider("kubernetes", {"selector": "app=llm", "namespace": "ns-slow-list",
                                            "kubeconfig": str(config), "timeout_s": "0.5"})
        started = time.monotonic()
        with pytest.raises(RetryableDiscoveryError, match=r"listing pods: no end within 3 s \(6 x timeout_s\)"):
            discovery.find()
        took = time.monotonic() - started
        discovery.close()
    finally:
        server.shutdown()
        server.server_close()
    assert 3 <= took < 15, took  # the body alone takes ~0.1 s a byte: minutes


def test_more_nodes_than_a_list_keeps_is_fatal_and_names_node_selector_which_then_works(kubernetes, monkeypatch):
    ns = "ns-many-nodes"
    kubernetes.add_node("pool-gpu-n1")
    kubernetes.add_pod("p0", "10.79.0.1", namespace=ns, node="pool-gpu-n1")
    serve = kubernetes._serve
    node = {"metadata": {"name": "n", "resourceVersion": "1", "labels": {}}, "spec": {}}
    unending = {"kind": "NodeList", "apiVersion": "v1", "metadata": {"resourceVersion": "1", "continue": "more"},
                "items": [node] * PAGE_SIZE}

    def huge_cluster(request, resource, where):  # more nodes than a list keeps, unless a selector narrows them
        if resource == "nodes" and not request.query.get("labelSelector") and request.query.get("watch") is None:
            return Reply(200, unending)
        return serve(request, resource, where)

    monkeypatch.setattr(kubernetes, "_serve", huge_cluster)
    discovery = provider("kubernetes", kubernetes_options(kubernetes, ns))
    with pytest.raises(FatalDiscoveryError, match=f"listing nodes: more than {MAX_ITEMS} objects.*-o node_selector"):
        discovery.find()
    discovery.close()

    selected = provider("kubernetes", kubernetes_options(kubernetes, ns,
                                                         node_selector="kubernetes.io/hostname=pool-gpu-n1"))
    try:
        assert dict(selected.find().ready) == {"10.79.0.1": 1}
    finally:
        selected.close()
