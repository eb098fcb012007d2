"""The fallback's workers hand the training state over before they leave, and the fallback starts a job that Spot
alone cannot start (cloud_elastic.driver.job.sourcing, review s61 rvK findings 1 and 2).

1. A job wholly on the fallback whose Spot slots come back: its fallback workers train on, holding no place in
   the next round, until a round with their replacements has synced the state to them; only then do they leave,
   at a commit. Draining them as soon as the replacements reached rendezvous lost the training state (rc 1).
   Nor did it hold to drain them at the sync, before a commit of the replacements' own, or to let a drained one
   leave once their round failed: Spot reclaimed again in that window lost the state too (review s61 rvF 1).
2. Before the job's first round the fallback tops it up to -np at once: a job cannot start below -np, and with
   Spot between --min-np and -np it used to wait for --start-timeout and fail.
3. With --whole-hosts, a fallback host told to leave whose replacements are lost before it left stays whole: the
   first of its workers back at rendezvous was kept, then counted as the holder its host-mate could leave to, and
   the half host left could join no round ("training state lost", review s62 rvS finding 1).
4. A fallback host kept while missing from discovery that is listed again during the hand-off keeps its
   replacement: the worker being replaced counted as staying, so the replacement was the surplus sent away, and the
   hand-off ran twice (rvS finding 3).
"""

from __future__ import annotations

import pytest

from cloud_elastic.driver.job.elastic_job import Assignment, ExitOrder, WorkerState
from cloud_elastic.driver.job.sourcing import FallbackRule
from tests.unit.test_job import CLEAN, KILLED
from tests.unit.test_job_sourcing import Sourced, running, sent_back

pytestmark = pytest.mark.timeout(10)

S = WorkerState


def on_fallback_only(np: int, **kwargs) -> Sourced:
    """-np ``np``: no Spot slot at all, so the job runs wholly on ``np`` fallback workers, which have committed."""
    sim = Sourced(np, progress_timeout_s=0, **kwargs)
    sim.groups(od=np)
    fallback = [f"od{i}[0]" for i in range(np)]
    assert sim.slots_launched() == fallback
    sim.join(*fallback)
    sim.commit(*fallback)
    sim.advance(1)
    assert running(sim) == fallback
    return sim


def rounds(sim: Sourced) -> list[dict]:
    return [f for k, f in sim.events if k == "round_formed"]


def test_the_last_fallback_holder_trains_on_until_a_round_with_its_replacement_synced_the_state():
    sim = on_fallback_only(1)
    sim.groups(a=1, od=1)  # Spot is back
    assert sim.slots_launched()[-1] == "a0[0]"
    sim.join("a0[0]")  # the replacement reaches rendezvous: it holds nothing yet
    sim.advance(1)
    assert sim.state("od0[0]") is S.RUNNING, "the only holder of the state was sent away"
    # At its commit od0 comes to rendezvous for the update, and a round of both forms, beyond --max-np 1: od0
    # holds no place in it, as the last holder on a leaving host would not.
    sim.commit("od0[0]")
    replies = sim.join("od0[0]", reason="update")
    assert isinstance(replies["od0[0]"], Assignment)
    formed = rounds(sim)[-1]
    assert formed["size"] == 2 and formed["synced"] and not formed["from_checkpoint"]
    assert formed["workers"][0] == sim.id("od0[0]")  # the holder is rank 0: its state is the one broadcast
    assert sim.layout() == ["od0[0]", "a0[0]"]
    sim.advance(2)
    assert sim.state("od0[0]") is S.RUNNING  # a0 has not said it holds the state yet
    sim.commit("od0[0]", "a0[0]")  # the first commit of that round: a0 holds the state now
    sim.advance(1)
    assert sim.state("od0[0]") is S.DRAINING and sent_back(sim) == []
    sim.commit("od0[0]", "a0[0]")
    replies = sim.join("od0[0]", "a0[0]", reason="update")
    assert isinstance(replies["od0[0]"], ExitOrder) and isinstance(replies["a0[0]"], Assignment)
    sim.exit("od0[0]", CLEAN)
    sim.advance(1)
    assert running(sim) == ["a0[0]"] and sent_back(sim) == ["od0"]
    assert not rounds(sim)[-1]["from_checkpoint"] and not rounds(sim)[-1]["synced"]  # a0 holds the state
    assert [f for k, f in sim.events if k == "rollback"] == [] and sim.outcome is None


def test_of_several_fallback_holders_one_stays_until_the_spot_workers_hold_the_state():
    sim = on_fallback_only(2)
    sim.groups(a=2, od=2)
    assert sorted(sim.slots_launched()[-2:]) == ["a0[0]", "a1[0]"]
    sim.join("a0[0]", "a1[0]")
    sim.advance(1)
    # The newest may go (od0 still holds the state); od0 may not, though both replacements are at rendezvous.
    assert (sim.state("od1[0]"), sim.state("od0[0]")) == (S.DRAINING, S.RUNNING)
    sim.commit("od0[0]", "od1[0]")
    replies = sim.join("od0[0]", "od1[0]", reason="update")
    assert isinstance(replies["od1[0]"], ExitOrder) and isinstance(replies["od0[0]"], Assignment)
    sim.exit("od1[0]", CLEAN)
    assert sorted(sim.layout()) == ["a0[0]", "a1[0]", "od0[0]"]  # beyond --max-np 2 for the hand-over
    sim.advance(1)
    assert sim.state("od0[0]") is S.RUNNING
    sim.commit("od0[0]", "a0[0]", "a1[0]")
    sim.advance(1)
    assert sim.state("od0[0]") is S.DRAINING
    sim.commit("od0[0]", "a0[0]", "a1[0]")
    sim.join("od0[0]", "a0[0]", "a1[0]", reason="update")
    sim.exit("od0[0]", CLEAN)
    sim.advance(1)
    assert running(sim) == ["a0[0]", "a1[0]"] and sorted(sent_back(sim)) == ["od0", "od1"]
    assert [f for k, f in sim.events if k == "rollback"] == [] and sim.outcome is None


def test_with_spares_the_replacements_join_the_fallback_holder_instead_of_waiting_as_spares():
    sim = on_fallback_only(1, spares=1)
    sim.groups(a=2, od=1)
    sim.join("a0[0]")
    sim.advance(1)
    assert sim.state("od0[0]") is S.RUNNING
    sim.commit("od0[0]")
    sim.join("od0[0]", reason="update")
    assert "a0[0]" in sim.layout() and "od0[0]" in sim.layout()
    sim.commit(*sim.layout())
    sim.advance(1)
    assert sim.state("od0[0]") is S.DRAINING


def test_a_fallback_holder_whose_spot_slots_go_again_is_wanted_again_and_stays():
    sim = on_fallback_only(1)
    sim.groups(a=1, od=1)
    sim.join("a0[0]")
    sim.advance(1)
    assert sim.job.workers[sim.id("od0[0]")].replaced
    sim.groups(od=1)  # the Spot host is reclaimed before the hand-over
    sim.exit("a0[0]", CLEAN)
    sim.advance(1)
    assert sim.state("od0[0]") is S.RUNNING and not sim.job.workers[sim.id("od0[0]")].replaced


def hand_off_round(sim: Sourced) -> None:
    """Spot is back for a job wholly on fallback worker od0 (2 commits): a0 joins it in round 2, synced from it."""
    sim.groups(a=1, od=1)
    sim.join("a0[0]")
    sim.advance(1)
    sim.commit("od0[0]")
    sim.job.heartbeat(sim.id("od0[0]"), sim.now, 2, commit_seq=2)
    sim.join("od0[0]", reason="update")
    assert rounds(sim)[-1]["synced"] and sorted(sim.layout()) == ["a0[0]", "od0[0]"]


def both_commit(sim: Sourced) -> None:
    """The first commit of round 2: commit 3 of the job, a0's first of its own."""
    sim.commit("od0[0]", "a0[0]")
    for slot in ("od0[0]", "a0[0]"):
        sim.job.heartbeat(sim.id(slot), sim.now, sim.commits[sim.id(slot)], commit_seq=3)


def reclaimed(sim: Sourced, survivor_first: bool) -> None:
    """Spot takes a0 back inside round 2: od0's collective fails, before or after the driver sees a0 killed."""
    sim.groups(od=1)
    if survivor_first:  # Gloo fails the survivor on the peer's reset before the driver learns of the kill
        sim.join("od0[0]", reason="failure")
        sim.exit("a0[0]", KILLED)
    else:
        sim.exit("a0[0]", KILLED)
        sim.join("od0[0]", reason="failure")


def goes_on_with_od0(sim: Sourced) -> None:
    sim.advance(1)
    assert sim.outcome is None, sim.outcome  # was "training state lost" while od0 held it
    assert running(sim) == ["od0[0]"] and rounds(sim)[-1]["workers"] == [sim.id("od0[0]")]
    assert not rounds(sim)[-1]["from_checkpoint"]
    assert sent_back(sim) == []


@pytest.mark.parametrize("survivor_first", [False, True])
def test_a_replacement_lost_after_its_sync_before_a_commit_of_its_own_leaves_the_holder_training(survivor_first):
    sim = on_fallback_only(1)
    hand_off_round(sim)
    sim.job.heartbeat(sim.id("a0[0]"), sim.now, 0, commit_seq=2)  # it holds od0's commit by the sync, no more
    sim.advance(1)
    assert sim.state("od0[0]") is S.RUNNING, "the holder was told to leave before its replacement made a commit"
    reclaimed(sim, survivor_first)
    goes_on_with_od0(sim)


@pytest.mark.parametrize("survivor_first", [False, True])
def test_a_drained_holder_whose_replacement_is_lost_before_it_left_stays_instead(survivor_first):
    sim = on_fallback_only(1)
    hand_off_round(sim)
    both_commit(sim)  # a0's own commit: od0 may leave, at its next one
    sim.advance(1)
    assert sim.state("od0[0]") is S.DRAINING
    reclaimed(sim, survivor_first)  # before od0's next commit: its drain is called off
    goes_on_with_od0(sim)


def test_a_holder_kept_after_its_hand_off_round_failed_leaves_once_its_replacement_is_back_with_the_state():
    sim = on_fallback_only(1)
    hand_off_round(sim)
    both_commit(sim)
    sim.advance(1)
    sim.join("od0[0]", reason="failure")  # a broken link, no one lost: od0 waits, a0 is not back yet
    assert sim.state("od0[0]") is S.WAITING
    sim.join("a0[0]", reason="failure")  # a0 is back with the commit: od0 goes, a0 trains on
    sim.advance(1)
    assert sim.state("od0[0]") is S.DRAINING and running(sim) == ["a0[0]"]
    assert isinstance(sim.join("od0[0]", reason="update")["od0[0]"], ExitOrder)
    sim.exit("od0[0]", CLEAN)
    sim.advance(1)
    assert sent_back(sim) == ["od0"] and running(sim) == ["a0[0]"] and sim.outcome is None


OD0, A0 = ["od0[0]", "od0[1]"], ["a0[0]", "a0[1]"]


def whole_hand_off(sim: Sourced) -> None:
    """Spot host a0 comes back for a job wholly on fallback host od0 (2 slots each): a round of the 4 syncs od0's
    state to a0 and commits, and od0 is told to leave at its next commit."""
    sim.groups(a=1, od=1, slots=2)
    sim.join(*A0)
    sim.advance(1)
    sim.commit(*OD0)
    sim.join(*OD0, reason="update")
    assert rounds(sim)[-1]["ranks"] == {"od0": [0, 1], "a0": [2, 3]} and rounds(sim)[-1]["synced"]
    sim.commit(*OD0, *A0)
    sim.advance(1)
    assert [sim.state(s) for s in OD0] == [S.DRAINING, S.DRAINING]


@pytest.mark.parametrize("first", OD0)
def test_with_whole_hosts_a_drained_fallback_host_whose_replacements_are_lost_stays_whole(first):
    sim = Sourced(2, progress_timeout_s=0, whole_host_slots=2)
    sim.groups(od=1, slots=2)
    sim.join(*OD0)
    sim.commit(*OD0)
    sim.advance(1)
    whole_hand_off(sim)
    sim.groups(od=1, slots=2)  # Spot reclaims a0 before od0's next commit
    for slot in A0:
        sim.exit(slot, KILLED)
    sim.join(first, reason="failure")
    sim.join(*[s for s in OD0 if s != first], reason="failure")
    sim.advance(1)
    assert sim.outcome is None, sim.outcome
    # Both stay and train on: one used to leave, and the half host left waited for a round no rule could form
    # (then "training state lost" while it held the state).
    assert running(sim) == OD0 and rounds(sim)[-1]["ranks"] == {"od0": [0, 1]}
    assert not rounds(sim)[-1]["from_checkpoint"] and sent_back(sim) == []
    sim.commit(*OD0)
    sim.advance(1)
    whole_hand_off(sim)  # Spot is back: the hand-off is done again, and od0 leaves whole at a commit
    sim.commit(*OD0, *A0)
    replies = sim.join(*OD0, *A0, reason="update")
    assert [type(replies[s]) for s in OD0 + A0] == [ExitOrder, ExitOrder, Assignment, Assignment]
    for slot in OD0:
        sim.exit(slot, CLEAN)
    sim.advance(1)
    assert running(sim) == A0 and sent_back(sim) == ["od0", "od0"] and sim.outcome is None
    assert [f["steps_lost"] for k, f in sim.events if k == "rollback"] == [0]  # Spot's kill, nothing lost


def test_a_kept_fallback_host_listed_again_during_the_hand_off_keeps_the_replacement():
    sim = on_fallback_only(1, missing_grace=1)
    sim.groups()  # od0 drops out of the listing past the grace: kept, as the last holder; its worker trains on
    sim.advance(1.5)
    sim.groups(a=1)  # Spot is back
    sim.join("a0[0]")
    sim.advance(1)
    sim.commit("od0[0]")
    sim.join("od0[0]", reason="update")
    assert rounds(sim)[-1]["ranks"] == {"od0": [0], "a0": [1]}
    sim.groups(a=1, od=1)  # od0 is listed again
    sim.advance(1)
    assert sim.state("a0[0]") is S.RUNNING, "the replacement was sent away in od0's place (--max-np 1)"
    sim.commit("od0[0]", "a0[0]")
    sim.advance(1)
    sim.commit("od0[0]", "a0[0]")
    replies = sim.join("od0[0]", "a0[0]", reason="update")
    assert isinstance(replies["od0[0]"], ExitOrder) and isinstance(replies["a0[0]"], Assignment)
    sim.exit("od0[0]", CLEAN)
    sim.advance(1)
    assert running(sim) == ["a0[0]"] and sent_back(sim) == ["od0"] and sim.outcome is None
    assert sim.slots_launched() == ["od0[0]", "a0[0]"] and len(rounds(sim)) == 3  # one hand-off, not two


# ------------------------------------------------------------------------------------ start-up

def test_before_the_first_round_the_fallback_is_wanted_up_to_np_and_with_fallback_after_it_stays():
    rule = FallbackRule(num_proc=8, min_np=4, max_np=8, fallback_after_s=600)
    assert rule.wanted(6, 0.0, starting=True) == (2, "below -np 8 before the job's first round (it cannot start "
                                                     "with fewer)")
    assert rule.wanted(6, 60.0) == (2, "below -np 8 since the job started with the fallback (--fallback-after)")
    assert rule.wanted(6, 700.0) == (2, "below -np 8 for 600s (--fallback-after)")
    assert rule.wanted(8, 701.0) == (0, "")
    assert rule.wanted(6, 702.0) == (0, "")  # Spot gave -np since: --fallback-after counts again
    never = FallbackRule(num_proc=8, min_np=4, max_np=8, fallback_after_s=None)
    assert never.wanted(6, 0.0, starting=True)[0] == 2
    assert never.wanted(6, 60.0) == (0, "")  # once started, only the --min-np rule
    assert never.wanted(3, 61.0, starting=True) == (5, "below --min-np 4")


def test_spot_between_min_np_and_np_at_start_up_starts_the_job_with_the_fallback():
    # The doc's ratio: --fallback-after equal to --start-timeout. Waiting for either lost the job.
    sim = Sourced(4, min_np=2, progress_timeout_s=0, start_timeout_s=600, fallback_after_s=600)
    sim.groups(a=3, od=1)
    assert sorted(sim.slots_launched()) == ["a0[0]", "a1[0]", "a2[0]", "od0[0]"]
    sim.join(*sim.slots_launched())
    assert sorted(running(sim)) == ["a0[0]", "a1[0]", "a2[0]", "od0[0]"]
    sim.commit(*running(sim))
    sim.advance(120)
    assert sim.state("od0[0]") is S.RUNNING  # it stays while Spot stays below -np
    sim.groups(a=4, od=1)
    sim.join("a3[0]")
    sim.advance(1)
    assert sim.state("od0[0]") is S.DRAINING  # others hold the state: it leaves at its next commit


def test_without_fallback_after_the_fallback_that_started_the_job_leaves_at_its_first_commit():
    sim = Sourced(4, min_np=2, progress_timeout_s=0, start_timeout_s=30)
    sim.groups(a=3, od=1)
    sim.advance(1)
    assert "od0[0]" in sim.slots_launched()
    sim.join(*sim.slots_launched())
    sim.advance(1)
    # Spot alone keeps --min-np: the fallback is no longer wanted once the job runs. The Spot members make the
    # first commit with it, so it leaves at that commit, taking nothing with it.
    assert sim.state("od0[0]") is S.DRAINING
    sim.commit(*sim.layout())
    sim.join(*sim.layout(), reason="update")
    sim.exit("od0[0]", CLEAN)
    sim.advance(40)
    assert running(sim) == ["a0[0]", "a1[0]", "a2[0]"] and sim.outcome is None


def test_a_job_that_cannot_start_fails_in_one_line_without_saying_it_waits_for_more(caplog):
    sim = Sourced(2, min_np=1, start_timeout_s=5)
    with caplog.at_level("INFO", logger="cloud_elastic"):
        sim.groups(a=1)  # no fallback slot to top it up: the job cannot start
        sim.advance(6)
    assert sim.outcome is not None and "only 1 slot(s) available after 5s; -np 2 needed to start" in sim.outcome.reason
    assert not [r for r in caplog.records if "waiting up to" in r.getMessage()], caplog.text  # it waits no more
