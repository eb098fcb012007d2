"""SSHLauncher pieces that need no sshd: the ssh invocation, the remote command, failure naming."""

from __future__ import annotations

import os
import shlex
import sys
import tempfile

import pytest

from cloud_elastic.config import SSHConfig
from cloud_elastic.driver.launch.api import WorkerSpec
from cloud_elastic.driver.launch.ssh_remote import MODULE, parse_env
from cloud_elastic.driver.launch.ssh import SECRET_ENV, SSHLauncher
from cloud_elastic.driver.launch.ssh_setup import classify, destination, env_line, ssh_environ, wrapper_failure
from cloud_elastic.errors import ConfigError, LaunchError

pytestmark = pytest.mark.timeout(10)


def _spec(**changes: object) -> WorkerSpec:
    fields: dict[str, object] = dict(
        worker_id="w0", host="10.0.1.4", slot=1, command=("python", "train.py", "--lr=0.1"),
        env={"CLOUD_ELASTIC_JOB_ID": "job-1"}, secret="topsecret", cwd="/srv/job",
    )
    fields.update(changes)
    return WorkerSpec(**fields)  # type: ignore[arg-type]


def _options(argv: list[str]) -> list[str]:
    return [argv[i + 1] for i, arg in enumerate(argv) if arg == "-o"]


def test_ssh_invocation_is_non_interactive_and_uses_the_config(tmp_path):
    key = tmp_path / "id"
    key.write_text("k")
    with SSHLauncher(SSHConfig(port=2222, identity_file=str(key), user="ubuntu", connect_timeout_s=2.5)) as launcher:
        argv = launcher.ssh_argv("10.0.1.4")
    options = _options(argv)
    assert argv[1] == "-T" and options[0] == "BatchMode=yes"
    assert {"ConnectTimeout=3", "StrictHostKeyChecking=accept-new", "ServerAliveInterval=5",
            "IdentitiesOnly=yes"} <= set(options)
    assert argv[argv.index("-p") + 1] == "2222"
    assert argv[argv.index("-i") + 1] == str(key)
    assert argv[argv.index("-l") + 1] == "ubuntu"
    assert argv[-2:] == ["--", "10.0.1.4"]


def test_extra_options_override_defaults_but_not_batch_mode_nor_a_connection_per_worker():
    given = ("StrictHostKeyChecking=no", "UserKnownHostsFile /dev/null", "BatchMode=no", "ControlMaster=auto",
             "ControlPath=/tmp/%C")
    with SSHLauncher(SSHConfig(extra_options=given)) as launcher:
        argv = launcher.ssh_argv("h")
    options = _options(argv)
    # First value wins in ssh. A user's ControlMaster would put every worker of a host in one connection.
    assert options[:3] == ["BatchMode=yes", "ControlMaster=no", "ControlPath=none"]
    assert "StrictHostKeyChecking=accept-new" not in options
    assert "StrictHostKeyChecking=no" in options and "UserKnownHostsFile /dev/null" in options
    assert [o for o in options if o.lower().startswith("userknownhostsfile")] == ["UserKnownHostsFile /dev/null"]


@pytest.mark.parametrize("config, named", [
    (SSHConfig(port=2222, user="ubuntu"), "ubuntu@10.0.0.7:2222"),
    (SSHConfig(user="root", extra_options=("ConnectTimeout=3", "port=22622")), "root@10.0.0.7:22622"),
    (SSHConfig(), "10.0.0.7"),  # ssh's own configuration (~/.ssh/config) picks the port: none is guessed
])
def test_a_failure_line_names_the_port_only_where_the_job_knows_it(config, named):
    """A review gave the port by ``--ssh-option Port=22622`` and an authentication failure's line said
    ``root@127.0.0.4:22``, pointing the operator at the wrong port."""
    assert destination(config, "10.0.0.7") == named


def test_a_remote_python_that_cannot_start_is_quoted_by_its_fatal_error_not_its_empty_stack():
    """A review forwarded ``-x PYTHONHOME=/x``: the failure line quoted "<no Python frame>", the last of what the
    remote Python printed; the fatal error and its cause were a few lines above."""
    import subprocess
    from cloud_elastic.driver.launch.ssh_setup import STDERR_TAIL

    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    said = subprocess.run([sys.executable, "-c", "1"], env={**env, "PYTHONHOME": "/x"}, capture_output=True,
                          text=True, timeout=30).stderr.splitlines()[-STDERR_TAIL:]
    assert "<no Python frame>" in said[-1]  # what the line quoted before
    line = wrapper_failure(1, said)
    assert "remote said: Fatal Python error: init_fs_encoding" in line and "No module named 'encodings'" in line, line


def test_host_keys_go_to_a_job_private_file_by_default():
    with SSHLauncher(SSHConfig()) as launcher:
        options = _options(launcher.ssh_argv("10.0.1.4"))
        path = launcher.known_hosts_file
        assert path is not None and os.path.isfile(path)
        assert not path.startswith(os.path.expanduser("~"))
        assert f"UserKnownHostsFile={path}" in options and "HashKnownHosts=no" in options
        assert "StrictHostKeyChecking=accept-new" in options
    assert not os.path.exists(path)


@pytest.mark.parametrize("option, private", [
    ("UserKnownHostsFile=~/.ssh/pinned", False),
    ("StrictHostKeyChecking=yes", False),
    ("stricthostkeychecking ask", False),
    ("StrictHostKeyChecking=no", True),
    ("StrictHostKeyChecking=accept-new", True),
])
def test_the_users_own_known_hosts_choice_wins(option, private):
    with SSHLauncher(SSHConfig(extra_options=(option,))) as launcher:
        options = _options(launcher.ssh_argv("10.0.1.4"))
        assert (launcher.known_hosts_file is not None) is private
        assert any(o.startswith("UserKnownHostsFile=") and "cloud-elastic-ssh-" in o for o in options) is private


@pytest.mark.parametrize("bad", ["-F/etc/passwd", "StrictHostKeyChecking", "=no"])
def test_malformed_extra_options_are_refused(bad):
    with pytest.raises(ConfigError, match="Key=Value"):
        SSHLauncher(SSHConfig(extra_options=(bad,)))


def test_keepalive_must_leave_room_for_lost_lines():
    with pytest.raises(ConfigError):
        SSHLauncher(SSHConfig(), keepalive_interval_s=5, keepalive_timeout_s=8)
    SSHLauncher(SSHConfig(), keepalive_interval_s=5, keepalive_timeout_s=0)  # 0 disables


NASTY = ["job 1; rm -rf /", "it's", 'say "hi"', "$HOME", "`id`", "x\ny", "back\\slash", "", "ünï", "\udcff", "%d"]


def test_remote_command_holds_neither_the_secret_nor_the_variables_values():
    env = {"PYTHONPATH": "/srv/my lib", "HF_TOKEN": "hf_s3cret", **{f"V{i}": v for i, v in enumerate(NASTY)}}
    spec = _spec(env=env)
    command = SSHLauncher(SSHConfig()).remote_command(spec, "nonce123")
    assert spec.secret not in command and "hf_s3cret" not in command
    words = shlex.split(command)
    assert words[:3] == ["exec", "env", "--"] and words[4] == "PYTHONPATH=/srv/my lib"  # it picks the wrapper
    assert words[5:] == ["python3", "-m", MODULE, "--env", "nonce123", "5.0", "30.0", "/srv/job", "python", "train.py",
                         "--lr=0.1"]
    assert command.split(" ")[3] == shlex.quote(f"PATH={os.path.dirname(sys.executable)}:") + '"$PATH"'
    # They follow the secret on ssh's stdin, on one line, and the wrapper reads them back exactly.
    line = env_line(spec)
    assert line.endswith("\n") and "\n" not in line[:-1] and line.isascii()
    assert parse_env(line[:-1]) == {name: value for name, value in env.items() if name != "PYTHONPATH"}


def test_ssh_gets_no_variable_that_ssh_config_sends_by_default():
    environ = {"HOME": "/root", "SSH_AUTH_SOCK": "/run/agent", "LANG": "tr_TR.UTF-8", "LC_ALL": "C",
               "LC_MY_DB_PASSWORD": "hunter2", "LANGUAGE": "tr", "COLORTERM": "truecolor", "LANGX": "kept"}
    assert ssh_environ(environ) == {"HOME": "/root", "SSH_AUTH_SOCK": "/run/agent", "LANGX": "kept"}


def test_a_percent_in_the_temporary_directory_reaches_ssh_escaped(tmp_path, monkeypatch):
    odd = tmp_path / "jobs_100%done"  # ssh would read %d as the home directory
    odd.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(odd))
    with SSHLauncher(SSHConfig()) as launcher:
        options = _options(launcher.ssh_argv("h"))
        assert launcher.known_hosts_file.startswith(str(odd))
        assert f"UserKnownHostsFile={launcher.known_hosts_file.replace('%', '%%')}" in options


def test_a_forwarded_path_gets_the_python_dir_prepended():
    command = SSHLauncher(SSHConfig()).remote_command(_spec(env={"PATH": "/opt/bin:/usr/bin"}), "n")
    assert f"PATH={os.path.dirname(sys.executable)}:/opt/bin:/usr/bin" in shlex.split(command)


@pytest.mark.parametrize("env", [{"BAD NAME": "x"}, {"A=B": "x"}, {SECRET_ENV: "leak"}])
def test_unsendable_environments_are_refused(env):
    with pytest.raises(LaunchError):
        SSHLauncher(SSHConfig()).remote_command(_spec(env=env), "n")


def test_a_multi_line_secret_is_refused():
    with pytest.raises(LaunchError, match="single line"):
        SSHLauncher(SSHConfig()).launch(_spec(secret="a\nb"), print)


@pytest.mark.parametrize("stderr, expected", [
    (["ssh: connect to host 10.0.1.9 port 22: Connection refused"], "host unreachable: connection refused"),
    (["ssh: connect to host 10.0.1.9 port 22: Connection timed out"], "host unreachable: connection timed out"),
    (["ssh: connect to host 10.0.1.9 port 22: No route to host"], "host unreachable: no route to host"),
    (["ssh: Could not resolve hostname nowhere: Name or service not known"], "host name does not resolve"),
    (["ubuntu@10.0.1.9: Permission denied (publickey)."], "authentication refused"),
    (["@ WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED! @", "Host key verification failed."], "host key mismatch"),
    (["No ED25519 host key is known for 10.0.1.9 and you have requested strict checking.",
      "Host key verification failed."], "host key unknown"),
    (["Timeout, server 10.0.1.9 not responding."], "connection lost: the server stopped responding"),
    (["Connection to 10.0.1.9 port 22 timed out"], "connection lost: the server stopped responding"),
    (["Connection timed out during banner exchange"], "host unreachable: connection timed out"),
    (["Connection to 10.0.1.9 closed by remote host."], "connection lost"),
    (["something new"], "ssh exited with 255 (ssh said: something new)"),
    ([], "without reporting"),
])
def test_ssh_failures_are_named(stderr, expected):
    assert expected in classify(stderr)


def test_a_host_without_cloud_elastic_is_named():
    message = wrapper_failure(1, ["/opt/ce/bin/python3: No module named cloud_elastic"])
    assert "cannot import cloud_elastic" in message and "No module named" in message
    assert "exited with 2" in wrapper_failure(2, ["cloud-elastic remote: bad arguments"])
