"""The driver's endpoints (cloud_elastic.driver.net.endpoints): both servers and the codec, one lifecycle."""

from __future__ import annotations

import http.client
import json
import resource
import signal
import socket
import subprocess
import sys
import time

import pytest

from cloud_elastic.control import SIGNATURE_HEADER, SIGNED_BEFORE_START, Codec, new_secret
from cloud_elastic.driver.net.endpoints import Endpoints
from cloud_elastic.worker.link.client import DriverClient

pytestmark = pytest.mark.timeout(30)


def _refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


def test_a_signed_request_is_answered_and_close_stops_both_servers_once() -> None:
    seen: list[str] = []
    endpoints = Endpoints("j1", lambda kind, msg: seen.append(kind) or {"ok": True})
    assert not endpoints.started
    secret = new_secret()
    endpoints.start("127.0.0.1", advertised="10.0.0.5", secret=secret)
    try:
        assert endpoints.started and endpoints.advertised == "10.0.0.5" and endpoints.secret == secret
        client = DriverClient(f"127.0.0.1:{endpoints.control_port}", Codec(secret, "j1"), "w1")
        assert client.call("register")["ok"] is True and seen == ["register"]
        client.close()
        with socket.create_connection(("127.0.0.1", endpoints.store_port), timeout=2):
            pass  # the rendezvous store accepts
    finally:
        control, store = endpoints.control_port, endpoints.store_port
        endpoints.close()
        endpoints.close()  # idempotent
    assert _refused(control) and _refused(store)
    assert not endpoints.started


def test_a_driver_adopting_with_its_predecessors_secret_refuses_a_replay_and_a_lagging_worker_signs_again() -> None:
    """Hostile review: a worker's signed ``completed``, captured while the predecessor ran, was replayed to the
    driver restarted on its secret, and its handler ran. The worker itself, on a clock behind the driver's, is
    refused once, then signs from the driver's start, which the refusal names: its call is not lost."""
    secret = new_secret()
    body, signature = Codec(secret, "j1", clock=lambda: time.time() - 1).encode("completed", {"worker": "w1"})
    seen: list[str] = []
    endpoints = Endpoints("j1", lambda kind, msg: seen.append(kind) or {"ok": True})
    endpoints.start("127.0.0.1", advertised="127.0.0.1", secret=secret)  # as an adopting driver does
    try:
        conn = http.client.HTTPConnection("127.0.0.1", endpoints.control_port, timeout=10)
        conn.request("POST", "/v1/completed", body, {SIGNATURE_HEADER: signature})
        resp = conn.getresponse()
        assert resp.status == 400 and json.loads(resp.read())["error"].startswith(f"{SIGNED_BEFORE_START} at ")
        conn.close()
        assert seen == []
        # 60 s behind: longer than the adoption window (10 s) and the call's time. It signed again every 0.2 s
        # until its clock passed the driver's start, and was given up as lost meanwhile; it now signs from the
        # start the refusal names, at once.
        lagging = DriverClient(f"127.0.0.1:{endpoints.control_port}",
                               Codec(secret, "j1", clock=lambda: time.time() - 60), "w1")
        assert lagging.call("completed", timeout_s=10)["ok"] is True and seen == ["completed"]
        assert lagging.call("completed", timeout_s=10)["ok"] is True  # and goes on signing from there
        lagging.close()
    finally:
        endpoints.close()


def test_a_taken_control_port_leaves_nothing_listening() -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        with socket.socket() as probe:  # a free port for the store, to see it closed again
            probe.bind(("127.0.0.1", 0))
            store_port = probe.getsockname()[1]
        endpoints = Endpoints("j1", lambda kind, msg: {"ok": True})
        with pytest.raises(OSError):
            endpoints.start("127.0.0.1", advertised="127.0.0.1", control_port=port, store_port=store_port)
    assert not endpoints.started and _refused(store_port)
    assert len(endpoints.secret) >= 32  # a fresh secret when none is given


#: Endpoints started as the driver starts them, in a process whose descriptor limits are argv's (soft, hard),
#: for a job of argv[3] workers; it logs what it did and prints its limit and the store's share of it.
_START = """
import logging, resource, sys
logging.basicConfig(level=logging.DEBUG, format="%(levelname)s %(message)s")
from cloud_elastic.driver.net.accepting import STORE_SHARE, descriptor_share
from cloud_elastic.driver.net.endpoints import Endpoints
resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), int(sys.argv[2])))
endpoints = Endpoints("j1", lambda kind, msg: {"ok": True}, workers=int(sys.argv[3]))
endpoints.start("127.0.0.1", advertised="127.0.0.1")
print("soft", resource.getrlimit(resource.RLIMIT_NOFILE)[0], "store share", descriptor_share(STORE_SHARE))
endpoints.close()
"""


def _start_with_limits(soft: int, hard: int, workers: int) -> tuple[str, list[str]]:
    """What the process printed, and the lines it logged (in a child: the test process keeps its limit)."""
    done = subprocess.run([sys.executable, "-c", _START, str(soft), str(hard), str(workers)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout, done.stderr.splitlines()


def test_the_driver_raises_its_soft_descriptor_limit_to_the_hard_one_and_the_servers_shares_follow() -> None:
    """Hostile review: the driver kept the usual soft limit of 1024, and a job past ~250 workers failed with
    "Too many open files" although the hard limit allowed far more."""
    hard = min(resource.getrlimit(resource.RLIMIT_NOFILE)[1], 4096)
    printed, logged = _start_with_limits(256, hard, 10)
    assert printed.strip() == f"soft {hard} store share {hard // 4}"
    assert f"DEBUG driver: raised the soft descriptor limit (RLIMIT_NOFILE) from 256 to {hard}" in logged, logged
    assert not [line for line in logged if line.startswith("WARNING")], logged


def test_a_hard_limit_below_what_the_job_needs_is_one_warning_that_says_how_to_raise_it() -> None:
    printed, logged = _start_with_limits(100, 200, 100)
    assert printed.strip() == "soft 200 store share 50"
    warnings = [line for line in logged if line.startswith("WARNING")]
    assert len(warnings) == 1, logged
    assert all(text in warnings[0] for text in ("descriptor limit is 200", "100 workers need about 664",
                                                "ulimit -n 664", "LimitNOFILE=")), warnings


def test_a_job_without_a_real_worker_bound_gets_no_advice_no_system_could_follow() -> None:
    """Ray's and Spark's executors leave max_np unset (2**20): 6 million descriptors is past any system's
    nr_open, so the warning would only mislead."""
    printed, logged = _start_with_limits(100, 200, 1 << 20)
    assert printed.strip() == "soft 200 store share 50"
    assert not [line for line in logged if line.startswith("WARNING")], logged


def test_spares_under_whole_hosts_count_as_their_hosts_workers_in_the_descriptor_check() -> None:
    """Spare review: 200 spare hosts of 8 slots were checked as 200 workers, not 1,600: no warning, and
    "Too many open files" later."""
    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (1500, 1500))

    driver = subprocess.Popen(
        [sys.executable, "-m", "cloud_elastic.cli", "run", "-np", "8", "--whole-hosts", "--slots-per-host", "8",
         "--spares", "200", "-H", "127.0.0.1:8", "python", "-c", "import time; time.sleep(60)"],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, preexec_fn=limited)
    try:
        line = next((line for line in driver.stderr if "descriptor limit" in line or "workers on" in line), "")
    finally:
        driver.send_signal(signal.SIGINT)
        driver.communicate(timeout=60)
    assert "its descriptor limit is 1500, and 1608 workers need about 9712" in line, line
