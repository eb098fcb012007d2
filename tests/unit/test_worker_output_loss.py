"""A worker's output outlives its reader: a broken pipe to a dead driver must not stop training."""

from __future__ import annotations

import io
import os

import pytest

from cloud_elastic.worker.context import _driver_grace_s, _SurvivingStream

pytestmark = pytest.mark.timeout(10)


def test_writes_after_the_reader_died_are_dropped_and_training_goes_on():
    read_fd, write_fd = os.pipe()
    stream = _SurvivingStream(io.TextIOWrapper(io.FileIO(write_fd, "w"), line_buffering=True))
    print("before", file=stream, flush=True)
    assert os.read(read_fd, 100) == b"before\n"
    os.close(read_fd)  # the driver died
    for i in range(3):
        print(f"step {i}", file=stream, flush=True)  # would raise BrokenPipeError unwrapped
    assert os.readlink(f"/proc/self/fd/{write_fd}") == os.devnull
    stream.close()


@pytest.mark.parametrize("environ, grace", [
    ({}, 15.0), ({"CLOUD_ELASTIC_DRIVER_GRACE_S": "60"}, 60.0), ({"CLOUD_ELASTIC_DRIVER_GRACE_S": "0"}, 0.0),
    ({"CLOUD_ELASTIC_DRIVER_GRACE_S": "x"}, 15.0),
])
def test_the_driver_grace_comes_from_the_driver(environ, grace):
    assert _driver_grace_s(environ, heartbeat_timeout_s=5.0) == grace
