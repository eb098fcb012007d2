"""--help, providers and shell completion: what they print, and that they import nothing heavy."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(30)

CLI = [sys.executable, "-m", "cloud_elastic.cli"]
#: Modules whose import would make --help slow (torch ~1 s, google-cloud-compute ~3 s; ssl and http.client,
#: which the notice watchers bring, ~13 ms of a 0.3 s budget: benchmarks/cli_import.py).
HEAVY = ("torch", "numpy", "boto3", "botocore", "google.cloud.compute_v1", "azure.mgmt.compute", "azure.identity",
         "ibm_vpc", "ibm_cloud_sdk_core", "matplotlib", "prometheus_client", "ssl", "http.client")


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=20, stdin=subprocess.DEVNULL,
                          env={**os.environ, **(env or {})})


def _complete(shell_words: str, cword: int) -> list[str]:
    result = _run(env={"COMP_WORDS": shell_words, "COMP_CWORD": str(cword), "_CLOUD_ELASTIC_COMPLETE": "bash_complete"})
    assert result.returncode == 0, result.stderr
    return [line.split(",", 1)[1] for line in result.stdout.splitlines()]


@pytest.mark.parametrize("argv", [["--help"], ["run", "--help"], ["providers"], ["status", "--help"]])
def test_help_providers_and_completion_import_no_torch_and_no_cloud_sdk(argv: list[str]) -> None:
    code = (
        "import json, sys, runpy\n"
        f"sys.argv = ['cloud-elastic', *{argv!r}]\n"
        "try:\n    runpy.run_module('cloud_elastic.cli', run_name='__main__')\n"
        "except SystemExit as exc:\n    code = exc.code\n"
        f"heavy = {HEAVY!r}\n"
        "print(json.dumps({'code': code, 'heavy': sorted(m for m in heavy if m in sys.modules)}))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=20)
    assert json.loads(result.stdout.splitlines()[-1]) == {"code": 0, "heavy": []}, result.stderr


def test_completion_imports_nothing_heavy() -> None:
    code = (
        "import json, os, sys\n"
        "os.environ.update(COMP_WORDS='cloud-elastic run --provider ', COMP_CWORD='3',"
        " _CLOUD_ELASTIC_COMPLETE='bash_complete')\n"
        "from cloud_elastic.cli import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=20)
    assert result.stdout.splitlines()[-1] == "[]", result.stderr


def test_top_level_help_lists_every_command() -> None:
    result = _run("--help")
    assert result.returncode == 0
    for command in ("run", "discover", "providers", "status", "drain", "timeline"):
        assert f"\n  {command} " in result.stdout


def test_no_subcommand_prints_help_and_exits_2() -> None:
    result = _run()
    assert result.returncode == 2 and "Usage: cloud-elastic" in result.stderr


@pytest.mark.parametrize(("shell", "marker"), [
    ("bash_source", "complete -o nosort -F _cloud_elastic_completion cloud-elastic"),
    ("zsh_source", "#compdef cloud-elastic"),
    ("fish_source", "complete --no-files --command cloud-elastic"),
])
def test_completion_scripts_for_bash_zsh_and_fish(shell: str, marker: str) -> None:
    result = _run(env={"_CLOUD_ELASTIC_COMPLETE": shell})
    assert result.returncode == 0, result.stderr
    assert marker in result.stdout
    assert "_CLOUD_ELASTIC_COMPLETE=" in result.stdout


def test_completion_of_subcommands_flags_and_provider_names() -> None:
    assert _complete("cloud-elastic ", 1) == ["run", "discover", "providers", "status", "drain", "timeline"]
    assert "--num-proc" in _complete("cloud-elastic run --nu", 2)
    # Provider names come from the installed entry points, built-ins and plugins alike.
    from cloud_elastic.providers import registry

    names = _complete("cloud-elastic run --provider ", 3)
    assert names == registry.available()
    assert {"aws", "azure", "gcp", "ibm", "script", "static"} <= set(names)
    assert _complete("cloud-elastic discover --provider a", 3) == ["aws", "azure"]
    assert _complete("cloud-elastic run --notice-watcher a", 3) == ["auto", "aws", "azure"]


def test_unknown_flag_after_the_command_goes_to_the_command() -> None:
    from cloud_elastic.cli import parse_command_line

    _, params, _ = parse_command_line(["run", "-np", "1", "-H", "h", "python", "t.py", "--no-such-flag", "-h"])
    assert params["config"].command == ("python", "t.py", "--no-such-flag", "-h")


def test_every_flag_in_the_readme_table_and_the_providers_doc_exists() -> None:
    import re
    from pathlib import Path

    from cloud_elastic.cli import cli

    repo = Path(__file__).resolve().parents[2]
    known = {opt for param in cli.commands["run"].params for opt in (*param.opts, *param.secondary_opts)}
    readme = repo.joinpath("README.md").read_text()
    table = [line for line in readme.splitlines() if line.startswith("| `-")]
    documented = {flag for line in table for flag in re.findall(r"`(-{1,2}[a-z][a-z-]*)", line.split("|")[1])}
    providers_doc = repo.joinpath("docs", "providers.md").read_text()
    documented |= set(re.findall(r"`(--(?:aws|gcp|azure|ibm)-[a-z-]+)", providers_doc))
    assert len(documented) >= 40  # the table was read, not skipped
    assert documented - known == set()


@pytest.mark.parametrize("target", ["127.0.0.1:abc", "127.0.0.1:", ":3"])
def test_drain_refuses_a_slot_that_is_not_a_number_before_asking_any_driver(target):
    # "127.0.0.1:abc" was sent as a host of that name: "no host 127.0.0.1:abc in this job", once a driver answered.
    result = _run("drain", "no-such-job", target)
    assert result.returncode == 2 and result.stdout == ""
    assert f"{target!r}: expected HOST or HOST:SLOT, SLOT a number" in result.stderr.strip().splitlines()[-1]
