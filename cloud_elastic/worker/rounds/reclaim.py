"""Reclaiming the threads and sockets of a process group abandoned after a failure.

A Gloo group whose collective was abandoned on a lost peer cannot simply be
dropped: its destructor joins its worker threads, and the one running the
abandoned collective waits for the peer until Gloo's own timeout (minutes
when the peer is stopped rather than dead). Keeping such groups alive
forever leaked about two threads and three descriptors per failure, which a
long spot job turns into the 1,024-descriptor limit.

What releases it instead: the sockets Gloo opened for the group's peer
connections are shut down (``shutdown(2)`` on a duplicate descriptor; Gloo
keeps and later closes its own). Every pending read or write on them fails
at once, so the abandoned collective ends with an error, its thread becomes
free, and the group can be destroyed in a fraction of a second; the
descriptors close with it. Measured here: threads and descriptors stay flat
over repeated SIGKILLed and SIGSTOPped peers, about 0.1 s per group.

The group's sockets are found as the TCP sockets that appeared while it was
being formed (:func:`socket_inodes` before and after) and are connected to one
of the group's members (their addresses come through the group's store: ``peers``),
minus the group's listening socket (Gloo aborts the process if its ``accept``
fails) and any connection to the driver's control plane or store. Destruction runs on a
short-lived thread, so the caller never blocks on it; that thread lets go of the group
only once its caller has (the destructor runs wherever the last reference goes); if it
does not finish within ``bound_s`` the group stays leaked, as before, and is counted.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import time
from typing import Any, Iterable

__all__ = ["socket_inodes", "GroupSockets", "Reaper", "connecting_to", "plain_ip"]

log = logging.getLogger(__name__)

#: How long a reclaim waits for its caller to let go of the group before dropping its own reference anyway.
LAST_REFERENCE_WAIT_S = 5.0


def _only_held_by(holder: list) -> bool:
    """Whether ``holder[0]`` (a round's group) and its process group are referenced by nothing else.

    Each count below is of the one expected reference, this frame's local name and ``getrefcount``'s argument.
    """
    group = holder[0]
    if sys.getrefcount(group) > 3:  # the list's
        return False
    pg = getattr(group, "pg", None)
    return pg is None or sys.getrefcount(pg) <= 3  # the group's attribute


def _started(thread: threading.Thread) -> bool:
    """Start ``thread``; False when the interpreter refuses: Python 3.12.0 and 3.12.1 start no thread once they
    are finalizing, exit hooks included ("can't create new thread at interpreter shutdown"; later releases do).
    The caller then does the work without it, on its own thread or in the exit hook's drain."""
    try:
        thread.start()
    except RuntimeError as exc:
        log.debug("could not start thread %s: %s", thread.name, exc)
        return False
    return True


def socket_inodes() -> dict[int, str]:
    """This process's socket descriptors: fd -> ``socket:[inode]``."""
    out: dict[int, str] = {}
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:  # no procfs: nothing can be reclaimed, groups are leaked as before
        return out
    for name in fds:
        try:
            link = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if link.startswith("socket:"):
            out[int(name)] = link
    return out


def plain_ip(address: str) -> str:
    """``::ffff:10.0.0.1`` (an IPv4 peer of an IPv6 socket) as ``10.0.0.1``; other addresses unchanged."""
    return address[7:] if address.startswith("::ffff:") and "." in address else address


def _proc_tcp_address(field: str) -> str:
    """An address of ``/proc/net/tcp{,6}`` (hex, in the kernel's byte order per 32-bit word) as text."""
    raw = bytes.fromhex(field)
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, raw[::-1])
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
    return plain_ip(socket.inet_ntop(socket.AF_INET6, words))


def connecting_to() -> set[str]:
    """The addresses this process's TCP sockets are trying to connect to and have not reached (SYN sent, no
    answer): a peer that is up but whose packets the network drops. Empty when that cannot be read.

    Forming a group connects every pair of ranks, one connection at a time, only once each peer has published
    its address; a connection that stays unanswered is one the network drops between two hosts that are both
    up (a peer that never published its address, or one that refused, is not among them). What a formation
    that failed says of the peers it could not reach (``peers.Peers.unreached``, ``driver.job.partitions``).
    """
    mine = {link[8:-1] for link in socket_inodes().values()}  # socket:[inode]
    out: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii") as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if len(cols) > 9 and cols[3] == "02" and cols[9] in mine:  # 02: SYN_SENT
                out.add(_proc_tcp_address(cols[2].split(":")[0]))
    return out


class GroupSockets:
    """The peer connections of one process group, found by what formation opened.

    With ``members`` (the IP addresses of the group's members), only connections
    to one of them count: a socket another thread of the worker opened while the
    group formed (a checkpoint upload from rank 0, say) is not the group's and is
    never shut down with it.
    """

    def __init__(self, before: dict[int, str], after: dict[int, str], exclude_peers: Iterable[tuple[str, int]],
                 members: Iterable[str] | None = None) -> None:
        excluded = set(exclude_peers)
        allowed = None if members is None else {plain_ip(m) for m in members}
        self._fds: dict[int, str] = {}
        for fd, link in after.items():
            if before.get(fd) == link:
                continue
            try:
                with socket.socket(fileno=os.dup(fd)) as s:
                    if s.type != socket.SOCK_STREAM or s.family not in (socket.AF_INET, socket.AF_INET6):
                        continue
                    if s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                        continue  # the group's listener: shutting it down makes Gloo abort the process
                    peer = s.getpeername()[:2]
            except OSError:
                continue
            if (peer[0], peer[1]) in excluded or (allowed is not None and plain_ip(peer[0]) not in allowed):
                continue
            self._fds[fd] = link

    def __len__(self) -> int:
        return len(self._fds)

    def shutdown(self) -> int:
        """Shut down every connection still held by the group; return how many."""
        done = 0
        for fd, link in self._fds.items():
            try:
                if os.readlink(f"/proc/self/fd/{fd}") != link:
                    continue  # closed meanwhile and the number reused: not ours any more
                with socket.socket(fileno=os.dup(fd)) as s:
                    s.shutdown(socket.SHUT_RDWR)
                done += 1
            except OSError:
                continue
        return done


class Reaper:
    """Lets go of rounds' groups off the training thread; counts the abandoned ones it reclaimed or leaked.

    Takes :class:`~cloud_elastic.worker.rounds.groups.RoundGroup` holders: a group and
    the store it must outlive.
    """

    def __init__(self, bound_s: float = 30.0) -> None:
        self.bound_s = bound_s
        self.reclaimed = 0
        self.leaked = 0
        self._lock = threading.Lock()
        self._keep: list[Any] = []  # groups whose destruction did not finish in time, or could not be tried
        #: Releases not yet done (their timer, and the (take, destroy) pair it runs), and destructions still running.
        self._timers: dict[threading.Timer, tuple[Any, Any]] = {}
        self._running: set[threading.Event] = set()
        #: The connections of released groups whose collective may still wait on a peer, until they are destroyed:
        #: shut down by :meth:`drain` only (see :meth:`release`).
        self._cut_at_exit: dict[threading.Event, GroupSockets] = {}
        #: Groups drain had no time left to destroy on the exiting thread, when no thread could be started.
        self._undestroyed: list[Any] = []

    def release(self, group: Any, after_s: float = 1.0, *, cut_at_exit: bool = False) -> None:
        """Drop a group with no pending work off the caller's thread; never blocks.

        Its destructor joins Gloo's worker threads (20-30 ms for a group of
        three here), time a training thread switching rounds would otherwise
        stall for. Torch runs process group destructors without the GIL. The
        reference is dropped ``after_s`` later, once the caller's frames (which
        still hold the group while they return) are gone: dropped at once, the
        caller's last reference would run the destructor on its own thread.

        ``cut_at_exit``: a group whose collective may still wait on a peer (a plan's whose check failed), released
        because its connections cannot be told from those of a round formed meanwhile (shut down, that round
        failed). Its destructor then waits for Gloo's timeout (300 s by default) to end that collective, on the
        timer's thread; its connections (``group.sockets``) are kept until it is destroyed, and shut down by
        :meth:`drain` as the process exits (every round is let go of then): the destructor returns at once and
        the exit hook keeps to its budget.
        """
        cross = getattr(group, "cross", None)
        if cross is not None:  # a second group of the same round (sharded training) goes the same way
            group.cross = None
            self.release(cross, after_s, cut_at_exit=cut_at_exit)
        sockets = getattr(group, "sockets", None) if cut_at_exit else None
        holder = [group]
        del group
        done = threading.Event()  # set once the destructor has returned

        def take() -> list[Any] | None:
            """The group, for this caller to destroy (``destroy``); None when another caller took it. Seen as
            running by drain() and busy() from here until the destructor has returned (unseen, a release whose
            timer fired just before the exit hook was still in torch's C++ as the interpreter finalized: SIGABRT
            after a job that had succeeded, review s58 dxA)."""
            with self._lock:
                self._timers.pop(timer, None)
                if not holder:
                    return None
                self._running.add(done)
                return [holder.pop()]

        def destroy(taken: list[Any]) -> None:
            mine = taken.pop()  # the last reference: the destructor runs on this thread, at ``del mine``
            try:
                if getattr(mine, "backend", "") == "nccl":
                    # An NCCL group is shut down, not just dropped: torch warns about (and aborts) a
                    # communicator destroyed without it.
                    shutdown = getattr(mine.pg, "shutdown", None)
                    try:
                        if shutdown is not None:
                            shutdown()
                    except RuntimeError as exc:
                        log.warning("shutting down an NCCL process group failed: %s", exc)
                del mine
            finally:
                with self._lock:
                    self._running.discard(done)
                    self._cut_at_exit.pop(done, None)
                done.set()

        def drop() -> None:  # on the timer's thread
            taken = take()
            if taken is not None:
                destroy(taken)

        timer = threading.Timer(after_s, drop)
        timer.name, timer.daemon = "cloud-elastic-release", True
        with self._lock:
            self._timers[timer] = (take, destroy)
            if sockets is not None and len(sockets):
                self._cut_at_exit[done] = sockets
        if not _started(timer):  # at exit on Python 3.12.0-3.12.1: left pending, for drain
            log.debug("a process group's release could not start a thread; left to the exit's drain")

    def drain(self, timeout_s: float = 10.0) -> bool:
        """Finish every release and destruction now, within ``timeout_s``; True if all did.

        Called as the process exits. A daemon thread still inside a process
        group's destructor (or any torch call that let go of the GIL) when the
        interpreter finalizes is ended by the interpreter as it takes the GIL
        back, in the middle of C++ code: the process dies of
        ``terminate called without an active exception`` (SIGABRT) after a job
        that succeeded. Pending releases run now instead, before finalization.

        The connections of released groups whose collective may still wait on a peer (``cut_at_exit``) are shut
        down first: that collective fails at once, and the destructor, waiting for it, returns (before, the exit
        waited out Gloo's timeout, 300 s by default, or finalized under it: SIGABRT; review s60 rvR). Nothing
        alive can be cut then: the process is exiting, and its current round has been let go of. Destructors
        run on threads of their own, waited for until ``timeout_s`` only: one that outlasts it is left running
        (:meth:`busy` says so), the exit hook's to deal with.

        Where no thread can be started (Python 3.12.0-3.12.1 from an exit hook), :meth:`release` and :meth:`retire`
        leave their group pending here, and each is destroyed on this thread while time is left (its connections
        already shut down, its destructor returns at once); one not reached by ``timeout_s`` is kept undestroyed
        and :meth:`busy` says so (the exit hook then ends the process without finalizing, when it may).
        """
        deadline = time.monotonic() + timeout_s
        with self._lock:
            pending = list(self._timers.items())
            self._timers.clear()
            cut = list(self._cut_at_exit.values())
        for sockets in cut:
            sockets.shutdown()
        for timer, (take, destroy) in pending:
            timer.cancel()
            taken = take()  # None when its timer's thread took it first: that destruction is waited for below
            if taken is not None and not _started(threading.Thread(target=destroy, args=(taken,),
                                                                   name="cloud-elastic-drain", daemon=True)):
                if time.monotonic() < deadline:  # no thread at exit (Python 3.12.0-3.12.1): destroyed here
                    destroy(taken)
                else:  # out of time: kept, undestroyed, and seen by busy(): the exit hook ends the process
                    with self._lock:  # without finalizing, which would destroy it unbounded
                        self._undestroyed.append(taken.pop())
            del taken
        while True:
            with self._lock:
                running = list(self._running)
            if not running:
                return True
            if not running[0].wait(max(0.0, deadline - time.monotonic())):
                log.warning("a process group was still being destroyed %.0fs into the exit", timeout_s)
                return False

    def busy(self) -> bool:
        """Whether a release or a destruction is still pending or running (after :meth:`drain`: one that
        outlasted it, still inside torch)."""
        with self._lock:
            return bool(self._timers or self._running or self._undestroyed)

    def retire(self, group: Any) -> None:
        """Release an abandoned group (abandoning it first if that was not done); never blocks.

        Abandoning fails its pending collectives, so its destructor returns at
        once on whichever thread drops the last reference. A Gloo group whose
        connections are unknown cannot be abandoned safely and is kept (counted
        as leaked), as before. A group of one has no connections and nothing to
        wait for: it is destroyed. (It was kept too, as a group whose
        connections were not found: three threads and four descriptors for each
        round a lone survivor left by failure, the leak of issue 44.)
        """
        group.abandon()
        cross = getattr(group, "cross", None)
        if cross is not None:  # a second group of the same round (sharded training) goes the same way
            group.cross = None
            self.retire(cross)
        alone = getattr(group, "size", None) == 1
        if group.backend == "gloo" and not alone and (group.sockets is None or len(group.sockets) == 0):
            with self._lock:
                self._keep.append(group)
                self.leaked += 1
            return
        holder = [group]
        done = threading.Event()
        with self._lock:
            self._running.add(done)

        def destroy() -> None:
            # The destructor runs wherever the last reference goes. The caller's frames (the training
            # thread's previous group, as it forms the next) still hold the group for a moment: dropped
            # first here, the last reference would be theirs, and an abandoned Gloo group whose worker
            # thread is still stuck (socket shutdown does not always free it at once) would block the
            # training thread in its destructor, out of the next round's collectives, until Gloo's own
            # timeout: the rest of the round would wait on it.
            deadline = time.monotonic() + LAST_REFERENCE_WAIT_S
            while not _only_held_by(holder) and time.monotonic() < deadline:
                time.sleep(0.005)
            holder.clear()
            done.set()

        def watch() -> None:
            t = threading.Thread(target=destroy, name="cloud-elastic-reap", daemon=True)
            t.start()
            if done.wait(self.bound_s):
                with self._lock:
                    self.reclaimed += 1
                    self._running.discard(done)
            else:
                log.warning("an abandoned process group did not release its threads within %.0fs; left to the OS", self.bound_s)
                with self._lock:
                    self.leaked += 1

        del group
        if not _started(threading.Thread(target=watch, name="cloud-elastic-reap-watch", daemon=True)):
            # No thread at exit (Python 3.12.0-3.12.1): released instead, so that drain destroys it once the caller
            # has let go (its sockets are already shut down: its destructor returns at once).
            with self._lock:
                self._running.discard(done)
                self.reclaimed += 1
            self.release(holder.pop(), after_s=0.0)
