"""``cloud-elastic providers`` and ``cloud-elastic discover`` output (the functions the CLI calls)."""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys

from cloud_elastic.errors import FatalDiscoveryError
from cloud_elastic.providers.api import DiscoveredHosts, Drain
from cloud_elastic.driver.runtime.discovery import discover
from cloud_elastic.providers.inspect import list_providers
from tests.contract.scripted import ScriptedDiscovery

SNAPSHOT = DiscoveredHosts(ready={"10.0.0.1": 4, "10.0.0.2": 4},
                           draining={"10.0.0.3": Drain(1767225600.0, "Terminating:Wait")})


def test_list_providers_shows_every_installed_provider_with_its_options():
    out = io.StringIO()
    list_providers(out)
    text = out.getvalue()
    for name in ("static", "script", "aws", "gcp", "azure", "ibm", "hostsfile"):
        assert f"\n{name}\n" in f"\n{text}"
    assert "-o group" in text and "(required)" in text and "(default 5)" in text
    assert "-o path" in text  # the example plugin's option


def test_discover_prints_a_table_with_ready_and_draining_hosts():
    out = io.StringIO()
    discovery = ScriptedDiscovery([SNAPSHOT])
    assert discover(discovery, as_json=False, out=out) == 0
    lines = out.getvalue().splitlines()
    assert lines[0].split() == ["HOST", "STATE", "SLOTS", "DEADLINE", "REASON"]
    assert lines[1].split() == ["10.0.0.1", "ready", "4"]
    assert lines[3].split() == ["10.0.0.3", "draining", "-", "2026-01-01T00:00:00Z", "Terminating:Wait"]
    assert lines[-1] == "2 ready host(s), 8 slot(s); 1 draining"
    assert discovery.closed == 1


def test_discover_json_is_machine_readable():
    out = io.StringIO()
    assert discover(ScriptedDiscovery([SNAPSHOT]), as_json=True, out=out) == 0
    assert json.loads(out.getvalue()) == {
        "provider": "scripted",
        "ready": {"10.0.0.1": 4, "10.0.0.2": 4},
        "draining": {"10.0.0.3": {"reason": "Terminating:Wait", "deadline": 1767225600.0}},
        "total_slots": 8,
    }


def test_discover_failure_is_one_line_on_stderr_and_exit_code_1():
    out, err = io.StringIO(), io.StringIO()
    discovery = ScriptedDiscovery([FatalDiscoveryError("AWS Auto Scaling group 'x' not found in region r")])
    assert discover(discovery, as_json=False, out=out, err=err) == 1
    assert out.getvalue() == ""
    assert err.getvalue() == "cloud-elastic discover: error: AWS Auto Scaling group 'x' not found in region r\n"
    assert discovery.closed == 1


def test_a_plugin_that_raises_on_import_is_listed_with_the_reason_and_the_others_still_are(monkeypatch):
    from cloud_elastic.providers import registry

    class Broken:  # an entry point whose module raises at import (a typo, an SDK incompatibility)
        value = "badplug_pkg:Provider"

        def load(self):
            raise RuntimeError("plugin broken at import")

    installed = registry._entry_points()
    monkeypatch.setattr(registry, "_entry_points", lambda: {"aaa-broken": Broken(), **installed})
    out = io.StringIO()
    list_providers(out)
    text = out.getvalue()
    assert "aaa-broken\n    cannot be loaded: provider 'aaa-broken' could not be imported: RuntimeError: " \
           "plugin broken at import\n" in text
    assert "\nstatic\n" in text and "\naws\n" in text


def test_discover_gives_up_on_a_provider_that_does_not_answer_within_the_discovery_timeout():
    import threading

    go = threading.Event()

    class Hanging(ScriptedDiscovery):  # a cloud API trickling its answer a byte at a time
        def find(self):
            go.wait(20)
            return super().find()

    err = io.StringIO()
    discovery = Hanging([SNAPSHOT])
    try:
        assert discover(discovery, as_json=False, out=io.StringIO(), err=err, timeout_s=0.2) == 1
    finally:
        go.set()
    assert err.getvalue() == ("cloud-elastic discover: error: the scripted provider gave no answer within 0.2s "
                              "(--discovery-timeout 0.2s); no other call starts until that one ends\n")
    assert discovery.closed == 1


def test_the_discover_command_gives_up_at_the_discovery_timeout_it_was_given():
    """The flag reached the script provider only: a cloud API that never answered held ``discover`` (and
    the driver) for the fixed 30 s whatever --discovery-timeout said."""
    with socket.socket() as silent:  # accepts the SDK's connection (the kernel's backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "cloud_elastic.cli", "discover", "--aws-asg", "gpus", "--aws-region", "us-east-1",
             "--aws-endpoint-url", f"http://127.0.0.1:{port}", "--discovery-timeout", "1.5"],
            capture_output=True, text=True, timeout=60,
            env={**os.environ, "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x"})
    assert result.returncode == 1, result.stderr
    assert "gave no answer within 1.5s (--discovery-timeout 1.5s)" in result.stderr, result.stderr


def test_a_plugin_entry_point_that_takes_a_built_in_name_is_listed_as_not_used(monkeypatch):
    from importlib import metadata

    from cloud_elastic.providers import registry

    real = metadata.entry_points
    theirs = metadata.EntryPoint("kubernetes", "their_plugin:Pods", registry.ENTRY_POINT_GROUP)
    monkeypatch.setattr(metadata, "entry_points", lambda **kw: [*real(**kw), theirs])
    assert registry.shadowed() == {"kubernetes": ["their_plugin:Pods"]}
    assert registry.load("kubernetes").__module__ == "cloud_elastic.providers.kubernetes"  # the built-in, always
    out = io.StringIO()
    list_providers(out)
    note = "\n    not used: the entry point kubernetes = their_plugin:Pods (a built-in provider's name)\n"
    assert note in out.getvalue()
