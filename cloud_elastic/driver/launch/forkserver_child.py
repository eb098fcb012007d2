"""The fork server of local workers: a process that imported torch once and forks each worker from itself.

Importing torch costs a worker about two seconds of CPU (most of the time a worker
needs to start), and a job on one machine
starts a worker per slot, and again after every failure. The driver's
:class:`~cloud_elastic.driver.launch.forkserver.ForkServer` starts this module once per job
(``python -m cloud_elastic.driver.launch.forkserver_child FD``) and hands it each worker to start: its
argv (``python [-u] SCRIPT ARGS`` or ``python [-u] -m MODULE ARGS``), its environment,
its working directory and the write end of its output pipe. A child is forked for it,
which becomes what ``python SCRIPT ARGS`` would have been: its own session, the pipe as
stdout and stderr, ``/dev/null`` as stdin, the environment (less the job's secret, which is handed to
the worker library directly: ``worker.settings.keep_secret``) and working directory given,
``sys.argv`` and ``sys.path[0]`` as the interpreter sets them, fresh seeds for
``random`` and numpy (a fork would share them), the signal handlers of a new
interpreter, and the script run as ``__main__``; it ends as the interpreter's exit would, less its
teardown (:func:`_end_as_the_interpreter_would`). Its exit (code, or ``-N`` for signal N)
is reported back to the driver.

Started as ``python -m cloud_elastic.driver.launch.forkserver_child --listen PATH`` (``forkserver.start_parent``)
it is a parent of servers instead: it preloads once, and forks a server for each driver that
connects to the Unix socket ``PATH``; that server then serves its driver as above.

The server stays single-threaded, so a fork copies no lock held by another thread, and
never touches CUDA (importing torch does not initialise it). It exits when the driver's
end of its socket closes; workers it started run on (their own sessions) and are reaped
by whoever inherits them.

Protocol (one JSON object per SOCK_SEQPACKET message): the driver sends
``{"op": "spawn", "id": N, "argv": [...], "env": {...}, "cwd": "..."}`` with the
pipe's write end attached (SCM_RIGHTS); the server answers ``{"op": "spawned", "id": N,
"pid": P}`` or ``{"op": "error", "id": N, "error": "..."}``, and later ``{"op": "exit",
"pid": P, "code": C}``.
"""

from __future__ import annotations

import array
import gc
import json
import os
import select
import signal
import socket
import sys
from typing import Any, NoReturn

from cloud_elastic.worker.memory import collector_paused

__all__ = ["main", "run_main"]

#: The variable whose value is the room kept for the workers' environments (see ``_show_as``).
ROOM_VARIABLE = "CLOUD_ELASTIC_FORKSERVER_ROOM"
#: The largest message the driver sends (argv and environment): SOCK_SEQPACKET delivers each whole.
MAX_MESSAGE = 1 << 20
#: What :func:`run_main` returns for a script ended by an uncaught ``KeyboardInterrupt``: the process then ends
#: by SIGINT, as the interpreter's does, once its exit steps are done (:func:`_end_as_the_interpreter_would`).
INTERRUPTED = -int(signal.SIGINT)
#: Signals a new interpreter leaves at their defaults (SIGINT is Python's own; SIGPIPE stays ignored, as Python sets it).
_DEFAULT_SIGNALS = ("SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGCHLD", "SIGALRM")


def _preload() -> None:
    """What every worker imports: torch, the worker library on top of it, and what ``hvd.init()`` preloads.

    ``hvd.init()`` imports ``torch._dynamo`` before the worker joins (``context._preload_lazy_modules``):
    about as much CPU as torch itself, which each forked worker would otherwise pay again.
    """
    import torch  # noqa: F401

    import cloud_elastic.torch  # noqa: F401
    from cloud_elastic.worker.context import _preload_lazy_modules

    _preload_lazy_modules()


class _DriverGone(Exception):
    """The driver's end of the socket closed: the server ends (its workers run on)."""


def _declines() -> str | None:
    """Why this server must not fork workers, or None.

    A worker forked after CUDA was initialised cannot use it. (The driver does not start a
    server on a machine with a GPU at all: forked workers have not run on one yet.)
    """
    import torch

    if torch.cuda.is_initialized():
        return "CUDA was initialised while preloading"
    return None


def _send(sock: socket.socket, message: dict[str, Any]) -> None:
    try:
        sock.send(json.dumps(message).encode())
    except OSError as exc:
        raise _DriverGone() from exc


def _receive(sock: socket.socket) -> tuple[dict[str, Any] | None, list[int]]:
    """One request and the descriptors attached to it; (None, []) when the driver's end closed."""
    fds = array.array("i")
    try:
        data, ancillary, _flags, _addr = sock.recvmsg(MAX_MESSAGE, socket.CMSG_SPACE(4 * fds.itemsize))
    except OSError:
        return None, []
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    if not data:
        for fd in fds:
            os.close(fd)
        return None, []
    return json.loads(data), list(fds)


def _reap(sock: socket.socket) -> None:
    """Report every child that has ended, once what it left in its process group is killed.

    A worker is its own session's leader: a process it started and never waited for outlived it when it exited by
    itself (review h13). Its zombie keeps the group's id from reuse until the ``waitpid`` below; ``WNOWAIT`` finds it
    without reaping it."""
    while True:
        try:
            found = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if found is None:
            return
        try:
            os.killpg(found.si_pid, signal.SIGKILL)
        except OSError:
            pass  # nothing left in it
        pid, status = os.waitpid(found.si_pid, 0)
        _send(sock, {"op": "exit", "pid": pid, "code": os.waitstatus_to_exitcode(status)})


def _regions() -> tuple[tuple[int, int], tuple[int, int]] | None:
    """Where this process's command line and initial environment lie in its memory (``/proc/self/stat``)."""
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        arg_start, arg_end, env_start, env_end = (int(x) for x in fields[45:49])
    except (OSError, ValueError, IndexError):
        return None
    if not (0 < arg_start < arg_end and 0 < env_start < env_end):
        return None
    return (arg_start, arg_end), (env_start, env_end)


def _initial_environment() -> dict[str, str]:
    """This process's initial environment, in the order the kernel laid it out (what it was started with)."""
    try:
        with open("/proc/self/environ", "rb") as f:
            entries = f.read().split(b"\0")
    except OSError:
        return dict(os.environ)
    pairs = (os.fsdecode(e).split("=", 1) for e in entries if e)
    return {p[0]: p[1] if len(p) > 1 else "" for p in pairs}


def _show_as(argv: list[str], env: dict[str, str], initial: list[str],
             regions: tuple[tuple[int, int], tuple[int, int]] | None) -> None:
    """Make ``/proc/self/cmdline`` and ``/proc/self/environ`` (``ps``, and whoever looks for a job's processes
    by their environment) show the worker's command and environment, not this server's.

    They show what lies where the kernel put the server's own arguments and environment;
    the server was started with room to spare in both (``forkserver.ENV_ROOM``, ``ARGV_ROOM``). The server's
    own variables (the same values as the worker's: ``startup_key``) are rewritten in place,
    byte for byte, so a library that kept a pointer into them reads what it read before;
    the worker's other variables go into the room after them. Nothing of it is referred to
    any more: ``os.environ`` was rebuilt, and the interpreter copied its arguments.
    """
    if regions is None:
        return
    import ctypes

    kept = [k for k in initial if k != ROOM_VARIABLE]
    env_bytes = b"".join(os.fsencode(f"{k}={env[k]}") + b"\0" for k in kept if k in env)
    env_bytes += b"".join(os.fsencode(f"{k}={v}") + b"\0" for k, v in env.items() if k not in kept)
    arg_bytes = b"".join(os.fsencode(a) + b"\0" for a in argv)
    for (start, end), data in zip(regions, (arg_bytes, env_bytes)):
        if len(data) <= end - start:
            ctypes.memmove(start, data + b"\0" * (end - start - len(data)), end - start)


def _be_the_worker(request: dict[str, Any], out_fd: int, sock: socket.socket, initial: list[str],
                   regions: tuple[tuple[int, int], tuple[int, int]] | None) -> int:
    """In the forked child: become ``python ARGV`` with the request's environment; return its exit code."""
    sock.close()
    os.setsid()
    os.dup2(out_fd, 1)
    os.dup2(out_fd, 2)
    os.close(out_fd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    for name in _DEFAULT_SIGNALS:
        signal.signal(getattr(signal, name), signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.chdir(request["cwd"])
    from cloud_elastic.worker.settings import SECRET_ENV, keep_secret

    # The job's secret goes to the worker library, not into the environment: the script's own
    # subprocesses must not inherit it, nor /proc/PID/environ show it (see ``worker.settings``).
    env = dict(request["env"])
    keep_secret(env.pop(SECRET_ENV, ""))
    os.environ.clear()
    os.environ.update(env)
    _show_as(request.get("argv") or [], env, initial, regions)
    unbuffered = bool(request.get("unbuffered")) or bool(os.environ.get("PYTHONUNBUFFERED"))
    sys.stdin = open(0, "r", closefd=False)  # noqa: SIM115 (the process's own streams)
    sys.stdout = open(1, "w", buffering=1 if unbuffered else -1, closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    if unbuffered:
        sys.stdout.reconfigure(write_through=True)
        sys.stderr.reconfigure(write_through=True)
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr
    import random

    random.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    return run_main(request)


def run_main(request: dict[str, Any]) -> int:
    """Run the request's script or module as ``__main__``, as ``python [-m] ...`` would; its exit code.

    ``__file__`` and ``sys.path[0]`` are what CPython sets: the script's path joined to the working
    directory (not normalised: ``python ./a/../s.py`` shows ``CWD/./a/../s.py``), and the directory of
    the script's real path (symlinks resolved), or nothing added under ``PYTHONSAFEPATH``; ``sys.argv[0]``
    stays the path as given. A script that
    changes directory then finds its files from ``__file__``, as it would started by ``python``.
    """
    import runpy
    import types

    module, script, args = request.get("module"), request.get("script"), request["args"]
    code = 1
    try:
        if module:
            sys.argv = ["-m", *args]
            if not sys.flags.safe_path:  # PYTHONSAFEPATH / -P: python adds nothing, so sys.path[0] is PYTHONPATH's
                sys.path[0] = os.getcwd()
            sys.modules["__main__"] = types.ModuleType("__main__")  # a namespace of its own, not this server's
            runpy._run_module_as_main(module, alter_argv=True)  # what ``python -m`` runs
        else:
            sys.argv = [script, *args]
            if not sys.flags.safe_path:
                sys.path[0] = os.path.dirname(os.path.realpath(script))
            _run_script(os.path.join(os.getcwd(), script))
    except SystemExit as exc:
        code = _exit_code(exc.code)
        raise
    except BaseException as exc:  # as the interpreter reports it, without this server's frames
        tb = exc.__traceback__
        ours = (__file__, runpy.__file__, "<frozen runpy>")
        while tb is not None and tb.tb_frame.f_code.co_filename in ours:
            tb = tb.tb_next
        sys.excepthook(type(exc), exc.with_traceback(tb), tb)
        if isinstance(exc, KeyboardInterrupt):  # the interpreter ends by SIGINT then, after its exit steps
            return INTERRUPTED
        return 1
    else:
        code = 0
    finally:
        _tell_worker(code)
    return 0


def _end_as_the_interpreter_would(run: Any) -> NoReturn:
    """Run the worker (``run`` returns its exit code or raises ``SystemExit``), then end the process as the
    interpreter's exit would, less its teardown: the message of ``sys.exit("message")`` on stderr, the script's
    threads joined (all but daemons), its exit hooks run (``atexit``: the worker library's, logging's, the
    script's), its open files flushed (``worker.exiting._flush_files``), then ``os._exit`` with the same status.

    The teardown skipped is the freeing of every object the process holds, torch's modules included: in a
    process forked from this server nearly all of them are pages shared with it, so the teardown copied
    each before freeing it, 0.29 s of CPU and about 190 MB of copied pages per worker (47,800 page faults;
    ``os._exit`` after the same steps: 0.01 s, 350). What it leaves out: finalizers (``__del__``, weak
    reference callbacks not registered with ``atexit``) of objects still alive at exit do not run, as in a
    process ``multiprocessing`` forks, and neither do torch's own operator-library finalizers
    (:func:`_skip_torchs_operator_teardown`). A script that needs them runs with ``CLOUD_ELASTIC_LOCAL_FORKSERVER=0``.
    """
    code = 1
    try:
        try:
            code = run()
        except SystemExit as exc:
            code = _exit_code(exc.code)
            if exc.code is not None and not isinstance(exc.code, int):
                print(exc.code, file=sys.stderr)  # what the interpreter prints for ``sys.exit("message")``
        import atexit
        import threading

        try:
            threading._shutdown()  # type: ignore[attr-defined]  # the interpreter's first step at exit
        except BaseException as exc:  # noqa: BLE001 (Ctrl-C while a thread is joined: the hooks still run)
            print(f"cloud-elastic: while waiting for the script's threads at exit: {exc!r}", file=sys.stderr)
        _skip_torchs_operator_teardown()
        atexit._run_exitfuncs()
        from cloud_elastic.worker.exiting import _flush_files

        _flush_files()
    except BaseException:  # noqa: BLE001 (stderr closed, a flush that raised: the process still ends, with its status)
        pass
    finally:
        if code == INTERRUPTED:  # an uncaught KeyboardInterrupt: the interpreter ends by SIGINT after its exit steps
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
            code = 128 + signal.SIGINT  # SIGINT ignored by whoever started us: the status a shell would show
        os._exit(code)


def _skip_torchs_operator_teardown() -> None:
    """Keep torch's operator-library finalizers from running at this worker's exit; every other one still runs.

    torch registers a ``weakref.finalize`` with ``atexit`` for each operator library it creates
    (``torch.library._del_library``: about 170 once ``torch._dynamo`` is imported), which takes the library's
    operators out of the dispatcher's tables: teardown of the process's own state, which ``os._exit`` ends
    anyway, and nothing a script can see. In a worker forked from this server the tables are pages shared with
    it, so running them copied those pages: 40 ms of CPU and 8,400 page faults at every exit (4 ms and 770 without).
    """
    library = sys.modules.get("torch.library")  # never imported here: a script without torch has none of them
    if library is None:
        return
    try:
        import weakref

        _del_library = library._del_library
        for finalizer in list(weakref.finalize._registry):  # type: ignore[attr-defined]
            found = finalizer.peek()
            if found is not None and found[1] is _del_library:
                finalizer.atexit = False
    except Exception:  # noqa: BLE001 (another torch or Python: its finalizers run, as before)
        pass


def _exit_code(arg: Any) -> int:
    """The process's exit status for ``SystemExit(arg)``, as the interpreter computes it."""
    if arg is None:
        return 0
    if isinstance(arg, int):  # the status is the low byte (True is 1)
        if not -(2**63) <= arg < 2**63:
            return 255  # outside a C long: the interpreter's conversion gives -1
        return int(arg) & 0xFF
    return 1  # printed to stderr, status 1


def _tell_worker(code: int) -> None:
    """Hand the script's exit code to the worker library, if the script loaded it: its exit hook tells the
    driver (``exiting``), which cannot learn it when this server died or the worker was adopted. Under a plain
    interpreter nothing knows a top-level ``raise SystemExit(n)`` at exit; here the code is certain."""
    link = sys.modules.get("cloud_elastic.worker.link.driver_link")
    if link is not None:
        link.note_exit_code(code)


def _run_script(path: str) -> None:
    """Run the script at ``path`` in a new ``__main__``, as the interpreter does: ``runpy.run_path`` would
    show the path as ``sys.argv[0]`` too (a compiled script or a zip archive still goes that way)."""
    import builtins
    import importlib.machinery
    import io
    import runpy
    import types
    import zipfile

    if path.endswith(".pyc") or os.path.isdir(path) or zipfile.is_zipfile(path):  # a directory: its __main__.py
        runpy.run_path(path, run_name="__main__")
        return
    main = types.ModuleType("__main__")
    main.__file__, main.__cached__, main.__builtins__ = path, None, builtins  # type: ignore[attr-defined]
    main.__loader__ = importlib.machinery.SourceFileLoader("__main__", path)
    main.__annotations__ = {}
    sys.modules["__main__"] = main
    with io.open_code(path) as f:
        code = compile(f.read(), path, "exec", dont_inherit=True)  # not this module's ``__future__`` imports
    exec(code, main.__dict__)


def main(argv: list[str] | None = None) -> int:
    try:
        return _serve(argv)
    except _DriverGone:
        return 0


def _serve(argv: list[str] | None) -> int:
    args = sys.argv[1:] if argv is None else argv
    listening = args[0] == "--listen"
    sock = None if listening else socket.socket(fileno=int(args[0]))
    started_with = _initial_environment()
    initial = list(started_with)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C at the driver's terminal is the driver's to handle
    # The preload with the garbage collector paused (its passes over torch's objects during the import cost more
    # than the one full pass that ends the preload: 2.4-2.8 CPU-s a server start against 2.0-2.3 on this project's
    # 2-core VM), and what lives after that pass frozen before the collector runs again: what the server holds now
    # is shared with every worker, page by page, until written, and the collector's passes (the server's, a
    # worker's, and its exit's) leave it alone instead of touching it all.
    with collector_paused():
        _preload()
        gc.freeze()
    declined = _declines()
    if declined:
        if sock is not None:
            _send(sock, {"op": "declined", "reason": declined})
        else:
            print(f"cloud-elastic fork server: {declined}", file=sys.stderr, flush=True)
        return 0
    regions = _regions()
    if sock is None:
        sock = _accept_forked(args[1])  # in a server forked for one driver
    startup = {k: v for k, v in started_with.items() if k != ROOM_VARIABLE}
    return _serve_driver(sock, initial, regions, startup)


def _accept_forked(path: str) -> socket.socket:
    """A parent of servers (``--listen PATH``): for each driver that connects, fork a server for it; return its
    socket in that child. The parent runs until it is killed (``forkserver.start_parent``).

    The children are what a server started for the driver would be, minus the import: they
    were preloaded, frozen and laid out (``_regions``) once, here.
    """
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    old = os.umask(0o177)  # only this user may connect: a connection can start processes as this user
    try:
        listener.bind(path)
    finally:
        os.umask(old)
    listener.listen(64)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the servers it forks are reaped by the kernel
    while True:
        try:
            conn, _ = listener.accept()
        except InterruptedError:
            continue
        pid = os.fork()
        if pid == 0:
            listener.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the server reaps its own workers, with their codes
            return conn
        conn.close()


def _serve_driver(sock: socket.socket, initial: list[str], regions: Any, startup: dict[str, str]) -> int:
    room = len(os.environ.get(ROOM_VARIABLE, "")) if regions else 0
    # A child's exit wakes the loop at once (SIGCHLD through a pipe), so the driver hears of it
    # without delay, and an idle server never wakes.
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    # Its start-up variables (what its workers inherit rather than read) and the room in its command line:
    # a driver that did not start it checks the one and sizes by the other.
    arg_room = regions[0][1] - regions[0][0] if regions else 0
    _send(sock, {"op": "ready", "pid": os.getpid(), "room": room, "arg_room": arg_room, "startup": startup})
    while True:
        readable, _, _ = select.select([sock, wake_r], [], [])
        if wake_r in readable:
            os.read(wake_r, 512)
        _reap(sock)
        if sock not in readable:
            continue
        request, fds = _receive(sock)
        if request is None:
            return 0  # the driver is gone: so is this server (its workers run on)
        if len(fds) != 1:
            for fd in fds:
                os.close(fd)
            _send(sock, {"op": "error", "id": request.get("id"), "error": "no output pipe was attached"})
            continue
        try:
            os.stat(request["cwd"])
            pid = os.fork()
        except OSError as exc:
            os.close(fds[0])
            _send(sock, {"op": "error", "id": request.get("id"), "error": f"{exc.strerror or exc}"})
            continue
        if pid == 0:
            signal.set_wakeup_fd(-1)
            os.close(wake_r)
            os.close(wake_w)
            _end_as_the_interpreter_would(lambda: _be_the_worker(request, fds[0], sock, initial, regions))
        os.close(fds[0])
        _send(sock, {"op": "spawned", "id": request["id"], "pid": pid})


if __name__ == "__main__":
    # A server ends without the interpreter's teardown, which would copy every page it shares with its parent
    # (a server forked from a parent of servers) or free torch's modules one by one: nothing of it needs to run.
    status = main()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 (a closed pipe: nothing more can be said)
            pass
    os._exit(status)
