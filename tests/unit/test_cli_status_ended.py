"""``cloud-elastic status JOB`` of a job that ended is an answer, in text as in JSON: exit 0, one plain line.

Text mode printed ``cloud-elastic: error: job X is not running: it ended 1s ago (...)`` and exited 2, the status
documented for invalid flags, while ``--json`` printed the job's end and exited 0. A job id never seen here is
still an error (exit 2)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from cloud_elastic.cli import main
from cloud_elastic.records import remove_driver_record, write_driver_record

pytestmark = pytest.mark.timeout(30)

HOW = "succeeded: training completed on 2 worker(s) after 0 reset(s)"


@pytest.fixture
def ended(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    root = tmp_path / "cloud-elastic"
    write_driver_record("cea7a4b1", "127.0.0.1:1", "s", root=root)
    remove_driver_record("cea7a4b1", root=root, ended=HOW)
    return "cea7a4b1"


def test_text_status_of_a_job_that_ended_is_one_plain_line_and_exit_0(ended: str, capsys) -> None:
    assert main(["status", ended]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert re.fullmatch(rf"job {ended} is not running: it ended \d+s ago \({re.escape(HOW)}\)\n", out), out


def test_json_status_of_a_job_that_ended_says_the_same(ended: str, capsys) -> None:
    assert main(["status", "--json", ended]) == 0
    told = json.loads(capsys.readouterr().out)
    assert (told["job"], told["running"], told["how"]) == (ended, False, HOW)


def test_a_job_never_seen_is_still_an_error(ended: str, capsys) -> None:
    for argv in (["status", "0123abcd"], ["status", "--json", "0123abcd"]):
        assert main(argv) == 2
        out, err = capsys.readouterr()
        assert out == "" and err == ("cloud-elastic: error: no job 0123abcd on this machine "
                                     "(see 'cloud-elastic status')\n")
