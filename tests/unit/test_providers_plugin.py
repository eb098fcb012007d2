"""The example plugin (examples/plugin): found through its entry point, and its failure modes."""

from __future__ import annotations

import json

import pytest

from cloud_elastic.errors import ConfigError, FatalDiscoveryError, RetryableDiscoveryError
from cloud_elastic.providers import registry
from cloud_elastic.providers.api import DiscoveredHosts, Drain


def _hostsfile(tmp_path, content: str):
    path = tmp_path / "hosts.json"
    path.write_text(content)
    return registry.load("hostsfile").from_options({"path": str(path)})


def test_the_plugin_is_an_installed_provider_of_its_own_package():
    cls = registry.load("hostsfile")
    assert cls.__module__ == "cloud_elastic_hostsfile" and cls.name == "hostsfile"


def test_a_bare_reason_string_is_a_drain_without_deadline(tmp_path):
    discovery = _hostsfile(tmp_path, json.dumps({"ready": {"a": 2}, "draining": {"b": "spot notice"}}))
    assert discovery.find() == DiscoveredHosts(ready={"a": 2}, draining={"b": Drain(None, "spot notice")})


def test_a_half_written_file_is_retryable_and_a_wrong_shape_is_fatal(tmp_path):
    with pytest.raises(RetryableDiscoveryError, match="not valid JSON"):
        _hostsfile(tmp_path, '{"ready": {"a": 2').find()
    with pytest.raises(FatalDiscoveryError, match="expected"):
        _hostsfile(tmp_path, '["a", "b"]').find()
    with pytest.raises(FatalDiscoveryError, match="invalid slot count"):
        _hostsfile(tmp_path, '{"ready": {"a": 0}}').find()
    # Before: 1e400 raised OverflowError out of the provider (a traceback a call), and true was one slot.
    for slots, read in (("1e400", "Infinity"), ("true", "true"), ("1.5", "1.5")):
        with pytest.raises(FatalDiscoveryError, match=f"host a: slots must be a whole number, not {read}"):
            _hostsfile(tmp_path, '{"ready": {"a": %s}}' % slots).find()


def test_the_shipped_providers_are_the_entry_points_pyproject_registers():
    import tomllib
    from pathlib import Path

    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    assert registry.SHIPPED == pyproject["project"]["entry-points"][registry.ENTRY_POINT_GROUP]
    assert set(registry.SHIPPED) <= set(registry._entry_points())  # installed as entry points too


def test_a_shipped_provider_loads_without_reading_any_package_metadata_and_a_plugin_through_its_entry_point(
        monkeypatch):
    real = registry._entry_points
    scans = []
    monkeypatch.setattr(registry, "_entry_points", lambda: scans.append(1) or real())
    assert registry.load("static").__name__ == "StaticHosts" and not scans
    assert registry.load("hostsfile").__module__ == "cloud_elastic_hostsfile" and scans
    with pytest.raises(ConfigError, match=r"unknown discovery provider 'nope'; installed: aws, azure, .*hostsfile"):
        registry.load("nope")
