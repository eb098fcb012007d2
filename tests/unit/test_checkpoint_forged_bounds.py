"""Forged checkpoints that got past the load's checks, or that the checks themselves could not bear (review s63
rvX F1, F2, F4): each is now refused in one line, in bounded memory, and the previous checkpoint is used.

* F1: the refusal's path named every key on it in full before it was cut to 160 characters: dicts nested 257 deep,
  each under one key of a million NULs (a 1 MB file: pickle keeps the string once), took 2 GiB to refuse, and a 4 MB
  one failed the job with MemoryError instead of falling back.
* F2: dict keys were not walked: a tuple key nested 250 deep under dicts nested 250 deep passed the check (each
  within its 256), and the walk after the load (``plain_numpy.unpack``) then failed with RecursionError, after
  ``latest()`` had chosen it: no fallback.
* F4: a tensor was charged its elements' bytes only, so references to one empty tensor (2 to 5 bytes of file each)
  were never refused, and the commit snapshot then copied each on its own.

Real checkpoint folders: a forger's ``state.pt`` (``torch.save`` bytes of its own) put in place of one the store
wrote, the manifest's size and SHA-256 set to match, as anyone who can write the storage can do.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cloud_elastic.checkpoint import CheckpointStore
from tests.integration.harness import REPO
from tests.unit.test_checkpoint_loaded_views import _rewrite

pytestmark = pytest.mark.timeout(60)


def forge(store: CheckpointStore, step: int, payload: object) -> str:
    """A checkpoint of ``step`` holding ``payload``, written as a forger would (no check of the writer's); its
    folder's name."""
    info = store.save(step, {"placeholder": 0})
    _rewrite(Path(store.url) / info.name, payload)
    return info.name


def deep_key_under_deep_dicts(depth: int) -> dict:
    """Dicts nested ``depth`` deep, at the bottom one whose key is a tuple nested ``depth`` deep."""
    key: tuple = ()
    for _ in range(depth):
        key = (key,)
    value: dict = {key: 0}
    for _ in range(depth):
        value = {"k": value}
    return value


def _fallen_back(tmp_path: Path, payload: object, caplog) -> str:
    """The one WARNING of ``latest()`` skipping a forged checkpoint of ``payload`` for the intact one before it."""
    store = CheckpointStore(str(tmp_path), keep=3)
    store.save(1, {"w": torch.ones(3)})
    name = forge(store, 2, payload)
    with caplog.at_level(logging.WARNING, logger="cloud_elastic.checkpoint.store"):
        latest = store.latest()
    assert latest.info.step == 1 and torch.equal(latest.payload["w"], torch.ones(3))
    [warned] = [r.getMessage() for r in caplog.records if name in r.getMessage()]
    assert "is unusable" in warned and "falling back to the previous one" in warned, warned
    return warned


def test_a_key_nested_deep_counts_with_the_containers_it_is_in(tmp_path: Path, caplog) -> None:
    warned = _fallen_back(tmp_path, {"w": torch.ones(3), "extra": deep_key_under_deep_dicts(250)}, caplog)
    assert "its state.pt nests containers more than 256 deep (at ['extra']['k']['k']" in warned, warned


def test_references_to_one_empty_tensor_are_charged_for_the_tensors_a_copy_makes(tmp_path: Path, caplog) -> None:
    """400,000 references in a 0.8 MB file: each a tensor of its own in the commit snapshot's copy."""
    warned = _fallen_back(tmp_path, {"w": torch.ones(3), "refs": [torch.empty(0)] * 400_000}, caplog)
    assert "its state.pt would take more than" in warned and "bytes to copy" in warned, warned


_HUGE_KEY = """
import resource, sys
sys.path.insert(0, sys.argv[2])
import torch
from cloud_elastic.checkpoint import CheckpointError, CheckpointStore
from tests.unit.test_checkpoint_forged_bounds import forge

def kib(field):
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith(field + ":"))

key = "\\x00" * (1 << 20)
value = 0
for _ in range(257):
    value = {key: value}
store = CheckpointStore(sys.argv[1], keep=3)
store.save(1, {"w": torch.ones(3)})
payload = {"w": torch.ones(3), "extra": value}
if sys.argv[3] == "forged":
    forge(store, 2, payload)
    del value, payload
# The payload is 1 MB: checking, saving or loading it may take a few times that, never the GiBs its path took.
resource.setrlimit(resource.RLIMIT_AS, ((kib("VmSize") << 10) + (512 << 20),) * 2)
peak = kib("VmHWM")
try:
    if sys.argv[3] == "forged":
        print("latest step", store.latest().info.step, "peak growth MiB", (kib("VmHWM") - peak) >> 10)
    else:
        store.save(2, payload)
except MemoryError:
    print("MemoryError")
except CheckpointError as exc:
    print("refused:", exc, "peak growth MiB", (kib("VmHWM") - peak) >> 10)
"""


def _in_bounded_memory(tmp_path: Path, mode: str) -> tuple[str, str]:
    """The output and errors of :data:`_HUGE_KEY` run in a process whose address space may grow by 512 MiB only."""
    done = subprocess.run([sys.executable, "-c", _HUGE_KEY, str(tmp_path), str(REPO), mode], cwd=REPO,
                          capture_output=True, text=True, timeout=50)
    assert done.returncode == 0, done.stderr
    return done.stdout, done.stderr


def test_a_refusal_names_where_in_bounded_memory_however_long_the_keys(tmp_path: Path) -> None:
    """Before: MemoryError, and no fallback (2 GiB for the path's text without a limit)."""
    out, err = _in_bounded_memory(tmp_path, "forged")
    words = out.split()
    assert words[:3] == ["latest", "step", "1"] and int(words[-1]) < 256, out + err
    assert "nests containers more than 256 deep (at ['extra']['\\x00\\x00" in err, err


def test_a_save_refuses_what_a_load_would_in_bounded_memory_however_long_the_keys(tmp_path: Path) -> None:
    """Before: MemoryError (rvX: 24 GB of the paths ``payload._walk`` builds at each level, for a 256 KB key), and
    without it a checkpoint written that every load refuses."""
    out, err = _in_bounded_memory(tmp_path, "save")
    assert out.startswith("refused: cannot checkpoint the dict at payload['extra']['\\x00\\x00") and \
        "…: containers nested more than 256 deep, which a load refuses" in out and int(out.split()[-1]) < 256, \
        out + err


_SHORT_OF_MEMORY = """
import gc, hashlib, io, json, logging, resource, sys, zipfile
from pathlib import Path
sys.path.insert(0, sys.argv[2])
import torch
from cloud_elastic.checkpoint import CheckpointStore, safety

logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
buf = io.BytesIO()
torch.save({"x": []}, buf)
original, out = zipfile.ZipFile(io.BytesIO(buf.getvalue())), io.BytesIO()
pickle = b"\\x80\\x02}X\\x01\\x00\\x00\\x00x](" + b"]" * 300_000 + b"es."  # {"x": 300,000 lists}, no memo entries
with zipfile.ZipFile(out, "w") as archive:
    for record in original.infolist():
        archive.writestr(record.filename, pickle if record.filename.endswith("data.pkl") else original.read(record))
data = out.getvalue()
store = CheckpointStore(sys.argv[1], keep=3)
store.save(1, {"w": torch.ones(3)})
folder = Path(sys.argv[1]) / store.save(2, {"placeholder": 0}).name
(folder / "state.pt").write_bytes(data)
manifest = json.loads((folder / "manifest.json").read_text())
manifest["data"].update(size=len(data), sha256=hashlib.sha256(data).hexdigest())
(folder / "manifest.json").write_text(json.dumps(manifest))

def bounded(extra, run):
    gc.collect()
    mapped = next(int(l.split()[1]) << 10 for l in open("/proc/self/status") if l.startswith("VmSize:"))
    resource.setrlimit(resource.RLIMIT_AS, (mapped + extra, resource.RLIM_INFINITY))
    try:
        return run()
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))

def outcome(extra):
    try:
        bounded(extra, lambda: safety.safe_load(data, "state.pt"))
        return "loaded"
    except safety.Unusable as exc:
        return str(exc)

print("unbounded:", outcome(1 << 40))
low, high = 0, 256 << 20  # what the load and then the check need lies between: bisected to 64 KiB
while high - low > 64 << 10:
    middle = (low + high) // 2
    found = outcome(middle)
    print("bounded:", found)
    if "once loaded" in found:
        print("latest step", bounded(middle, store.latest).info.step)
        break
    low, high = (low, middle) if found == "loaded" else (middle, high)
"""


@pytest.mark.timeout(200)  # a dozen loads of 300,000 lists: 10 CPU-s, 33 s in a whole run, 50+ under heavy load
def test_a_check_that_runs_out_of_memory_after_the_load_falls_back(tmp_path: Path) -> None:
    """fixC2's catch of a MemoryError of ``check_loaded`` (the load passed; the check's own bookkeeping, a few dozen
    bytes a container, did not fit), reached for real: 300,000 lists written without pickle's memo entries (the
    load then needs less than the check), loaded in a process whose address space is bounded just so (bisected).
    Every bound ends in a load or a refusal in one line, never in a MemoryError out of the load (the scan before
    it ran out of memory first at smaller bounds, and its MemoryError escaped ``latest()``: no fallback)."""
    done = subprocess.run([sys.executable, "-c", _SHORT_OF_MEMORY, str(tmp_path), str(REPO)], cwd=REPO,
                          capture_output=True, text=True, timeout=180, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0] == "unbounded: loaded", done.stdout
    assert lines[-2] == "bounded: its state.pt could not be checked once loaded (MemoryError): corrupt or forged"
    assert lines[-1] == "latest step 1", done.stdout
    assert "is unusable (its state.pt could not be checked once loaded (MemoryError): corrupt or forged); falling " \
        "back to the previous one" in done.stderr, done.stderr[-3000:]
