"""Issue 44, findings 5, 8 and 9: every number from a flag, the environment or discovery has a bound and a
one-line refusal; IPv6 hosts are refused by name; new events files are private; metrics bind loopback.

The CLI's own exit codes and messages are checked with real processes in
``tests/integration/test_bad_input.py``; here each rule is checked where it lives.
"""

from __future__ import annotations

import os
import stat
import urllib.request

import pytest

from cloud_elastic.cli import parse_command_line
from cloud_elastic.config import MAX_DURATION_S, JobConfig, elastic_timeout_default
from cloud_elastic.errors import ConfigError, FatalDiscoveryError
from cloud_elastic.events import JsonLinesEvents, open_sinks
from cloud_elastic.providers._common import OptionReader
from cloud_elastic.providers.api import MAX_SLOTS_PER_HOST, DiscoveredHosts
from cloud_elastic.providers.gcp import GCPManagedInstanceGroup
from cloud_elastic.providers.selection import build_discovery, parse_discovery_args
from cloud_elastic.providers.static import StaticHosts
from cloud_elastic.worker.settings import WorkerSettings

pytestmark = pytest.mark.timeout(60)

RUN = ["run", "-np", "1", "-H", "127.0.0.1:1"]
BAD_SECONDS = ["nan", "inf", "-inf", "1e12"]


def _refused(argv: list[str]) -> str:
    with pytest.raises(ConfigError) as info:
        parse_command_line(argv)
    message = str(info.value)
    assert "\n" not in message
    return message


# ------------------------------------------------------------------------------------------ durations
@pytest.mark.parametrize("value", BAD_SECONDS)
@pytest.mark.parametrize("flag", [
    "--heartbeat-timeout", "--elastic-timeout", "--start-timeout", "--progress-timeout", "--straggler-window",
    "--discovery-interval", "--host-missing-grace", "--checkpoint-interval", "--driver-grace",
])
def test_every_duration_flag_refuses_nan_infinity_and_absurd_values(flag: str, value: str) -> None:
    message = _refused([*RUN, flag, value, "python", "train.py"])
    assert flag in message


@pytest.mark.parametrize("pair", [("nan", "nan"), ("nan", "10"), ("1", "inf"), ("1", "1e12")])
def test_the_cooldown_range_refuses_nan_infinity_and_absurd_values(pair: tuple[str, str]) -> None:
    assert "--blacklist-cooldown-range" in _refused([*RUN, "--blacklist-cooldown-range", *pair, "python", "t.py"])


@pytest.mark.parametrize("value", ["nan", "inf", "1.0", "1e9"])
def test_the_straggler_factor_refuses_nan_infinity_and_absurd_values(value: str) -> None:
    assert "--straggler-factor" in _refused([*RUN, "--straggler-factor", value, "python", "train.py"])


@pytest.mark.parametrize(("flag", "value", "floor"), [
    ("--heartbeat-timeout", "0.001", "at least 1s"), ("--heartbeat-timeout", "0.9", "at least 1s"),
    ("--discovery-interval", "0.000001", "at least 0.1s"),
    ("--progress-timeout", "0.01", "at least 5s (or 0: never)"), ("--progress-timeout", "4.9", "at least 5s"),
])
def test_durations_below_what_a_job_works_with_are_refused_naming_the_flag_and_the_floor(flag, value, floor) -> None:
    message = _refused([*RUN, flag, value, "python", "train.py"])
    assert message.startswith(flag) and floor in message


def test_durations_at_their_floors_pass() -> None:
    _, params, _ = parse_command_line([*RUN, "--heartbeat-timeout", "1", "--discovery-interval", "0.1",
                                       "--progress-timeout", "5", "python", "train.py"])
    config: JobConfig = params["config"]
    assert (config.heartbeat_timeout_s, config.discovery_interval_s, config.progress_timeout_s) == (1, 0.1, 5)


@pytest.mark.parametrize("item", ["=1", "", "A B=1", "1X=2", "X-Y"])
def test_a_forwarded_environment_variable_needs_a_name(item: str) -> None:
    assert "-x/--env" in _refused([*RUN, "-x", item, "python", "train.py"])


def test_forwarded_environment_variables_with_names_pass() -> None:
    _, params, _ = parse_command_line([*RUN, "-x", "NCCL_DEBUG=INFO", "-x", "_HOME", "-x", "A=b=c", "python", "t.py"])
    assert params["config"].forward_env == ("NCCL_DEBUG=INFO", "_HOME", "A=b=c")


def test_a_driver_address_that_does_not_resolve_is_refused(monkeypatch) -> None:
    import socket

    def unknown(host, *args, **kwargs):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", unknown)
    message = _refused([*RUN, "--driver-address", "no.such.host.invalid", "python", "train.py"])
    assert message == ("--driver-address 'no.such.host.invalid' does not resolve to an IPv4 address "
                       "(Name or service not known)")


def test_a_driver_address_that_resolves_passes() -> None:
    _, params, _ = parse_command_line([*RUN, "--driver-address", "localhost", "python", "train.py"])
    assert params["config"].driver_address == "localhost"


def test_sane_values_still_pass() -> None:
    _, params, _ = parse_command_line([*RUN, "--heartbeat-timeout", "7.5", "--elastic-timeout", str(MAX_DURATION_S),
                                       "--progress-timeout", "0", "--blacklist-cooldown-range", "0", "0",
                                       "--straggler-factor", "0", "python", "train.py"])
    config: JobConfig = params["config"]
    assert (config.heartbeat_timeout_s, config.elastic_timeout_s) == (7.5, MAX_DURATION_S)


@pytest.mark.parametrize("value", ["nan", "inf", "1e12"])
def test_the_elastic_timeout_from_the_environment_is_checked_too(monkeypatch, value: str) -> None:
    monkeypatch.setenv("HOROVOD_ELASTIC_TIMEOUT", value)
    with pytest.raises(ConfigError, match="HOROVOD_ELASTIC_TIMEOUT"):
        elastic_timeout_default()


@pytest.mark.parametrize(("value", "says"), [
    ("nan", "must be a finite number of seconds, got nan"), ("inf", "must be a finite number of seconds, got inf"),
    ("0", "must be > 0, got 0"), ("-1", "must be > 0, got -1"), ("1e12", "must be at most 3.1536e+07 seconds")])
def test_the_discovery_timeout_is_checked(tmp_path, value: str, says: str) -> None:
    script = tmp_path / "hosts.sh"
    script.write_text("#!/bin/sh\necho 127.0.0.1\n")
    script.chmod(0o755)
    args = parse_discovery_args(["--host-discovery-script", str(script), "--discovery-timeout", value])
    with pytest.raises(ConfigError) as raised:
        build_discovery(args)
    assert str(raised.value).startswith(f"--discovery-timeout {says}"), raised.value  # as every other duration


@pytest.mark.parametrize("value", ["nan", "inf", "1e12"])
def test_a_cloud_providers_seconds_option_is_checked(value: str) -> None:
    with pytest.raises(ConfigError, match="'timeout_s'"):
        OptionReader(GCPManagedInstanceGroup, {"group": "g", "project": "p", "timeout_s": value}).seconds("timeout_s")


@pytest.mark.parametrize("name", ["CLOUD_ELASTIC_HEARTBEAT_TIMEOUT_S", "CLOUD_ELASTIC_COLLECTIVE_TIMEOUT_S",
                                  "CLOUD_ELASTIC_DRIVER_GRACE_S", "CLOUD_ELASTIC_SELFTEST_TIMEOUT_S"])
@pytest.mark.parametrize("value", ["nan", "inf"])
def test_worker_settings_refuse_nan_and_infinity(name: str, value: str) -> None:
    with pytest.raises(ConfigError, match=name):
        WorkerSettings.from_environ({name: value})


# ---------------------------------------------------------------------------------------------- slots
@pytest.mark.parametrize("slots", ["1025", "100000000", "99999999999999999999", "9" * 5000])
def test_a_host_list_with_too_many_slots_is_refused_naming_the_host(slots: str) -> None:
    with pytest.raises(ConfigError) as info:
        build_discovery(parse_discovery_args(["-H", f"127.0.0.1:{slots}"]))
    message = str(info.value)
    assert "'127.0.0.1'" in message and f"at most {MAX_SLOTS_PER_HOST}" in message and "\n" not in message


def test_the_bound_itself_is_allowed() -> None:
    discovery = build_discovery(parse_discovery_args(["-H", f"127.0.0.1:{MAX_SLOTS_PER_HOST}"]))
    assert dict(discovery.find().ready) == {"127.0.0.1": MAX_SLOTS_PER_HOST}


@pytest.mark.parametrize("argv", [["--slots-per-host", "1025", "-H", "127.0.0.1"],
                                  ["--slots-per-host", "100000000", "--aws-asg", "g"]])
def test_slots_per_host_is_bounded_for_every_provider(argv: list[str]) -> None:
    with pytest.raises(ConfigError, match=f"--slots-per-host must be 1-{MAX_SLOTS_PER_HOST}"):
        build_discovery(parse_discovery_args(argv))


def test_every_snapshot_is_held_to_the_bound_whoever_built_it() -> None:
    # A plugin or cloud provider that reports a huge count: one line, fatal (retrying cannot help).
    with pytest.raises(FatalDiscoveryError, match=f"'10.0.0.1' offers 5000 slots; at most {MAX_SLOTS_PER_HOST}"):
        DiscoveredHosts(ready={"10.0.0.2": 8, "10.0.0.1": 5000})
    with pytest.raises(ConfigError, match="at most"):
        StaticHosts({"h": MAX_SLOTS_PER_HOST + 1})


def test_a_snapshot_is_held_to_a_bound_on_hosts_and_slots_in_all() -> None:
    # A script's typo (a loop run too far) made 10,000 hosts of 1,024 slots: 1.4 GB and 13 s of the driver's
    # planning before the first launch. One line, fatal, before any slot is counted twice.
    from cloud_elastic.providers.api import MAX_HOSTS, MAX_SLOTS

    many = {f"10.{i // 65536}.{i // 256 % 256}.{i % 256}": 1 for i in range(MAX_HOSTS + 1)}
    with pytest.raises(FatalDiscoveryError, match=f"^discovery reported {MAX_HOSTS + 1} hosts with {MAX_HOSTS + 1} "
                                                  f"slots; at most {MAX_HOSTS} hosts and {MAX_SLOTS} slots"):
        DiscoveredHosts(ready=many)
    wide = {f"10.0.{i // 256}.{i % 256}": MAX_SLOTS_PER_HOST for i in range(MAX_SLOTS // MAX_SLOTS_PER_HOST + 1)}
    with pytest.raises(FatalDiscoveryError, match=f"with {len(wide) * MAX_SLOTS_PER_HOST} slots"):
        DiscoveredHosts(ready=wide)
    wide.popitem()
    assert sum(DiscoveredHosts(ready=wide).ready.values()) == MAX_SLOTS  # the bound itself is allowed


# ----------------------------------------------------------------------------------------------- IPv6
@pytest.mark.parametrize("hosts", ["[2001:db8::1]:1", "127.0.0.1:1,[::1]:2", "fe80::1"])
def test_ipv6_hosts_are_refused_at_parse_time(hosts: str) -> None:
    with pytest.raises(ConfigError, match="IPv6 address, which is not supported") as info:
        build_discovery(parse_discovery_args(["-H", hosts]))
    assert "\n" not in str(info.value)


def test_ipv6_hosts_from_any_provider_are_refused() -> None:
    with pytest.raises(FatalDiscoveryError, match="IPv6"):
        DiscoveredHosts(ready={"10.0.0.1": 1}, draining={"2001:db8::7": None})  # type: ignore[dict-item]


def test_an_ipv6_driver_address_is_refused() -> None:
    assert "IPv6" in _refused([*RUN, "--driver-address", "2001:db8::1", "python", "train.py"])


# ------------------------------------------------------------------------------------ checkpoint URLs
@pytest.mark.parametrize("url", ["nosuchproto://b/x", "simplecache::nosuchproto://b/x", "NoSuch://x"])
def test_a_checkpoint_url_of_an_unknown_protocol_is_one_line(url: str) -> None:
    assert "no fsspec implementation knows the protocol" in _refused([*RUN, "--checkpoint-dir", url, "python", "t.py"])


@pytest.mark.parametrize("url", ["memory://ckpt", "/tmp/ckpt", "file:///tmp/ckpt", "relative/dir",
                                 "simplecache::memory://ckpt"])
def test_known_checkpoint_urls_pass(url: str) -> None:
    _, params, _ = parse_command_line([*RUN, "--checkpoint-dir", url, "python", "train.py"])
    assert params["config"].checkpoint_dir == url


# --------------------------------------------------------------------------------- events and metrics
def test_a_new_events_file_is_readable_by_its_owner_only(tmp_path) -> None:
    path = tmp_path / "events.jsonl"
    old = os.umask(0o022)  # the usual umask, which left the file world-readable
    try:
        with JsonLinesEvents(str(path), "job1") as events:
            events.emit("job_started", num_proc=1, min_np=1, max_np=1, provider="static", command=["python", "t"])
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert '"command":["python","t"]' in path.read_text()


def test_metrics_bind_loopback_unless_told_otherwise() -> None:
    pytest.importorskip("prometheus_client")
    sinks = open_sinks("job1", None, 0)
    try:
        assert sinks.metrics is not None
        assert sinks.metrics.address[0] == "127.0.0.1"
        body = urllib.request.urlopen(f"http://127.0.0.1:{sinks.metrics.port}/metrics", timeout=10).read()
        assert b"cloud_elastic_world_size" in body
    finally:
        sinks.close()
        if sinks.metrics is not None:
            sinks.metrics.close()


def test_metrics_addr_is_a_flag() -> None:
    _, params, _ = parse_command_line([*RUN, "--metrics-port", "0", "--metrics-addr", "0.0.0.0", "python", "t.py"])
    assert params["config"].metrics_addr == "0.0.0.0"
    _, params, _ = parse_command_line([*RUN, "--metrics-port", "0", "python", "t.py"])
    assert params["config"].metrics_addr == "127.0.0.1"


def test_the_driver_grace_is_at_most_what_a_restarted_driver_accepts_back_from_storage() -> None:
    # The grace is written to driver-alive.json beside the checkpoints; a successor refuses more than 7 days there.
    from cloud_elastic.checkpoint.alive import MAX_GRACE_S

    assert "--driver-grace" in _refused([*RUN, "--driver-grace", str(MAX_GRACE_S + 1), "python", "train.py"])
    parse_command_line([*RUN, "--driver-grace", str(MAX_GRACE_S), "python", "train.py"])
