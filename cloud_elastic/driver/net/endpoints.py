"""What the driver listens on, with one lifecycle: the control plane, the rendezvous store, and the codec.

:class:`Endpoints` owns the :class:`~.control_server.ControlServer` (signed JSON to a handler),
the :class:`~.store_server.StoreServer` (torch's store protocol, for the workers' process groups)
and the :class:`~cloud_elastic.control.Codec` that signs with the job's secret.

* :meth:`Endpoints.start` raises the process's descriptor limit for the job's ``workers``
  (:func:`~.accepting.raise_descriptor_limit`: the servers' shares are of it), binds both servers at
  ``bind`` (port 0: where it can, a free port the kernel hands to no one else, so that a driver restarted after
  this one can bind it again: :mod:`.ports`; a restarted driver adopting its predecessor's workers reuses that
  driver's ports and secret, and its codec refuses every message signed before this start: the
  predecessor's nonces died with it, so a message captured then would be a replay it cannot tell)
  and serves; an OSError (a port taken) leaves nothing listening;
* :attr:`Endpoints.advertised` is the address workers use, with :attr:`control_port` and
  :attr:`store_port`;
* :meth:`Endpoints.close` stops both servers and closes their sockets, each once. Idempotent.

The constructor does no I/O.
"""

from __future__ import annotations

import logging
import math
import time

from cloud_elastic.control import Codec, new_secret
from cloud_elastic.driver.net.accepting import raise_descriptor_limit
from cloud_elastic.driver.net.control_server import ControlServer, Handler
from cloud_elastic.driver.net.ports import listening_kept
from cloud_elastic.driver.net.store_server import StoreServer, round_keys

__all__ = ["Endpoints"]

log = logging.getLogger(__name__)

#: The store's listen backlog: every worker connects at the start of a round, a large group all at once.
_STORE_BACKLOG = 512


class Endpoints:
    """The driver's control server, rendezvous store and codec for job ``job_id`` (see module docstring);
    ``workers``: how many workers the job may run at once (``--max-np`` and ``--spares``)."""

    def __init__(self, job_id: str, handler: Handler, *, workers: int = 0) -> None:
        self.job_id = job_id
        self._handler = handler
        self._workers = workers
        self._server: ControlServer | None = None
        self._store: StoreServer | None = None
        self._codec: Codec | None = None
        self._secret = ""
        self._advertised = ""
        self.bind = ""

    def start(self, bind: str, *, advertised: str, control_port: int = 0, store_port: int = 0,
              secret: str | None = None) -> None:
        """Listen at ``bind`` and serve; ``advertised`` is the address workers reach them at.

        ``secret``: the job's control-plane secret (a fresh one by default). OSError when a port cannot
        be bound; nothing is left listening then.
        """
        raise_descriptor_limit(self._workers)
        self._secret = secret if secret is not None else new_secret()
        # A predecessor's secret comes without its memory of nonces: what was signed with it before now may be a replay.
        self._codec = Codec(self._secret, self.job_id, not_before=-math.inf if secret is None else time.time())
        self._advertised, self.bind = advertised, bind
        self._store = StoreServer(listening_kept(bind, store_port, _STORE_BACKLOG),
                                  proves=round_keys(self._secret, self.job_id))
        self._store.start()
        try:
            self._server = ControlServer(self._codec, self._handler, bind=bind, port=control_port)
            self._server.start()
        except BaseException:
            self._server = None
            self.close()
            raise
        log.debug("job %s: control plane on %s:%d, rendezvous store on %s:%d", self.job_id, bind, self.control_port,
                  bind, self.store_port)

    @property
    def started(self) -> bool:
        """Whether both servers listen (from :meth:`start` until :meth:`close`)."""
        return self._server is not None

    @property
    def advertised(self) -> str:
        """The address workers reach the driver at (``--driver-address``, or the one chosen for them)."""
        return self._advertised

    @property
    def control_port(self) -> int:
        """The control plane's port (RuntimeError before :meth:`start`)."""
        if self._server is None:
            raise RuntimeError("endpoints not started")
        return self._server.port

    @property
    def store_port(self) -> int:
        """The rendezvous store's port (RuntimeError before :meth:`start`)."""
        if self._store is None:
            raise RuntimeError("endpoints not started")
        return self._store.port

    @property
    def secret(self) -> str:
        """The job's control-plane secret (also the key of its store namespaces); set by :meth:`start`."""
        return self._secret

    @property
    def store(self) -> StoreServer | None:
        """The rendezvous store, to delete a finished round's keys (:meth:`StoreServer.forget`)."""
        return self._store

    def close(self) -> None:
        """Stop serving and close every socket (each once). Idempotent."""
        server, self._server = self._server, None
        store, self._store = self._store, None
        if server is not None:
            server.close()
        if store is not None:  # every worker is stopped; in a Ray or Spark user's process it would serve on
            store.close()
