"""The mark that tells a worker joining a running job that its peers are in ``hvd.elastic.run``
(``worker.joining``): set by the first worker that enters it, signed with the job secret, so a stranger
who reaches the rendezvous store cannot make newcomers refuse their set-up; and the refusal is one line.
The whole path, a real newcomer refused while the job trains on, is tests/integration/test_newcomer_setup_collective.py.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch.distributed as dist

from cloud_elastic.worker import joining
from cloud_elastic.worker.comm.ops import UnsupportedError

pytestmark = pytest.mark.timeout(30)


def _worker(store, secret: str = "job-secret", standalone: bool = False):
    return SimpleNamespace(_store=store, standalone=standalone, settings=SimpleNamespace(secret=secret), worker_id="w")


def test_a_worker_learns_that_a_peer_entered_elastic_run():
    store = dist.HashStore()
    newcomer = _worker(store)
    assert not joining.peers_entered(newcomer)  # the first round's workers: nobody trains yet
    joining.mark_entered(_worker(store))
    assert joining.peers_entered(newcomer)


def test_a_mark_written_without_the_job_secret_is_not_believed():
    store = dist.HashStore()
    joining.mark_entered(_worker(store, secret="a stranger's"))
    assert not joining.peers_entered(_worker(store))
    dist.PrefixStore(joining._NAMESPACE, store).set(joining._KEY, b"1")  # written raw
    assert not joining.peers_entered(_worker(store))


def test_a_standalone_script_has_no_peers():
    joining.mark_entered(_worker(None, standalone=True))
    assert not joining.peers_entered(_worker(None, standalone=True))


def test_the_refusal_names_the_call_in_one_line():
    with pytest.raises(UnsupportedError) as raised:
        joining.refuse("broadcast resume_from_epoch")
    message = str(raised.value)
    assert "'broadcast resume_from_epoch' called before hvd.elastic.run" in message and "\n" not in message
    assert "move this call into the function hvd.elastic.run runs" in message
