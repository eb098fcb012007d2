"""A restarted driver fetching the exit reports its predecessor's SSH workers left on their own hosts.

A worker started through the SSH launcher's remote wrapper whose training function returned leaves its exit report
on its host, and the wrapper adds the worker's exact exit status to it when the worker ends
(:mod:`cloud_elastic.driver.launch.ssh_remote`). When the driver was away at that moment, the status went to a dead
connection; its successor asks each host of such workers that did not come back, with **one** ssh command per host
(``ssh_remote --exit-reports NONCE...``, with the launcher's ssh options and ``ConnectTimeout``), for their reports.

Guarantees: up to :data:`PARALLEL` hosts are asked at a time (more wait for a free place), each bounded by the ssh
connect timeout plus :data:`ANSWER_S` and its answer by :data:`~cloud_elastic.driver.launch.ssh_wire.REPORT_LIMIT`
per worker, so the fetch takes at most ``ceil(hosts / PARALLEL)`` times that; the driver's start waits for it (its
adopted workers are attached already: they do not wait on it). A host that does not answer (or answers too much)
leaves its workers unknown (one warning line), never 0, and so does one whose reports' directory is not private to
the user (:data:`~cloud_elastic.driver.launch.ssh_wire.REPORT_DIR_NOT_PRIVATE`); each report is validated as a local
one is (:func:`~.record.parse_exit_report`): a forged, oversized or garbled one is one warning line and unknown.
"""

from __future__ import annotations

import logging
import os
import select
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor

from cloud_elastic.driver.launch.api import WorkerSpec
from cloud_elastic.driver.launch.ssh_setup import ssh_environ
from cloud_elastic.driver.launch.ssh_wire import REPORT_DIR_NOT_PRIVATE, REPORT_LIMIT, parse_report_line
from cloud_elastic.driver.restart.record import AdoptedWorker, parse_exit_report

__all__ = ["ANSWER_S", "PARALLEL", "fetch_exit_reports", "parse_answer"]

log = logging.getLogger(__name__)

#: How long a host may take to answer once connected (it reads a few small files).
ANSWER_S = 10.0
#: The most hosts asked at the same time (each is an ssh client process on the driver's machine).
PARALLEL = 16


def fetch_exit_reports(missing: Iterable[AdoptedWorker], round_: int, *,
                       spec_for: Callable[[AdoptedWorker], WorkerSpec], launcher_for: Callable[[str], object],
                       connect_timeout_s: float) -> dict[int, tuple[str, int | None]]:
    """rank -> (worker id, exit code) of round ``round_`` from the exit reports of the ``missing`` SSH workers (a
    worker of another kind, or whose host's launcher cannot run a remote command, is skipped: its code stays
    unknown). ``spec_for(worker)`` is what to run the remote command with (its environment picks the host's Python)."""
    by_host: dict[str, dict[str, AdoptedWorker]] = {}
    for w in missing:
        nonce = w.handle.get("nonce")
        if w.handle.get("kind") == "ssh" and isinstance(nonce, str):
            by_host.setdefault(w.host, {})[nonce] = w
    asks = []
    for host, workers in by_host.items():
        remote_argv = getattr(launcher_for(host), "remote_argv", None)
        if remote_argv is not None:
            spec = spec_for(next(iter(workers.values())))
            asks.append((host, workers, remote_argv(spec, "--exit-reports", *workers)))
    timeout_s = connect_timeout_s + ANSWER_S
    found: dict[int, tuple[str, int | None]] = {}
    if not asks:
        return found
    with ThreadPoolExecutor(min(PARALLEL, len(asks)), thread_name_prefix="exit-reports") as pool:
        answers = list(pool.map(lambda ask: _ask(ask[0], ask[2], timeout_s, len(ask[1])), asks))
    for (host, workers, _argv), answer in zip(asks, answers):
        if answer is not None:
            found.update(parse_answer(answer, host, workers, round_))
    return found


def _ask(host: str, argv: list[str], timeout_s: float, count: int) -> str | None:
    """The remote command's output, or None (logged) when the host did not answer in time, in full, or at all."""
    try:
        return _run_bounded(argv, timeout_s, count * (6 * REPORT_LIMIT + 200)).decode("utf-8", "replace")
    except (OSError, ValueError) as exc:
        log.warning("cannot fetch the exit reports of the previous driver's workers from %s (%s): their exit codes "
                    "stay unknown", host, exc)
        return None


def _run_bounded(argv: list[str], timeout_s: float, limit: int) -> bytes:
    """Run ``argv``; its stdout, at most ``limit`` bytes within ``timeout_s``; OSError if it ends non-zero."""
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            start_new_session=True, env=ssh_environ(os.environ))
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    data = b""
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise OSError(f"no answer within {timeout_s:g}s")
            if not select.select([proc.stdout], [], [], left)[0]:
                continue
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                break
            data += chunk
            if len(data) > limit:
                raise ValueError(f"an answer over {limit} bytes")
        rc = proc.wait(max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        raise OSError(f"no answer within {timeout_s:g}s") from None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
    if rc != 0:
        raise OSError(f"ssh exited with code {rc}")
    return data


def parse_answer(answer: str, host: str, workers: Mapping[str, AdoptedWorker], round_: int
                 ) -> dict[int, tuple[str, int | None]]:
    """rank -> (worker id, exit code) of round ``round_`` from a host's answer; ``workers``: nonce -> worker asked
    about. Lines of no worker asked about are ignored; a report that does not validate is one warning line, and so
    is a host that says its reports' directory is not private (it sends none)."""
    found: dict[int, tuple[str, int | None]] = {}
    for line in answer.splitlines():
        if line.startswith(REPORT_DIR_NOT_PRIVATE + " "):
            log.warning("cannot fetch the exit reports of the previous driver's workers from %s (%s is not a private "
                        "directory of the user there: anyone could have left them): their exit codes stay unknown",
                        host, line[len(REPORT_DIR_NOT_PRIVATE) + 1:][:200])
            continue
        parsed = parse_report_line(line)
        worker = workers.get(parsed[0]) if parsed is not None else None
        if parsed is None or worker is None:
            continue
        try:
            report_round, rank, code = parse_exit_report(parsed[1])
        except ValueError as exc:
            log.warning("cannot read the exit report of worker %s on %s (%s): its exit code stays unknown",
                        worker.worker_id, host, exc)
            continue
        if report_round == round_:
            found[rank] = (worker.worker_id, code)
    return found
