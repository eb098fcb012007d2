"""The rendezvous store as the workers use it: secret namespaces and signed values.

The driver hosts a plain ``torch.distributed.TCPStore``; it has no
authentication, and anyone who reaches its port can read, list
(``list_keys``), write and delete keys. Process groups exchange their
peers' addresses through it, so a stranger who could write a round's keys
could join that round, or redirect a worker to his own address. Two things
keep him out without changing the store:

* each round's keys live under a namespace derived with HMAC-SHA256 from the
  job secret (:func:`round_namespace`), so a stranger cannot prepare keys for
  a round before it starts;
* every value is written with an HMAC-SHA256 of the key (namespace included)
  and the value, and checked when read (:class:`SignedStore`). A value
  without a valid tag (forged, or copied from another key or round) fails
  the group's formation with an error naming the key: the round is retried,
  and nobody's process group ever sees a forged address.

What a stranger who reaches the port can still do is deny service (delete or
overwrite keys, so rounds fail to form); he learns only the workers'
process-group addresses. Only holders of the job secret, i.e. the driver and
the workers it started, can form a round.
"""

from __future__ import annotations

import hashlib
import hmac
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from cloud_elastic.control import host_namespace, round_namespace

__all__ = ["SignedStore", "host_namespace", "round_namespace", "StoreTamperedError"]

_TAG_BYTES = 32


class StoreTamperedError(RuntimeError):
    """A store value's signature is wrong: someone without the job secret wrote it."""




class SignedStore(dist.Store):
    """A ``torch.distributed.Store`` that signs what it writes and verifies what it reads.

    Wraps ``PrefixStore(namespace, inner)``. Supports what process groups
    need (``set``, ``get``, ``wait``, ``check``, ``add``, ``delete_key``,
    ``num_keys``); counters written with ``add`` are not signed (a forged
    counter cannot carry an address).
    """

    def __init__(self, inner: Any, namespace: str, secret: str) -> None:
        super().__init__()
        self._store = dist.PrefixStore(namespace, inner)
        self._namespace = namespace
        self._key = secret.encode()

    def _tag(self, key: str, value: bytes) -> bytes:
        msg = self._namespace.encode() + b"\0" + key.encode() + b"\0" + value
        return hmac.new(self._key, msg, hashlib.sha256).digest()

    def set(self, key: str, value: Any) -> None:
        data = value.encode() if isinstance(value, str) else bytes(value)
        self._store.set(key, self._tag(key, data) + data)

    def get(self, key: str) -> bytes:
        raw = bytes(self._store.get(key))
        tag, data = raw[:_TAG_BYTES], raw[_TAG_BYTES:]
        if len(tag) != _TAG_BYTES or not hmac.compare_digest(tag, self._tag(key, data)):
            raise StoreTamperedError(
                f"rendezvous store key {key!r} of {self._namespace.split('-')[0]} has a bad signature "
                "(written by someone without the job secret)"
            )
        return data

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        if timeout is None:
            self._store.wait(keys)
        else:
            self._store.wait(keys, timeout)

    def check(self, keys: list[str]) -> bool:
        return self._store.check(keys)

    def add(self, key: str, amount: int) -> int:
        return self._store.add(key, amount)

    def delete_key(self, key: str) -> bool:
        return self._store.delete_key(key)

    def num_keys(self) -> int:
        return self._store.num_keys()

    def set_timeout(self, timeout: timedelta) -> None:
        self._store.set_timeout(timeout)
