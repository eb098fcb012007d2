"""A stand-in worker for the SSH launcher tests (the standard library, and in report mode the worker library's settings).

usage: _worker.py MARKER MODE [ARGS]
  report          print one JSON line: cwd, environment, executable, pid/pgid/sid, the secret read from
                  its descriptor (as the worker library reads it) and whether /proc/self/environ shows it
  exit N          print a line, exit with N
  signal N        kill itself with signal N
  sleep [--ignore-term]
                  start a grandchild (same marker), print "ready <pid> <child pid>" once the child
                  carries the marker in its cmdline, sleep
  lines N         print N numbered lines, the last one without a newline
  burst BYTES     print BYTES of 100-byte lines, then an error line on stderr, exit 1
  die-leaving-child
                  start a grandchild that ignores SIGTERM and holds the output pipe (as "sleep --ignore-term"),
                  print "ready <pid> <child pid>" and an error line, die of SIGKILL
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time


def report() -> None:
    from cloud_elastic.worker.settings import take_secret

    env = dict(os.environ)
    secret = take_secret()
    with open("/proc/self/environ", "rb") as f:
        shown = bool(secret) and secret.encode() in f.read()
    print(json.dumps({
        "cwd": os.getcwd(),
        "env": env,
        "secret": secret,
        "secret_in_proc_environ": shown,
        "executable": sys.executable,
        "pid": os.getpid(),
        "pgid": os.getpgid(0),
        "sid": os.getsid(0),
        "ppid": os.getppid(),
    }), flush=True)


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def _child(marker: str, ignore_term: bool) -> int:
    """Start a grandchild that sleeps (with the marker, inheriting stdout and stderr); its pid once it carries it."""
    code = "import signal, time\n"
    if ignore_term:
        code += "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    code += "time.sleep(3600)\n"
    child = subprocess.Popen([sys.executable, "-c", code, marker])
    # Popen returns once the child's exec has begun (its close-on-exec pipe closed), before the kernel has set up
    # the new program's arguments: for that moment /proc/<child>/cmdline is empty and the marker is in no scan
    # (seen under load in 42 of 60 starts). "ready" means the child carries the marker.
    deadline = time.monotonic() + 10
    while marker.encode() not in _cmdline(child.pid) and time.monotonic() < deadline:
        time.sleep(0.005)
    return child.pid


def sleep(marker: str, ignore_term: bool) -> None:
    if ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print(f"ready {os.getpid()} {_child(marker, ignore_term)}", flush=True)
    time.sleep(3600)


def main(argv: list[str]) -> None:
    marker, mode, args = argv[0], argv[1], argv[2:]
    if mode == "report":
        report()
    elif mode == "exit":
        print(f"exiting with {args[0]}", flush=True)
        sys.stdout.flush()
        os._exit(int(args[0]))
    elif mode == "signal":
        print(f"killing myself with {args[0]}", flush=True)
        os.kill(os.getpid(), int(args[0]))
        time.sleep(10)
    elif mode == "sleep":
        sleep(marker, "--ignore-term" in args)
    elif mode == "die-leaving-child":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # inherited through exec: ignored from the child's start
        print(f"ready {os.getpid()} {_child(marker, True)}", flush=True)
        print("RuntimeError: the worker's last words", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    elif mode == "burst":
        for _ in range(int(args[0]) // 100):
            sys.stdout.write("x" * 99 + "\n")
        sys.stdout.flush()
        print("RuntimeError: the worker's last words", file=sys.stderr, flush=True)
        os._exit(1)
    elif mode == "lines":
        n = int(args[0])
        for i in range(n - 1):
            print(f"line {i}")
        sys.stdout.write(f"line {n - 1}")
        sys.stdout.flush()
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main(sys.argv[1:])
