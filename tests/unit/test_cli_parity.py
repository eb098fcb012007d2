"""Every documented flag and shorthand parses to the configuration the argparse CLI produced.

The expected values were captured once by running the argparse parser (the CLI
before click) on these very command lines; they are written out here, not
recomputed, so a change of meaning in any flag fails this test.
"""

from __future__ import annotations

import dataclasses

import pytest

from cloud_elastic.cli import parse_command_line
from cloud_elastic.providers.selection import selected_provider

pytestmark = pytest.mark.timeout(10)

#: JobConfig of ``run -np 2 -H h:2 python t.py`` under the argparse CLI (cwd left out).
BASE = {
    "command": ["python", "t.py"], "num_proc": 2, "min_np": 2, "max_np": 2, "elastic_timeout_s": 600.0,
    "start_timeout_s": 600.0, "reset_limit": None, "cooldown_range_s": [10.0, 300.0], "discovery_interval_s": 1.0,
    "heartbeat_interval_s": 0.5, "heartbeat_timeout_s": 5.0, "finish_timeout_s": None, "terminate_grace_s": 5.0,
    "driver_address": None, "network_interface": None, "forward_env": [],
    "ssh": {"port": None, "identity_file": None, "user": None, "extra_options": [], "connect_timeout_s": 10.0},
    "verbose": False, "force_ssh": False, "host_missing_grace_s": 10.0, "checkpoint_dir": None,
    "checkpoint_interval_s": 300.0, "checkpoint_keep": 2, "driver_grace_s": 60.0, "notice_watcher": "auto",
    "drain_on_rebalance": False, "events_file": None, "metrics_port": None, "progress_timeout_s": 120.0,
    "straggler_factor": 2.0, "straggler_window_s": 60.0,
    "whole_host_slots": 0,  # --whole-hosts came after argparse: off unless given
    "restarts": 0,  # --restarts too
    "metrics_addr": "127.0.0.1",  # and --metrics-addr: argparse's metrics server bound every interface
    "fallback_after_s": None, "manage_capacity": False,  # several host sources (issue 45) came later still
    "spares": 0,  # --spares (issue 41): none unless asked for
}
ONE = {"num_proc": 1, "min_np": 1, "max_np": 1}

# name: (argv, environment, provider selection, slots_per_host, discovery_timeout, address_map, config fields != BASE)
CASES = {
    "defaults": (["run", "-np", "2", "-H", "h:2", "python", "t.py"], {},
                 ("static", {"hosts": "h:2"}), None, 30.0, [], {}),
    "long-names": (["run", "--num-proc", "3", "--min-np", "1", "--max-np", "4", "--hosts", "a:2,b:2",
                    "python", "t.py", "--lr", "1"], {},
                   ("static", {"hosts": "a:2,b:2"}), None, 30.0, [],
                   {"command": ["python", "t.py", "--lr", "1"], "num_proc": 3, "min_np": 1, "max_np": 4}),
    "whole-hosts": (["run", "-np", "4", "--min-np", "2", "-H", "a:2,b:2", "--slots-per-host", "2", "--whole-hosts",
                     "python", "t.py"], {},
                    ("static", {"hosts": "a:2,b:2"}), 2, 30.0, [],
                    {"num_proc": 4, "min_np": 2, "max_np": 4, "whole_host_slots": 2}),
    "restarts": (["run", "-np", "2", "-H", "h:2", "--restarts", "2", "python", "t.py"], {},
                 ("static", {"hosts": "h:2"}), None, 30.0, [], {"restarts": 2}),
    "spares": (["run", "-np", "2", "-H", "h:3", "--spares", "1", "python", "t.py"], {},
               ("static", {"hosts": "h:3"}), None, 30.0, [], {"spares": 1}),
    "double-dash": (["run", "-np", "1", "-H", "h", "--", "python", "t.py", "-np", "9"], {},
                    ("static", {"hosts": "h"}), None, 30.0, [],
                    {"command": ["python", "t.py", "-np", "9"], **ONE}),
    "script": (["run", "-np", "2", "--host-discovery-script", "./d.sh", "--discovery-timeout", "5",
                "--discovery-interval", "0.5", "--slots-per-host", "2", "python", "t.py"], {},
               ("script", {"path": "./d.sh", "timeout_s": "5.0"}), 2, 5.0, [], {"discovery_interval_s": 0.5}),
    "elasticity": (["run", "-np", "2", "-H", "h:2", "--blacklist-cooldown-range", "1", "5", "--reset-limit", "3",
                    "--elastic-timeout", "30", "--start-timeout", "40", "--heartbeat-timeout", "8",
                    "--progress-timeout", "45", "python", "t.py"],
                   {}, ("static", {"hosts": "h:2"}), None, 30.0, [],
                   {"elastic_timeout_s": 30.0, "start_timeout_s": 40.0, "reset_limit": 3,
                    "cooldown_range_s": [1.0, 5.0], "heartbeat_timeout_s": 8.0, "progress_timeout_s": 45.0}),
    "remote": (["run", "-np", "2", "-H", "h:2", "--ssh-port", "2222", "--ssh-user", "u",
                "--ssh-identity-file", "id_ed25519", "--ssh-option", "StrictHostKeyChecking=no",
                "--ssh-option", "ConnectTimeout 5", "--driver-address", "10.0.0.1", "--network-interface", "eth0",
                "-x", "FOO", "-x", "BAR=1", "--env", "BAZ", "--verbose", "--force-ssh", "python", "t.py"], {},
               ("static", {"hosts": "h:2"}), None, 30.0, [],
               {"driver_address": "10.0.0.1", "network_interface": "eth0", "forward_env": ["FOO", "BAR=1", "BAZ"],
                "ssh": {"port": 2222, "identity_file": "id_ed25519", "user": "u",
                        "extra_options": ["StrictHostKeyChecking=no", "ConnectTimeout 5"], "connect_timeout_s": 10.0},
                "verbose": True, "force_ssh": True}),
    "aws": (["run", "-np", "8", "--aws-asg", "g", "--aws-region", "r", "--aws-endpoint-url", "http://e",
             "--address-map", "10.0.0.0/8=127.0.0.0/8", "--address-map", "1.2.3.4=127.0.0.9", "python", "t.py"], {},
            ("aws", {"group": "g", "region": "r", "endpoint_url": "http://e"}), None, 30.0,
            ["10.0.0.0/8=127.0.0.0/8", "1.2.3.4=127.0.0.9"], {"num_proc": 8, "min_np": 8, "max_np": 8}),
    "gcp-zonal": (["run", "-np", "1", "--gcp-mig", "m", "--gcp-project", "p", "--gcp-zone", "z",
                   "--gcp-endpoint", "http://g", "python", "t.py"], {},
                  ("gcp", {"group": "m", "project": "p", "zone": "z", "endpoint": "http://g"}), None, 30.0, [], ONE),
    "gcp-regional": (["run", "-np", "1", "--gcp-mig", "m", "--gcp-project", "p", "--gcp-region", "r",
                      "python", "t.py"], {},
                     ("gcp", {"group": "m", "project": "p", "region": "r"}), None, 30.0, [], ONE),
    "azure": (["run", "-np", "1", "--azure-vmss", "s", "--azure-resource-group", "rg", "--azure-subscription", "sub",
               "--azure-endpoint", "http://a", "python", "t.py"], {},
              ("azure", {"group": "s", "resource_group": "rg", "subscription": "sub", "endpoint": "http://a"}),
              None, 30.0, [], ONE),
    "ibm": (["run", "-np", "1", "--ibm-instance-group", "id", "--ibm-region", "us-south",
             "--ibm-endpoint", "http://i/v1", "python", "t.py"], {},
            ("ibm", {"group": "id", "region": "us-south", "endpoint": "http://i/v1"}), None, 30.0, [], ONE),
    "provider": (["run", "-np", "1", "--provider", "hostsfile", "-o", "path=/x.json", "--provider-option", "k=v",
                  "python", "t.py"], {},
                 ("hostsfile", {"path": "/x.json", "k": "v"}), None, 30.0, [], ONE),
    "cloud-and-o": (["run", "-np", "1", "--aws-asg", "g", "-o", "max_attempts=3", "python", "t.py"], {},
                    ("aws", {"max_attempts": "3", "group": "g"}), None, 30.0, [], ONE),
    "env-horovod": (["run", "-np", "2", "-H", "h:2", "python", "t.py"], {"HOROVOD_ELASTIC_TIMEOUT": "42"},
                    ("static", {"hosts": "h:2"}), None, 30.0, [], {"elastic_timeout_s": 42.0}),
    "env-ours": (["run", "-np", "2", "-H", "h:2", "python", "t.py"],
                 {"HOROVOD_ELASTIC_TIMEOUT": "42", "CLOUD_ELASTIC_ELASTIC_TIMEOUT": "7"},
                 ("static", {"hosts": "h:2"}), None, 30.0, [], {"elastic_timeout_s": 7.0}),
}


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    for var in ("HOROVOD_ELASTIC_TIMEOUT", "CLOUD_ELASTIC_ELASTIC_TIMEOUT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "id_ed25519").write_text("key")  # --ssh-identity-file must exist


def _plain(value):
    """Tuples as lists, as the captured JSON has them."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


@pytest.mark.parametrize("name", CASES)
def test_run_flags_parse_to_the_argparse_configuration(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    argv, env, provider, slots, discovery_timeout, address_map, changed = CASES[name]
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    _, params, discovery = parse_command_line(argv)
    config = dataclasses.asdict(params["config"])
    config.pop("cwd")
    assert _plain(config) == {**BASE, **changed}
    assert selected_provider(discovery) == provider
    assert (discovery.slots_per_host, discovery.discovery_timeout) == (slots, discovery_timeout)
    assert list(discovery.address_map) == address_map


def test_discover_flags_parse_as_before() -> None:
    _, params, discovery = parse_command_line(
        ["discover", "--aws-asg", "g", "--aws-region", "r", "--json", "--verbose", "--slots-per-host", "4"])
    assert selected_provider(discovery) == ("aws", {"group": "g", "region": "r"})
    assert (params["as_json"], params["verbose"], discovery.slots_per_host) == (True, True, 4)


def test_new_run_flags_reach_the_job_configuration() -> None:
    _, params, _ = parse_command_line([
        "run", "-np", "1", "-H", "h", "--host-missing-grace", "3", "--checkpoint-dir", "s3://b/ck",
        "--checkpoint-interval", "60", "--checkpoint-keep", "5", "--driver-grace", "20", "--notice-watcher", "gcp",
        "--drain-on-rebalance", "--events-file", "ev.jsonl", "--metrics-port", "9100",
        "--metrics-addr", "0.0.0.0", "python", "t.py",
    ])
    config = params["config"]
    assert (config.host_missing_grace_s, config.checkpoint_dir, config.checkpoint_interval_s) == (3.0, "s3://b/ck", 60.0)
    assert (config.checkpoint_keep, config.driver_grace_s, config.notice_watcher) == (5, 20.0, "gcp")
    assert (config.drain_on_rebalance, config.events_file, config.metrics_port) == (True, "ev.jsonl", 9100)
    assert config.metrics_addr == "0.0.0.0"


def test_the_multi_source_flags_reach_the_job_configuration_and_the_sources() -> None:
    _, params, discovery = parse_command_line([
        "run", "-np", "2", "--aws-asg", "spot-a", "--aws-asg", "spot-b", "--aws-asg", "od",
        "--source", "od:fallback,on_demand_price=3.06", "--fallback-after", "120", "--manage-capacity",
        "python", "t.py",
    ])
    config = params["config"]
    assert (config.fallback_after_s, config.manage_capacity) == (120.0, True)
    assert discovery.groups == (("aws_asg", "spot-a"), ("aws_asg", "spot-b"), ("aws_asg", "od"))
    assert discovery.source == ("od:fallback,on_demand_price=3.06",)
