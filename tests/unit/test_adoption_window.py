"""A worker that reaches a restarted driver the moment it listens is adopted, not refused.

The restarted driver reopens its predecessor's control port. A worker of the
predecessor polls that port every 0.2 s, so under load its re-registration can
be served before the driver has finished starting. It must then find the
adoption window open: a refusal makes the worker exit (it would otherwise be a
second copy of the job), and the job loses the trained state it held. Seen in
the chaos test on a loaded machine before the window was opened ahead of the
server.

A restarted driver that gives the adoption up (a port taken) lets go of the
predecessor's ports. The rendezvous store owns its
listening descriptor once it has taken the socket over: closing the socket too
closed, later, whatever had reused the number (in the driver, a worker's pipe or
connection). The same double close happened whenever a driver object was collected
after its store, which under the Ray and Spark executors is in the user's process.

A real driver object, a real predecessor record on disk and a real control-plane
server; the worker's adopt request is sent, with the real client, in the very
call that starts the server, which is the earliest moment a worker can reach it.
"""

from __future__ import annotations

import gc
import json
import socket
import subprocess
import sys
import time

import pytest

from cloud_elastic.config import JobConfig
from cloud_elastic.control import Codec, new_secret
from cloud_elastic.driver.net import endpoints as endpoints_module
from cloud_elastic.driver.net.control_server import ControlServer
from cloud_elastic.driver.restart.predecessor import open_store, plan_start
from cloud_elastic.driver.restart.record import write_record
from cloud_elastic.driver.runtime.driver import Driver
from cloud_elastic.protocol import AdoptRequest
from cloud_elastic.providers.static import StaticHosts
from cloud_elastic.worker.link.client import DriverClient

pytestmark = pytest.mark.timeout(60)

JOB = "a1b2c3d4"
WORKER = "127.0.0.1[0]#1"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _restarted(config: JobConfig) -> tuple[Driver, object]:
    """A restarted driver and its start plan (the plan comes first: the job's identity and whom to adopt)."""
    driver = Driver(config, StaticHosts({"127.0.0.1": 1}))
    plan = plan_start(config, open_store(config), job_id=driver.job_id)
    driver._set_job_id(plan.job_id)
    return driver, plan


def _predecessor(root, ckpt: str, secret: str, grace_s: float = 60.0) -> int:
    """The records a driver killed a moment ago leaves behind: its status, its secret, its adoption record (its
    workers' ``grace_s``)."""
    directory = root / "cloud-elastic" / JOB
    directory.mkdir(parents=True, mode=0o700)
    from cloud_elastic.checkpoint import CheckpointStore, DurableJobRecord, write_job_record

    # As it started, it wrote its job record to --checkpoint-dir (plan_start): a store holding nothing is
    # another storage, refused (test_start_plan's test_a_dead_drivers_storage_found_empty_is_refused).
    write_job_record(CheckpointStore(ckpt), DurableJobRecord(JOB, ("python", "train.py"), time.time()),
                     only_if_absent=True)
    pid = _dead_pid()
    (directory / "driver.json").write_text(json.dumps({"pid": pid}))
    (directory / "secret").write_text(secret)
    port = _free_port()
    write_record(directory, {
        "job": JOB, "checkpoint_dir": ckpt, "advertised": "127.0.0.1", "bind": "127.0.0.1",
        "control_port": port, "store_port": _free_port(), "grace_s": grace_s, "seq": 1,
        "workers": [{"id": WORKER, "host": "127.0.0.1", "slot": 0, "seq": 1,
                     "handle": {"kind": "local", "pid": pid, "start": 0}}],
    })
    return port


def test_a_worker_arriving_as_the_restarted_driver_starts_listening_is_adopted(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    ckpt = str(tmp_path / "ckpt")
    secret = new_secret()
    port = _predecessor(tmp_path, ckpt, secret)
    replies: list[dict] = []

    class ArrivesAtOnce(ControlServer):
        """The real server; its first request comes from a waiting worker before ``start`` returns."""

        def start(self) -> None:
            super().start()
            client = DriverClient(f"127.0.0.1:{port}", Codec(secret, JOB), WORKER)
            request = AdoptRequest(0, None, 0, 0, 0, 0, 0, 12345)
            replies.append(client.call("adopt", request.to_wire(), timeout_s=10))
            client.close()

    monkeypatch.setattr(endpoints_module, "ControlServer", ArrivesAtOnce)
    config = JobConfig(command=("python", "train.py"), num_proc=1, min_np=1, max_np=1, checkpoint_dir=ckpt)
    driver, plan = _restarted(config)
    try:
        assert driver._listen_for_adoption(plan).adopt is not None, "the restarted driver gave the adoption up"
        assert driver.job_id == JOB, "the predecessor's record was not found"
        assert replies and replies[0].get("ok") is True, (
            f"the restarted driver refused a worker that reached it as it started listening: {replies}")
        assert WORKER in driver._job.workers
    finally:
        driver._endpoints.close()


def test_giving_an_adoption_up_closes_the_store_socket_once(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    ckpt = str(tmp_path / "ckpt")
    # A taken port is tried again until the workers' grace is about to end (less a second): here, for 2 s.
    control_port = _predecessor(tmp_path, ckpt, new_secret(), grace_s=3.0)
    config = JobConfig(command=("python", "train.py"), num_proc=1, min_np=1, max_np=1, checkpoint_dir=ckpt)
    driver, plan = _restarted(config)
    store_ports: list[int] = []

    class StoreFirst(endpoints_module.StoreServer):
        def start(self):
            store_ports.append(self.port)
            return super().start()

    monkeypatch.setattr(endpoints_module, "StoreServer", StoreFirst)
    with socket.create_server(("127.0.0.1", control_port)):  # the predecessor's control port is taken
        assert driver._listen_for_adoption(plan).adopt is None, "the adoption went on without its control port"
    assert store_ports, "the rendezvous store did not start"
    port = store_ports[0]
    with pytest.raises(ConnectionRefusedError):  # nothing serves the predecessor's store port any more
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    # New sockets take the lowest free descriptor numbers, the store's among them if it was freed.
    probes = [socket.socket() for _ in range(8)]
    try:
        del driver
        gc.collect()
        time.sleep(0.5)
        for probe in probes:
            probe.bind(("127.0.0.1", 0))  # EBADF if something closed its descriptor under it
    finally:
        for probe in probes:
            probe.close()


def test_a_driver_object_that_goes_after_its_store_closes_no_other_descriptor() -> None:
    # A driver runs in the user's process under the Ray and Spark executors and is collected
    # whenever the garbage collector gets to it: its store socket must not close a descriptor
    # number the store already gave back (the Spark registry test once met EBADF after the Ray tests).
    config = JobConfig(command=("python", "train.py"), num_proc=1, min_np=1, max_np=1)
    driver = Driver(config, StaticHosts({"127.0.0.1": 1}))
    driver._endpoints.start("127.0.0.1", advertised="127.0.0.1")
    port = driver._endpoints.store_port
    driver._shutdown()  # the job's end closes the store and its descriptor
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    probes = [socket.socket() for _ in range(8)]
    try:
        del driver
        gc.collect()
        for probe in probes:
            probe.bind(("127.0.0.1", 0))
    finally:
        for probe in probes:
            probe.close()
