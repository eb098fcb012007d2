"""An ssh ``ProxyCommand`` that makes new connections slow on demand: ``slow_proxy.py HOST PORT FLAG``.

While the file FLAG exists, each connection first waits the seconds it holds (a loaded driver machine took over
15 s to set up one), then relays stdin to HOST:PORT and the answers to stdout. ``FIRST,THEN``: the next connection
waits FIRST seconds, the ones after it THEN.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time


def main() -> None:
    host, port, flag = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    try:
        with open(flag) as f:
            wait = f.read()
    except FileNotFoundError:
        wait = ""
    if "," in wait:  # "FIRST,THEN": this connection waits FIRST seconds, the next ones THEN
        wait, then = wait.split(",", 1)
        with open(flag, "w") as f:
            f.write(then)
    time.sleep(float(wait or 0))
    conn = socket.create_connection((host, port))

    def up() -> None:
        while chunk := os.read(0, 65536):
            conn.sendall(chunk)
        conn.shutdown(socket.SHUT_WR)

    threading.Thread(target=up, daemon=True).start()
    while chunk := conn.recv(65536):
        os.write(1, chunk)


if __name__ == "__main__":
    main()
