"""The Kubernetes watch's line reader (``providers.kubernetes_watch._lines``) over the bytes a stream hands it.

Hostile review: it joined chunks by concatenation and searched the whole buffer each time, with no bound: a
16 MB line without a newline took 21 s of CPU. Now each byte is looked at once, and a line past
``MAX_LINE`` is a bad line (the watch then starts again from its kept version).
"""

from __future__ import annotations

import pytest

from cloud_elastic.providers.kubernetes_watch import MAX_LINE, _lines

pytestmark = pytest.mark.timeout(30)


class Stream:
    """The bytes of a watch response, in the chunks the connection delivered them."""

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
