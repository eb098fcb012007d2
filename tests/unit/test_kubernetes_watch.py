"""The Kubernetes watch (``providers.kubernetes_watch``) over responses a test hands it: its line reader, its
list's bounds, and when an outage ends.

Hostile review: it joined chunks by concatenation and searched the whole buffer each time, with no bound: a
16 MB line without a newline took 21 s of CPU. Now each byte is looked at once, and a line past
``MAX_LINE`` is a bad line (the watch then starts again from its kept version). And a list followed
continue tokens forever, keeping every item and reading each page whole: a server whose list never ends
took the driver from 95 MiB to 800 MiB in 30 s, with no output. And a watch answered 200 ended its outage,
so one accepted and then failed at once (an ERROR event) restarted the clock at each retry: never stale.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from types import SimpleNamespace

import pytest

from cloud_elastic.providers import kubernetes_watch
from cloud_elastic.providers.kubernetes_watch import (LIST_TIMEOUTS, MAX_ITEMS, MAX_LINE, MAX_PAGE, MAX_PAGES,
                                                      PAGE_SIZE, ListTooLarge, ListTooSlow, ResourceWatch, _lines)

pytestmark = pytest.mark.timeout(30)


class Stream:
    """The bytes of a watch response, in the chunks the connection delivered them."""

    chunked = True  # as the API server sends a watch

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    def stream(self, amt=None, decode_content=False):
        yield from self.chunks


def test_events_split_anywhere_across_chunks_come_out_whole_and_in_order():
    events = [b'{"type":"ADDED","n":%d}' % i for i in range(50)]
    data = b"\n".join(events) + b"\n\n"
    chunks = [data[i:i + 7] for i in range(0, len(data), 7)]
    assert list(_lines(Stream(chunks))) == events
    assert list(_lines(Stream([b'{"a":1}\n{"b":2}']))) == [b'{"a":1}', b'{"b":2}']  # the last line, unended


def test_a_line_without_end_is_refused_past_the_bound():
    chunk = b"x" * 65536
    with pytest.raises(ValueError, match=f"longer than {MAX_LINE} bytes"):
        list(_lines(Stream([chunk] * (MAX_LINE // len(chunk) + 2))))


class Response(Stream):
    """A list page's or a watch's response: whether it was read to its end and handed back, or closed mid-way."""

    released = closed = False

    def release_conn(self):
        self.released = True

    def close(self):
        self.closed = True


def page(items: int, token: str | None = "more") -> Response:
    meta = {"resourceVersion": "7", **({"continue": token} if token else {})}
    return Response([json.dumps({"metadata": meta, "items": [{"n": i} for i in range(items)]}).encode()])


def pods_watch(call, timeout_s: float = 10.0) -> ResourceWatch:
    """A pods watch whose requests ``call(**kwargs)`` answers, feeding no view."""
    return ResourceWatch("pods", call, replace=lambda items: False, apply=lambda kind, obj: False,
                         lock=threading.Lock(), on_news=lambda: None, timeout_s=timeout_s)


def listing(pages, timeout_s: float = 10.0) -> tuple[ResourceWatch, list[dict]]:
    """A pods watch whose list requests are answered by ``pages`` (an iterator of responses), and the requests."""
    calls: list[dict] = []

    def call(**kwargs):
        calls.append(kwargs)
        return next(pages)

    return pods_watch(call, timeout_s), calls


def test_a_list_in_pages_comes_whole_and_each_connection_goes_back_to_the_pool():
    pages = [page(PAGE_SIZE), page(3, token=None)]
    watch, calls = listing(iter(pages))
    items, version = watch.list_all()
    assert len(items) == PAGE_SIZE + 3 and version == "7"
    assert [c.get("_continue") for c in calls] == [None, "more"]
    assert all(p.released and not p.closed for p in pages)


@pytest.mark.parametrize("per_page, requests, why", [
    (PAGE_SIZE, MAX_ITEMS // PAGE_SIZE + 1, f"more than {MAX_ITEMS} objects"),
    (0, MAX_PAGES, f"no end after {MAX_PAGES} pages"),
], ids=["full-pages", "empty-pages"])
def test_a_list_whose_continue_tokens_never_end_stops_at_its_bound(per_page, requests, why):
    watch, calls = listing(page(per_page) for _ in itertools.count())
    with pytest.raises(ListTooLarge, match=why):
        watch.list_all()
    assert len(calls) == requests


def test_a_page_without_end_is_refused_past_max_page_and_its_connection_is_not_reused():
    endless = Response(itertools.repeat(b" " * 65536))
    watch, _ = listing(iter([endless]))
    with pytest.raises(ListTooLarge, match=f"a page larger than {MAX_PAGE} bytes"):
        watch.list_all()
    assert endless.closed


def test_a_list_that_trickles_ends_at_its_deadline():
    def trickle():
        while True:
            time.sleep(0.01)
            yield b" "

    started = time.monotonic()
    watch, _ = listing(iter([Response(trickle())]), timeout_s=0.05)
    with pytest.raises(ListTooSlow, match=f"no end within 0.3 s \\({LIST_TIMEOUTS} x timeout_s\\), at page 1"):
        watch.list_all()
    assert time.monotonic() - started < 5


FAILED = {"type": "ERROR", "object": {"kind": "Status", "code": 500, "reason": "InternalError",
                                      "message": "etcdserver: request timed out"}}
BOOKMARK = {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "9"}}}
DOWN = (1010.0, "WatchError: 500 InternalError: etcdserver: request timed out")


def troubles(monkeypatch, streams: list[list[dict]]) -> tuple[list, ResourceWatch]:
    """What trouble() says at each request of a pods watch whose request n, at 1000 + 10 n, streams the events
    ``streams[n - 1]`` and ends (the request after the last is refused); and the watch."""
    clock = SimpleNamespace(now=1000.0)
    monkeypatch.setattr(kubernetes_watch, "time", SimpleNamespace(time=lambda: clock.now, monotonic=time.monotonic))
    monkeypatch.setattr(kubernetes_watch, "_BACKOFF_FIRST_S", 0.01)
    seen, done, gate = [], threading.Event(), threading.Event()

    def answer(**_):
        clock.now += 10
        seen.append(watch.trouble())
        if len(seen) > len(streams):
            done.set()
            gate.wait(10)
            raise ConnectionRefusedError("the test is over")
        return Response([json.dumps(event).encode() + b"\n" for event in streams[len(seen) - 1]])

    watch = pods_watch(answer)
    watch.start()
    try:
        assert done.wait(10)
    finally:
        gate.set()
        watch.stop()
    return seen, watch


def test_a_watch_accepted_then_failed_goes_on_with_its_outage_until_a_stream_shows_it_is_healthy(monkeypatch):
    """An API server that answers 200 and then an ERROR event (etcd's 500) is down from the first failure: before,
    each 200 ended the outage, so find() compared stale_after_s with the last retry and never failed."""
    seen, watch = troubles(monkeypatch, [[FAILED], [FAILED], [BOOKMARK]])
    assert seen == [None, DOWN, DOWN, None]  # down from the first failure, until the bookmark
    assert watch.resource_version == "9"


def test_a_watch_that_ends_at_once_with_nothing_does_not_end_the_outage(monkeypatch):
    """A 200 whose stream ends at once with no line (a proxy or server that will not hold a watch) has shown
    nothing: before, its clean end counted as healthy, so an API server failing every other request was never
    reported stale."""
    seen, _ = troubles(monkeypatch, [[FAILED], [], [FAILED], [], [BOOKMARK]])
    assert seen == [None, DOWN, DOWN, DOWN, DOWN, None]  # down from the first failure, until the bookmark


def _node(i: int) -> dict:
    """A node as a real cluster lists it, ~8 KiB: 40 images of long names, labels, conditions."""
    return {"metadata": {"name": f"node-{i}", "resourceVersion": str(i),
                         "labels": {f"label.example.com/{k}": "x" * 40 for k in range(10)}},
            "spec": {"taints": []},
            "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
                       "images": [{"names": [f"registry.example.com/team/image-{i}-{k}@sha256:" + "a" * 64],
                                   "sizeBytes": 123456789} for k in range(40)]}}


def _node_pages(pages: int, per_page: int) -> list[Response]:
    return [Response([json.dumps({"metadata": {"resourceVersion": "9", **({"continue": "t"} if p < pages - 1 else {})},
                                  "items": [_node(p * per_page + i) for i in range(per_page)]}).encode()])
            for p in range(pages)]


def test_a_list_reads_each_page_into_the_views_records_as_it_comes():
    """Review s64 rvK finding 3: a list held every page's JSON until the last page came (1 GiB for 16,000
    realistic nodes). Each page is now read into the view's records as it arrives: when page k is asked for,
    pages 1..k-1 are records already, and the list's peak memory is a page's, not the whole cluster's."""
    import tracemalloc

    from cloud_elastic.providers.kubernetes_view import ClusterView, NodeRecord

    def peak_of_listing(read) -> tuple[int, list, list[int]]:
        view, lock, answers = ClusterView("test"), threading.Lock(), iter(_node_pages(6, 150))
        read_before_each_request: list[int] = []
        seen: list[int] = []

        def call(**_):
            read_before_each_request.append(sum(seen))
            return next(answers)

        def counted(objs):
            seen.append(len(objs))
            return read(view, objs)

        watch = ResourceWatch("nodes", call, replace=view.replace_nodes, apply=view.apply_node, lock=lock,
                              on_news=lambda: None, read=counted)
        tracemalloc.start()
        try:
            items, _ = watch.list_all()
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        return peak, items, read_before_each_request

    peak, items, before = peak_of_listing(lambda view, objs: view.read("node", objs))
    assert before == [0, 150, 300, 450, 600, 750]  # each page read before the next is asked for
    assert len(items) == 900 and all(isinstance(record, NodeRecord) for record, _ in items)
    raw_peak, raw, _ = peak_of_listing(lambda view, objs: list(objs))  # the pages' JSON kept, as before
    assert len(raw) == 900 and isinstance(raw[0], dict)
    assert peak < raw_peak / 2, (peak, raw_peak)
