"""The host-added benchmark compares like with like: cloud-elastic's newcomer starts a fresh process, importing
torch, as on a new instance (an SSH host) and as the peers' newcomers do, not a fork of the driver's preloaded
fork server, which only loopback hosts get."""

from __future__ import annotations

import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
try:
    import host_added  # noqa: E402  (benchmarks/ is not a package)
finally:
    sys.path.remove(str(BENCHMARKS))


def test_cloud_elastic_jobs_start_with_the_local_fork_server_off(monkeypatch, tmp_path):
    started = []
    monkeypatch.setattr(host_added, "Procs", lambda cmds, env, **kw: started.append(env))
    host_added.CloudElastic(tmp_path).start()
    host_added.CloudElastic(tmp_path, 10.0, tree=tmp_path).start()  # --against another checkout
    assert [env.get("CLOUD_ELASTIC_LOCAL_FORKSERVER") for env in started] == ["0", "0"]
    assert started[1]["PYTHONPATH"] == str(tmp_path)
