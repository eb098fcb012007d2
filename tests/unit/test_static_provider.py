"""The fixed host list behind -H/--hosts (cloud_elastic.providers.static)."""

from __future__ import annotations

import pytest

from cloud_elastic.errors import ConfigError
from cloud_elastic.providers.static import StaticHosts

pytestmark = pytest.mark.timeout(10)


def test_hosts_keep_order_and_default_slots() -> None:
    provider = StaticHosts.from_options({"hosts": "b:2, a ,c:1"}, slots_per_host=4)
    snapshot = provider.find()
    assert list(snapshot.ready.items()) == [("b", 2), ("a", 4), ("c", 1)]
    assert dict(snapshot.draining) == {}


def test_default_is_one_slot_per_host() -> None:
    assert dict(StaticHosts.from_options({"hosts": "a,b"}).find().ready) == {"a": 1, "b": 1}


def test_find_is_idempotent() -> None:
    provider = StaticHosts.from_options({"hosts": "a:2"})
    assert provider.find() == provider.find()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"hosts": "a:2,a:1"}, "--hosts: host 'a' is listed twice"),
        ({"hosts": "a:0"}, "slots must be >= 1"),
        ({"hosts": "a;b"}, "not host[:slots]"),
        ({"hosts": " , "}, "the static host list is empty"),
        ({}, "needs option 'hosts'"),
        ({"hosts": "a", "port": "22"}, "has no option 'port'"),
    ],
    ids=["duplicate", "zero-slots", "garbage", "empty", "missing", "unknown-option"],
)
def test_bad_options_raise_config_error(options: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        StaticHosts.from_options(options)
    assert message in str(info.value)


def test_empty_mapping_refused() -> None:
    with pytest.raises(ConfigError, match="empty"):
        StaticHosts({})
