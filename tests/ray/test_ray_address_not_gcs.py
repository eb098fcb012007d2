"""``--ray-address`` at a port where something other than a Ray cluster's GCS listens (the dashboard and Jobs
API's 8265, which ``ray job submit`` users put in RAY_ADDRESS) is a one-line error, not minutes of ``ray.init``
retries (review s54, 6dc94fb: the TCP connect alone passed, and the run was still going after 75 s)."""

from __future__ import annotations

import http.server
import socket
import subprocess
import sys
import threading

import pytest

from cloud_elastic.errors import ConfigError
from tests.ray.conftest import REPO

pytestmark = [pytest.mark.ray, pytest.mark.timeout(120)]

NOT_GCS = "what answers there is not a Ray cluster's GCS port"


@pytest.fixture
def http_port():
    """An HTTP server on loopback, as the dashboard is."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_an_http_server_at_the_ray_address_is_a_one_line_error(http_port: int) -> None:
    pytest.importorskip("ray")
    address = f"127.0.0.1:{http_port}"
    out = subprocess.run(
        [sys.executable, "-m", "cloud_elastic.cli", "run", "--ray-address", address, "-np", "1", "python", "x.py"],
        cwd=REPO, capture_output=True, text=True, timeout=90, stdin=subprocess.DEVNULL,
    )
    lines = out.stderr.strip().splitlines()
    assert (out.returncode, len(lines)) == (2, 1), out.stderr[-2000:]
    assert lines[0].startswith(f"cloud-elastic: error: cannot connect to the Ray cluster at {address!r}")
    assert NOT_GCS in lines[0] and "6379" in lines[0]


def test_a_listener_that_never_answers_is_refused_within_the_timeout() -> None:
    pytest.importorskip("ray")
    from cloud_elastic.ray.executor import check_reachable

    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts (the kernel's backlog), never answers
        with pytest.raises(ConfigError, match=NOT_GCS):
            check_reachable(f"127.0.0.1:{silent.getsockname()[1]}", timeout_s=1.0)


def test_a_real_cluster_s_gcs_passes_the_check(ray_cluster) -> None:
    from cloud_elastic.ray.executor import check_reachable

    check_reachable(ray_cluster.cluster.address, timeout_s=10.0)
