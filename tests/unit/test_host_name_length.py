"""Host names are bounded where they enter: ``-H``, a discovery script's output, any provider's snapshot.

Before: no bound. A 300-character name given with ``-H`` was sent to every worker, which refuses names over
255 (``protocol._host_names``), so every worker crashed with a traceback blaming the number of hosts; a
discovery script printing a 1,000,000-character name grew the driver's log by 6 MB in 14 lines.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cloud_elastic.errors import FatalDiscoveryError
from cloud_elastic.providers.api import DiscoveredHosts, Drain
from cloud_elastic.providers.hostspec import parse_host_list

pytestmark = pytest.mark.timeout(60)

REPO = Path(__file__).resolve().parents[2]
_LONGEST = ".".join(["a" * 63, "b" * 63, "c" * 63, "d" * 61])  # 253 characters, labels of 63


def _cli(tmp_path: Path, *args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cloud_elastic.cli", "run", *args, sys.executable, "-c", "pass"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(REPO), "XDG_RUNTIME_DIR": str(tmp_path)})


def test_names_up_to_253_characters_and_labels_up_to_63_are_taken() -> None:
    assert parse_host_list([f"{_LONGEST}:2", "x" * 63], default_slots=1, source="-H") == {_LONGEST: 2, "x" * 63: 1}
    assert DiscoveredHosts(ready={_LONGEST: 1}).ready == {_LONGEST: 1}


@pytest.mark.parametrize("name,says", [
    (_LONGEST + "d", "has 254 characters; at most 253 are allowed"),
    ("10.0.0.1." + "x" * 64, "has a label of 64 characters; at most 63 between dots"),
    ("h" * 1_000_000, "has 1,000,000 characters; at most 253 are allowed"),
])
def test_a_longer_name_or_label_is_refused_in_one_short_line_naming_the_entry(name: str, says: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_host_list(["localhost:2", f"{name}:1"], default_slots=1, source="discovery script hosts.sh",
                        unit="line")
    message = str(info.value)
    assert message.startswith("discovery script hosts.sh: line 2: host name '") and message.endswith(says), message
    assert len(message) < 200 and "\n" not in message


@pytest.mark.parametrize("where", ["ready", "draining"])
def test_any_providers_snapshot_with_such_a_name_is_a_fatal_one_line_error(where: str) -> None:
    """A plugin's snapshot passes the same check (its hosts are sent to every worker just the same)."""
    hosts = {"ready": {"h" * 300: 1}} if where == "ready" else {"draining": {"h" * 300: Drain(None)}}
    with pytest.raises(FatalDiscoveryError) as info:
        DiscoveredHosts(**hosts)
    assert str(info.value) == f"host name '{'h' * 40}...' has 300 characters; at most 253 are allowed"


def test_dash_h_with_a_300_character_name_stops_before_any_worker_starts_in_one_line(tmp_path: Path) -> None:
    done = _cli(tmp_path, "-np", "2", "-H", f"127.{'a' * 300}:2", timeout=30)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == (f"cloud-elastic: error: --hosts: entry 1: host name '127.{'a' * 36}...' has 304 "
                                   "characters; at most 253 are allowed"), done.stderr


def test_a_discovery_script_printing_a_1_mb_name_costs_a_few_short_lines_of_log(tmp_path: Path) -> None:
    script = tmp_path / "hosts.sh"
    script.write_text("#!/bin/sh\necho localhost:2\nhead -c 1000000 /dev/zero | tr '\\0' h\necho :1\n")
    script.chmod(0o755)
    done = _cli(tmp_path, "-np", "2", "--host-discovery-script", str(script), "--start-timeout", "3", timeout=40)
    assert done.returncode == 1, done.stderr[-2000:]
    lines = (done.stdout + done.stderr).splitlines()
    assert len(lines) < 10 and all(len(line) < 400 for line in lines), [line[:200] for line in lines]
    assert f"discovery script hosts.sh: line 2: host name '{'h' * 40}...' has 1,000,000 characters; at most 253 " \
           "are allowed" in lines[-1], lines
