"""worker/rounds/signed_store.py: a stranger who reaches the rendezvous store cannot plant or replay what a round reads."""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch.distributed as dist

from cloud_elastic.worker.rounds.signed_store import SignedStore, StoreTamperedError, round_namespace

pytestmark = pytest.mark.timeout(30)

SECRET = "k" * 64


@pytest.fixture
def tcp():
    return dist.TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=5), wait_for_workers=False)


def test_namespaces_differ_per_round_job_and_secret():
    names = {round_namespace(SECRET, "job", 1), round_namespace(SECRET, "job", 2),
             round_namespace(SECRET, "other", 1), round_namespace("x" * 64, "job", 1)}
    assert len(names) == 4
    assert round_namespace(SECRET, "job", 1) == round_namespace(SECRET, "job", 1)  # every worker agrees
    assert SECRET not in round_namespace(SECRET, "job", 1)


def test_values_round_trip_and_a_stranger_sees_only_opaque_keys(tcp):
    ns = round_namespace(SECRET, "job", 3)
    store = SignedStore(tcp, ns, SECRET)
    store.set("0/0", b"\x01address")
    store.wait(["0/0"], timedelta(seconds=2))
    assert store.get("0/0") == b"\x01address"
    stranger = dist.TCPStore("127.0.0.1", tcp.port, None, False, timeout=timedelta(seconds=5))
    assert stranger.list_keys() == [f"{ns}/0/0"]
    assert stranger.get(f"{ns}/0/0") != b"\x01address"  # the stored value carries its tag


def test_a_value_written_without_the_secret_is_refused(tcp):
    ns = round_namespace(SECRET, "job", 3)
    stranger = dist.TCPStore("127.0.0.1", tcp.port, None, False, timeout=timedelta(seconds=5))
    stranger.set(f"{ns}/0/1", b"\x00" * 32 + b"attacker address")
    with pytest.raises(StoreTamperedError, match="bad signature"):
        SignedStore(tcp, ns, SECRET).get("0/1")
    with pytest.raises(StoreTamperedError):
        SignedStore(tcp, ns, "y" * 64).get("0/1")  # nor can another job's secret sign it


def test_a_signed_value_copied_to_another_key_or_round_is_refused(tcp):
    ns3, ns4 = round_namespace(SECRET, "job", 3), round_namespace(SECRET, "job", 4)
    SignedStore(tcp, ns3, SECRET).set("0/0", b"old address")
    raw = tcp.get(f"{ns3}/0/0")
    tcp.set(f"{ns4}/0/0", raw)
    tcp.set(f"{ns3}/0/1", raw)
    with pytest.raises(StoreTamperedError):
        SignedStore(tcp, ns4, SECRET).get("0/0")
    with pytest.raises(StoreTamperedError):
        SignedStore(tcp, ns3, SECRET).get("0/1")
