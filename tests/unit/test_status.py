"""cloud-elastic status: job records on disk, the signed status request to a real control server,
refusals, and the rendering of a reply."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from cloud_elastic.control import Codec, new_secret
from cloud_elastic.driver.net.control_server import ControlServer
from cloud_elastic.errors import CloudElasticError, ConfigError, ControlPlaneError
from cloud_elastic.records import (
    job_dir, list_jobs, prune_gone, remove_driver_record, runtime_root, write_driver_record,
)
from cloud_elastic.status import (
    BlacklistedSlot, HostStatus, PendingNotice, StatusReply, WorkerStatus, listed_jobs, query_status,
    render_job_list, render_status,
)

pytestmark = pytest.mark.timeout(30)

REPO = Path(__file__).resolve().parents[2]
NOW = 1_763_900_000.0

REPLY = StatusReply(
    job="5f3a9c1e", phase="training", round=4, world_size=3, num_proc=3, min_np=1, max_np=4, uptime_s=754.0,
    resets=3, commit_step=1200, steps_per_s=5.25, provider="aws",
    hosts=(
        HostStatus("10.0.1.7", 2, "ready", (WorkerStatus(0, "10.0.1.7[0]#1", "training", 0),
                                            WorkerStatus(1, "10.0.1.7[1]#2", "starting"))),
        HostStatus("10.0.1.8", 1, "ready", (WorkerStatus(0, "10.0.1.8[0]#1", "training", 1),)),
        HostStatus("10.0.1.9", 1, "draining", (WorkerStatus(0, "10.0.1.9[0]#1", "training", 2),)),
    ),
    blacklisted=(BlacklistedSlot("10.0.1.7", 1, 8.4, 1), BlacklistedSlot("10.0.1.4", None, 95, 3)),
    notices=(PendingNotice("10.0.1.9", "aws", NOW + 90),),
)


def test_a_reply_renders_every_part_a_user_asks_about() -> None:
    assert render_status(REPLY, now=NOW) == (
        "job 5f3a9c1e: training, up 12m34s, provider aws\n"
        "round 4, world size 3 (-np 3, --min-np 1, --max-np 4)\n"
        "steps/s 5.25, last commit #1200, resets 3\n"
        "\n"
        "HOST      SLOTS  STATE     WORKERS\n"
        "10.0.1.7  2      ready     [0] rank 0 training, [1] starting\n"
        "10.0.1.8  1      ready     [0] rank 1 training\n"
        "10.0.1.9  1      draining  [0] rank 2 training\n"
        "\n"
        "blacklisted:\n"
        "  10.0.1.7[1] for 8s more (1 failure)\n"
        "  10.0.1.4 (whole host) for 1m35s more (3 failures)\n"
        "\n"
        "pending notices:\n"
        "  10.0.1.9: aws, deadline in 1m30s\n"
    )


def test_whole_hosts_show_on_the_size_line() -> None:
    text = render_status(dataclasses.replace(REPLY, whole_host_slots=2), now=NOW)
    assert "round 4, world size 3 (-np 3, --min-np 1, --max-np 4, whole hosts of 2 slot(s))\n" in text


def test_a_reply_survives_its_json_round_trip_and_a_malformed_one_is_refused() -> None:
    assert StatusReply.from_json(json.loads(json.dumps(REPLY.to_json()))) == REPLY
    whole = dataclasses.replace(REPLY, whole_host_slots=2)
    assert StatusReply.from_json(json.loads(json.dumps(whole.to_json()))) == whole
    broken = REPLY.to_json()
    del broken["world_size"]
    with pytest.raises(ControlPlaneError, match="malformed status reply: KeyError"):
        StatusReply.from_json(broken)


def test_records_are_private_to_the_user(tmp_path: Path) -> None:
    root = tmp_path / "cloud-elastic"
    secret = new_secret()
    directory = write_driver_record("job1", "127.0.0.1:5000", secret, command=["python", "t.py"], root=root)
    assert directory == job_dir("job1", root)
    assert stat.S_IMODE(os.stat(root).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(directory / "secret").st_mode) == 0o600
    assert stat.S_IMODE(os.stat(directory / "driver.json").st_mode) == 0o600
    assert (directory / "secret").read_text() == secret
    assert secret not in (directory / "driver.json").read_text()
    [job] = list_jobs(root)
    assert (job.job_id, job.address, job.pid, job.command, job.alive) == ("job1", "127.0.0.1:5000", os.getpid(),
                                                                          ("python", "t.py"), True)
    remove_driver_record("job1", root)
    assert list_jobs(root) == [] and not directory.exists()


def test_a_loosened_directory_is_made_private_again_and_a_bad_job_id_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "cloud-elastic"
    root.mkdir(mode=0o755)
    os.chmod(root, 0o755)
    write_driver_record("job1", "127.0.0.1:1", new_secret(), root=root)
    assert stat.S_IMODE(os.stat(root).st_mode) == 0o700
    for bad in ("../x", "", ".."):
        with pytest.raises(ConfigError, match="invalid job id"):
            job_dir(bad, root)


def test_the_runtime_root_follows_xdg_runtime_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert runtime_root() == tmp_path / "cloud-elastic"
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert runtime_root() == tmp_path / ".cloud-elastic" / "jobs"


@pytest.fixture
def fake_driver(tmp_path: Path):
    """A real ControlServer answering ``status`` as the driver will, with its record on disk."""
    secret, seen = new_secret(), []

    def handler(kind, message):
        seen.append(kind)
        if kind != "status":
            raise ControlPlaneError(f"unexpected {kind}")
        return REPLY.to_json()

    server = ControlServer(Codec(secret, REPLY.job), handler)
    server.start()
    root = tmp_path / "runtime" / "cloud-elastic"
    write_driver_record(REPLY.job, f"127.0.0.1:{server.port}", secret, command=["python", "train.py"], root=root)
    yield root, server, seen
    server.close()


def test_status_is_asked_and_answered_over_the_signed_control_plane(fake_driver) -> None:
    root, _server, seen = fake_driver
    assert query_status(REPLY.job, root=root) == REPLY
    assert seen == ["status"]


def test_a_wrong_secret_is_refused_and_never_reaches_the_driver(fake_driver) -> None:
    root, server, seen = fake_driver
    (root / REPLY.job / "secret").write_text(new_secret())
    with pytest.raises(ControlPlaneError, match="job 5f3a9c1e: driver refused status: HTTP 401"):
        query_status(REPLY.job, root=root)
    assert seen == [] and server.rejected == 1


def test_a_driver_that_is_gone_is_a_one_line_error(tmp_path: Path) -> None:
    root = tmp_path / "cloud-elastic"
    write_driver_record("gone", "127.0.0.1:1", new_secret(), pid=2 ** 22 + 12345, root=root)
    with pytest.raises(CloudElasticError, match=r"the driver at 127.0.0.1:1 does not answer: .*\(its process \d+ is gone\)"):
        query_status("gone", root=root)
    assert "(gone, last seen" in render_job_list(list_jobs(root), now=NOW)


def _cli(*args: str, env: dict[str, str], user: int | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "cloud_elastic.cli", "status", *args], capture_output=True, text=True, timeout=20,
        env={**os.environ, "PYTHONPATH": str(REPO), **env}, cwd="/", user=user,
    )


def test_the_status_command_shows_the_one_running_job_and_lists_several(fake_driver) -> None:
    root, _server, _seen = fake_driver
    env = {"XDG_RUNTIME_DIR": str(root.parent)}
    shown = _cli(env=env)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("job 5f3a9c1e: training, up 12m34s")
    assert "10.0.1.9  1      draining  [0] rank 2 training" in shown.stdout
    assert json.loads(_cli(REPLY.job, "--json", env=env).stdout)["commit_step"] == 1200

    write_driver_record("0other00", "127.0.0.1:1", new_secret(), command=["python", "b.py"], root=root)
    listed = _cli(env=env)
    assert listed.returncode == 0
    assert [line.split()[0] for line in listed.stdout.splitlines()] == ["JOB", REPLY.job, "0other00"]


def test_the_status_command_reports_a_refusal_in_one_line(fake_driver) -> None:
    root, _server, _seen = fake_driver
    (root / REPLY.job / "secret").write_text(new_secret())
    result = _cli(REPLY.job, env={"XDG_RUNTIME_DIR": str(root.parent)})
    assert result.returncode == 1
    assert result.stderr.startswith("cloud-elastic: error: job 5f3a9c1e: driver refused status: HTTP 401")
    assert len(result.stderr.splitlines()) == 1


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to act as another user")
def test_another_user_can_read_neither_the_record_nor_the_secret() -> None:
    # A runtime directory others may traverse up to, so only our 0700/0600 modes keep them out.
    shared = Path(tempfile.mkdtemp(prefix="ce-status-"))
    os.chmod(shared, 0o755)
    root = shared / "cloud-elastic"
    try:
        directory = write_driver_record("job1", "127.0.0.1:1", new_secret(), root=root)
        (shared / "public").write_text("readable")
        os.chmod(shared / "public", 0o644)

        def as_nobody(*argv: str) -> subprocess.CompletedProcess:
            return subprocess.run(argv, capture_output=True, text=True, timeout=10, user=65534, cwd="/")

        assert as_nobody("cat", str(shared / "public")).stdout == "readable"  # the setup lets others in this far
        for path in (root, directory, directory / "secret", directory / "driver.json"):
            denied = as_nobody("cat", str(path)) if path.name in ("secret", "driver.json") else as_nobody("ls", str(path))
            assert denied.returncode != 0 and "Permission denied" in denied.stderr, path
    finally:
        remove_driver_record("job1", root)
        root.rmdir()
        (shared / "public").unlink()
        shared.rmdir()


# ------------------------------------------------------------------ records of drivers that are gone
DEAD_PID = 2 ** 22 + 12345  # above any pid_max: no process


def _record(root: Path, job: str, *, seen_ago: float, pid: int = DEAD_PID, grace_s: float | None = None) -> Path:
    """A driver record last refreshed ``seen_ago`` seconds ago, with an adoption record giving ``grace_s``."""
    directory = write_driver_record(job, "127.0.0.1:1", new_secret(), pid=pid, command=["python", f"{job}.py"],
                                    root=root)
    if grace_s is not None:
        (directory / "adopt.json").write_text(json.dumps({"v": 1, "grace_s": grace_s}))
    seen = time.time() - seen_ago
    os.utime(directory / "driver.json", (seen, seen))
    return directory


def test_a_gone_driver_s_row_says_when_it_was_last_seen_and_its_up_time_stops_counting(tmp_path: Path) -> None:
    root = tmp_path / "cloud-elastic"
    _record(root, "runs0000", seen_ago=0, pid=os.getpid())
    _record(root, "died0000", seen_ago=40)
    [alive, gone] = sorted(list_jobs(root), key=lambda j: j.job_id, reverse=True)
    text = render_job_list([alive, gone], now=alive.started + 3600)
    rows = {line.split()[0]: line for line in text.splitlines()}
    assert rows["runs0000"].split()[3] == "1h00m"
    assert re.split(r"\s{2,}", rows["died0000"]) == [
        "died0000", "127.0.0.1:1", f"{DEAD_PID} (gone, last seen 1h00m ago)", "-", "python died0000.py"], text


def test_status_lists_drivers_gone_within_their_grace_hides_older_ones_and_prunes_those_a_day_past_it(
        tmp_path: Path) -> None:
    root = tmp_path / "cloud-elastic"
    _record(root, "runs0000", seen_ago=10 * 86400, pid=os.getpid())  # alive, however stale: never deleted
    _record(root, "recent00", seen_ago=30)  # within the default --driver-grace (60 s): its workers may run
    _record(root, "adoptabl", seen_ago=2 * 86400, grace_s=3 * 86400)  # a restart may still adopt its workers
    _record(root, "hidden00", seen_ago=3600)  # past its grace: hidden, kept a day
    pruned = _record(root, "pruned00", seen_ago=86400 + 61)  # a day past its grace: deleted
    assert (pruned / "secret").exists()
    shown, hidden = listed_jobs(root=root)
    assert sorted(j.job_id for j in shown) == ["adoptabl", "recent00", "runs0000"] and hidden == 1
    assert not pruned.exists()
    assert sorted(j.job_id for j in listed_jobs(root=root, show_all=True)[0]) == [
        "adoptabl", "hidden00", "recent00", "runs0000"]
    assert render_job_list([], hidden=1).endswith(
        "(1 record(s) of drivers gone for longer than their --driver-grace not shown: cloud-elastic status --all)\n")


def test_a_record_rewritten_by_a_restarted_driver_is_not_pruned(tmp_path: Path) -> None:
    root = tmp_path / "cloud-elastic"
    _record(root, "again000", seen_ago=3 * 86400)
    [old] = list_jobs(root)
    _record(root, "again000", seen_ago=0, pid=os.getpid())  # the same job's driver, restarted meanwhile
    assert prune_gone([old], time.time(), root) == [old] and (job_dir("again000", root) / "driver.json").exists()


def test_status_reads_the_grace_from_the_adoption_record_the_restart_writes() -> None:
    from cloud_elastic.driver.restart.record import RECORD_NAME
    from cloud_elastic.records import _ADOPTION_RECORD

    assert _ADOPTION_RECORD == RECORD_NAME


def test_the_status_command_hides_old_gone_drivers_unless_asked_for_all(tmp_path: Path) -> None:
    root = tmp_path / "cloud-elastic"
    _record(root, "recent00", seen_ago=30)
    _record(root, "hidden00", seen_ago=3600)
    env = {"XDG_RUNTIME_DIR": str(tmp_path)}
    listed = _cli(env=env)
    assert listed.returncode == 0, listed.stderr
    assert [line.split()[0] for line in listed.stdout.splitlines()] == ["JOB", "recent00", "(1"]
    every = _cli("--all", env=env)
    assert sorted(line.split()[0] for line in every.stdout.splitlines()) == ["JOB", "hidden00", "recent00"]
