"""A worker's output outlives its reader: a broken pipe to a dead driver must not stop training."""

from __future__ import annotations

import io
import os

import pytest

from cloud_elastic.errors import ConfigError
from cloud_elastic.worker.link.driver_link import _SurvivingStream
from cloud_elastic.worker.settings import WorkerSettings

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
])
def test_the_driver_grace_comes_from_the_driver(environ, grace):
    assert WorkerSettings.from_environ(environ).driver_grace_s == grace  # default: 3 heartbeat timeouts of 5 s


def test_a_bad_driver_grace_is_a_one_line_error():
    with pytest.raises(ConfigError, match="CLOUD_ELASTIC_DRIVER_GRACE_S='x': not a number"):
        WorkerSettings.from_environ({"CLOUD_ELASTIC_DRIVER_GRACE_S": "x"})
