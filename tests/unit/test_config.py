"""Job configuration validation (cloud_elastic.config)."""

from __future__ import annotations

import dataclasses

import pytest

from cloud_elastic.config import ENV_ELASTIC_TIMEOUT, JobConfig, SSHConfig, elastic_timeout_default
from cloud_elastic.errors import ConfigError

pytestmark = pytest.mark.timeout(10)

CMD = ("python", "train.py")


def config(**overrides) -> JobConfig:
    values = {"command": CMD, "num_proc": 2, "min_np": 1, "max_np": 4}
    values.update(overrides)
    return JobConfig(**values)


def test_valid_config_is_frozen_and_keeps_defaults() -> None:
    cfg = config()
    assert (cfg.num_proc, cfg.min_np, cfg.max_np, cfg.cooldown_range_s) == (2, 1, 4, (10.0, 300.0))
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.num_proc = 3  # type: ignore[misc]


@pytest.mark.parametrize("sizes", [(1, 1, 1), (2, 2, 2), (1, 1, 4), (4, 1, 4)])
def test_np_on_the_bounds_is_accepted(sizes: tuple[int, int, int]) -> None:
    num_proc, min_np, max_np = sizes
    assert config(num_proc=num_proc, min_np=min_np, max_np=max_np).num_proc == num_proc


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"command": ()}, "no training command given"),
        ({"min_np": 0, "num_proc": 0}, "-np must be >= 1, got 0"),
        ({"min_np": 0, "num_proc": 1}, "--min-np must be >= 1, got 0"),
        ({"num_proc": 2, "min_np": 2, "max_np": 1}, "-np (2) must be <= --max-np (1)"),
        ({"num_proc": 2, "min_np": 1, "max_np": 1}, "-np (2) must lie between --min-np (1) and --max-np (1)"),
        ({"num_proc": 5}, "-np (5) must lie between --min-np (1) and --max-np (4)"),
        ({"num_proc": 1, "min_np": 2}, "-np (1) must lie between --min-np (2) and --max-np (4)"),
        ({"cooldown_range_s": (-1.0, 10.0)}, "--blacklist-cooldown-range needs 0 <= MIN <= MAX, got -1 10"),
        ({"cooldown_range_s": (20.0, 10.0)}, "--blacklist-cooldown-range needs 0 <= MIN <= MAX, got 20 10"),
        ({"reset_limit": -1}, "--reset-limit must be >= 0, got -1"),
        ({"elastic_timeout_s": 0}, "--elastic-timeout must be > 0"),
        ({"start_timeout_s": -5}, "--start-timeout must be > 0"),
        ({"discovery_interval_s": 0}, "--discovery-interval must be at least 0.1s, got 0"),
        ({"heartbeat_timeout_s": 0}, "--heartbeat-timeout must be at least 1s, got 0"),
        ({"heartbeat_timeout_s": float("nan")}, "--heartbeat-timeout must be a finite number of seconds, got nan"),
        ({"heartbeat_timeout_s": 1.0, "heartbeat_interval_s": 0.5}, "must exceed twice the heartbeat interval"),
    ],
    ids=[
        "no-command", "np-0", "min-np-0", "max-below-np", "np-above-both", "np-above-max", "np-below-min",
        "negative-cooldown", "cooldown-reversed", "negative-reset-limit", "elastic-timeout", "start-timeout",
        "discovery-interval", "heartbeat-timeout-0", "heartbeat-timeout-nan", "heartbeat",
    ],
)
def test_invalid_config_raises_one_line_config_error(overrides: dict, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        config(**overrides)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_zero_cooldown_range_and_zero_reset_limit_are_valid() -> None:
    cfg = config(cooldown_range_s=(0.0, 0.0), reset_limit=0)
    assert (cfg.cooldown_range_s, cfg.reset_limit) == ((0.0, 0.0), 0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"port": 0}, "--ssh-port must be 1-65535, got 0"), ({"port": 65536}, "got 65536")],
)
def test_ssh_port_range(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        SSHConfig(**kwargs)


def test_missing_ssh_identity_file(tmp_path) -> None:
    with pytest.raises(ConfigError, match="--ssh-identity-file .* does not exist"):
        SSHConfig(identity_file=str(tmp_path / "id_missing"))
    key = tmp_path / "id_ed25519"
    key.write_text("key")
    assert SSHConfig(identity_file=str(key), port=2222).port == 2222


def test_an_ssh_identity_file_under_home_is_found_when_no_shell_expanded_its_tilde(tmp_path, monkeypatch) -> None:
    """Review h5 (2026-12-01): Terraform's printed run line says ``--ssh-identity-file ~/.ssh/cloud-elastic``; run
    without a shell (a unit file, a subprocess) the "~" stayed, and the key was said not to exist (ssh -i itself
    expands it)."""
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "cloud-elastic").write_text("key")
    assert SSHConfig(identity_file="~/.ssh/cloud-elastic").identity_file == str(tmp_path / ".ssh" / "cloud-elastic")
    with pytest.raises(ConfigError, match=r"^--ssh-identity-file '.*/\.ssh/other' does not exist$"):
        SSHConfig(identity_file="~/.ssh/other")


# ------------------------------------------------------------ environment
@pytest.fixture
def no_timeout_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for var in (ENV_ELASTIC_TIMEOUT, "CLOUD_ELASTIC_ELASTIC_TIMEOUT"):
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def test_elastic_timeout_default_without_environment(no_timeout_env) -> None:
    assert elastic_timeout_default(600.0) == 600.0


def test_horovod_variable_sets_the_elastic_timeout(no_timeout_env) -> None:
    no_timeout_env.setenv(ENV_ELASTIC_TIMEOUT, "42")
    assert elastic_timeout_default(600.0) == 42.0


def test_our_variable_wins_over_horovods(no_timeout_env) -> None:
    no_timeout_env.setenv(ENV_ELASTIC_TIMEOUT, "42")
    no_timeout_env.setenv("CLOUD_ELASTIC_ELASTIC_TIMEOUT", "7.5")
    assert elastic_timeout_default(600.0) == 7.5


def test_malformed_variable_names_itself(no_timeout_env) -> None:
    no_timeout_env.setenv(ENV_ELASTIC_TIMEOUT, "ten minutes")
    with pytest.raises(ConfigError, match=f"{ENV_ELASTIC_TIMEOUT} must be a number of seconds, got 'ten minutes'"):
        elastic_timeout_default(600.0)
