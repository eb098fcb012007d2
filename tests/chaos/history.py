"""The invariants a chaos run must keep, checked on what the workers printed and the driver's events.

Each check raises ``AssertionError`` with a message that names the round, step or
worker concerned. Terms: a *round* is one process group (``round_formed`` in the
events file); a worker ``enter``s a round's training after its state sync, at the
step that round continues from.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path

from tests.chaos.schedule import ISSUE_KINDS, issue_kind


def driver_events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def check_every_kind_applied(applied: list[str], seed: int) -> None:
    """Every kind of fault the issue lists was applied at least once; ``applied`` holds the kinds of the
    faults the runner inflicted (``Applied.kind``), not the ones the schedule drew."""
    done = Counter(issue_kind(k) for k in applied)
    for kind, name in ISSUE_KINDS.items():
        assert done[kind], (f"chaos seed {seed}: no {name} ({kind}) was applied in {len(applied)} faults "
                            f"(applied: {dict(done)})")


def check_no_commit_lost(events) -> None:
    """A worker never continues from a step below its own last commit, and the
    members of a round all continue from the same step. A round's members enter
    the training function a second time, together, where a follow window ends
    (``FollowerActivated``: the same round goes on); each entry is compared with
    the same entry of the others."""
    last_commit: dict[str, int] = {}
    starts: dict[tuple[int, int], set] = defaultdict(set)
    entered: Counter = Counter()
    for e in events:
        if e.kind == "commit":
            last_commit[e["worker"]] = e["step"]
        elif e.kind == "enter":
            nth = entered[e["worker"], e["round"]]
            entered[e["worker"], e["round"]] += 1
            starts[e["round"], nth].add(e["step"])
            before = last_commit.get(e["worker"], 0)
            assert e["step"] >= before, (
                f"round {e['round']}: {e['worker']} continues from step {e['step']} but had committed step {before}")
    for (round_, nth), steps in starts.items():
        assert len(steps) == 1, (f"round {round_}{f' (entry {nth + 1})' if nth else ''}: members continue from "
                                 f"different steps {sorted(steps)}")


def check_one_group_at_a_time(events, driver: list[dict]) -> None:
    """Every commit comes from a member of its round, with the round's size and a
    rank of its own; and a round stops training once a later one trains: after the
    first commit of any later round, a worker of an earlier round commits at most
    once more (the step it had finished when it was cut off, e.g. while stopped)."""
    formed = {e["round"]: e for e in driver if e["event"] == "round_formed"}
    rank_of: dict[tuple[int, str], int] = {}
    by_step: dict[tuple[int, int], list[int]] = defaultdict(list)
    first_commit: dict[int, float] = {}
    commits = [e for e in events if e.kind == "commit"]
    for e in commits:
        r = e["round"]
        assert r in formed, f"{e['worker']} committed step {e['step']} in round {r}, which the driver never formed"
        size, ranks = formed[r]["size"], formed[r]["ranks"]
        host = e["worker"].split("[")[0]
        assert e["size"] == size, f"round {r}: {e['worker']} trains at size {e['size']}, the round has {size}"
        assert e["rank"] in ranks.get(host, []), f"round {r}: rank {e['rank']} is not on {host}: {ranks}"
        assert rank_of.setdefault((r, e["worker"]), e["rank"]) == e["rank"], f"round {r}: {e['worker']} changed rank"
        by_step[(r, e["step"])].append(e["rank"])
        first_commit[r] = min(first_commit.get(r, e["t"]), e["t"])
    for (r, step), ranks in by_step.items():
        assert len(ranks) == len(set(ranks)), f"round {r} step {step}: ranks {sorted(ranks)} committed twice"
    for r in first_commit:
        later = [t for r2, t in first_commit.items() if r2 > r]
        if not later:
            continue
        cut = min(later)
        late = Counter(e["worker"] for e in commits if e["round"] == r and e["t"] > cut)
        over = {w: n for w, n in late.items() if n > 1}
        assert not over, f"round {r} kept training after a later round started: commits after it {over}"


def lineage(events) -> dict[int, dict]:
    """The batches that stayed in the training history: step -> batch event.

    Rounds in order; a round continuing from step S drops every kept step after
    S (those were rolled back), then adds its own. All workers that printed a
    step in a round must agree on its samples."""
    enters: dict[int, int] = {}
    batches: dict[int, dict[int, dict]] = defaultdict(dict)
    for e in events:
        if e.kind == "enter":  # a round's first entry (a follow window's end enters it again, going on)
            enters.setdefault(e["round"], e["step"])
        elif e.kind == "batch":
            seen = batches[e["round"]].setdefault(e["step"], e)
            assert (seen["epoch"], sorted(seen["indices"])) == (e["epoch"], sorted(e["indices"])), (
                f"round {e['round']} step {e['step']}: workers disagree on the samples:"
                f" {seen['worker']} {sorted(seen['indices'])} vs {e['worker']} {sorted(e['indices'])}")
    kept: dict[int, dict] = {}
    for r in sorted(set(enters) | set(batches)):
        assert r in enters or not batches[r], f"round {r} trained but no worker entered it"
        start = enters.get(r, 0)
        kept = {s: b for s, b in kept.items() if s <= start}
        for s, b in batches[r].items():
            assert s > start, f"round {r} continued from step {start} but took step {s}"
            kept[s] = b
    return kept


def check_exactly_once(events, samples: int) -> tuple[int, int]:
    """Every sample exactly once per epoch, epochs complete, steps contiguous. Returns (steps, epochs)."""
    kept = lineage(events)
    steps = sorted(kept)
    assert steps == list(range(1, len(steps) + 1)), f"steps kept are not 1..N: gaps at {sorted(set(range(1, steps[-1] + 1)) - set(steps))[:10]}"
    per_epoch: dict[int, Counter] = defaultdict(Counter)
    for b in kept.values():
        per_epoch[b["epoch"]].update(b["indices"])
    epochs = sorted(per_epoch)
    assert epochs == list(range(len(epochs))), f"epochs trained: {epochs}"
    for epoch, seen in per_epoch.items():
        missing = sorted(set(range(samples)) - set(seen))
        twice = sorted(i for i, c in seen.items() if c > 1)
        assert not missing and not twice, f"epoch {epoch}: missing samples {missing[:10]}, processed twice {twice[:10]}"
        assert set(seen) == set(range(samples)), f"epoch {epoch}: unknown samples {sorted(set(seen) - set(range(samples)))[:10]}"
    return len(steps), len(epochs)


def check_same_parameters(events, final_step: int) -> int:
    """All workers that finished report the final step and bitwise the same parameters; returns how many."""
    done = [e for e in events if e.kind == "done"]
    assert done, "no worker finished"
    assert {e["step"] for e in done} == {final_step}, f"finished at steps {sorted({e['step'] for e in done})}, history has {final_step}"
    sums = {e["worker"]: e["checksum"] for e in done}
    assert len(set(sums.values())) == 1, f"parameters differ between workers: {sums}"
    sizes = {e["size"] for e in done}
    assert sizes == {len(done)}, f"{len(done)} workers finished in a round of size {sizes}"
    return len(done)
