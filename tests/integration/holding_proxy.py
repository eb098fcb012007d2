"""A TCP proxy that can hold one HTTP upload in the middle, for tests of what a failure does to it.

Every connection to the proxy is relayed to ``upstream`` both ways. Once
:meth:`HoldingProxy.arm` is called, the next request that starts with ``PUT``
(an object upload) is held: its first bytes have reached the proxy, so the
client's connection is open with a request in flight, but nothing is relayed
until :meth:`release`. ``arm(marker)`` holds only a request whose first line
contains ``marker`` (e.g. an object's name). What became of it is recorded in
:class:`Held`.
"""

from __future__ import annotations

import socket
import threading
from dataclasses import dataclass, field


@dataclass
class Held:
    """The held upload: when it arrived, and how it ended."""

    arrived: threading.Event = field(default_factory=threading.Event)
    #: The client's side of the connection ended (EOF or reset) before the answer was relayed.
    client_closed_early: bool = False
    #: The upstream server ended the connection (after its answer, or instead of one).
    server_closed: bool = False
    #: The first bytes of the upstream answer relayed back to the client.
    head: bytearray = field(default_factory=bytearray)

    @property
    def status(self) -> int | None:
        """The answer's final status (an interim ``100 Continue`` is skipped), None before it."""
        codes = [int(line.split()[1]) for line in bytes(self.head).split(b"\r\n")
                 if line.startswith(b"HTTP/1.") and len(line.split()) > 1 and line.split()[1].isdigit()]
        final = [c for c in codes if c != 100]
        return final[0] if final else None


class HoldingProxy:
    def __init__(self, listen_ip: str, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self._sock = socket.create_server((listen_ip, 0))
        self.address = self._sock.getsockname()
        self.held = Held()
        self._armed: bytes | None = None
        self._release = threading.Event()
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://{self.address[0]}:{self.address[1]}"

    def arm(self, marker: bytes = b"") -> None:
        with self._lock:
            self._armed = marker

    def release(self) -> None:
        self._release.set()

    def close(self) -> None:
        self._closed = True
        self._release.set()
        self._sock.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            server = socket.create_connection(self.upstream)
        except OSError:
            client.close()
            return
        holding: list[Held] = []  # this connection's held request, once it is the one held
        threading.Thread(target=self._answers, args=(server, client, holding), daemon=True).start()
        try:
            while True:
                data = client.recv(65536)
                if not data:
                    self._client_ended(holding)
                    break
                if not holding and data.startswith(b"PUT "):
                    with self._lock:
                        take = self._armed is not None and self._armed in data.split(b"\r\n", 1)[0]
                        if take:
                            self._armed = None
                    if take:
                        holding.append(self.held)
                        self.held.arrived.set()
                        self._release.wait()
                server.sendall(data)
        except OSError:
            self._client_ended(holding)
        finally:
            try:
                server.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    @staticmethod
    def _client_ended(holding: list[Held]) -> None:
        if holding and holding[0].status is None and not holding[0].server_closed:
            holding[0].client_closed_early = True

    @staticmethod
    def _answers(server: socket.socket, client: socket.socket, holding: list[Held]) -> None:
        try:
            while True:
                data = server.recv(65536)
                if not data:
                    break
                if holding:  # recorded before the client has it: it may close the moment it does
                    held = holding[0]
                    if len(held.head) < 8192:
                        held.head += data[: 8192 - len(held.head)]
                client.sendall(data)
        except OSError:
            pass
        finally:
            if holding:
                holding[0].server_closed = True  # before the client's side is closed here
            client.close()
            server.close()
