"""The follow window's plan (``worker/commit/follow.py:plan``), a follower's share of a reduction
(``worker/comm/followers.py:identity_fill``): pure functions of shapes and ops; and rank 0's rule that a spare taking
a member's place gets the whole sync (``follow._refusal``)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from cloud_elastic.worker.comm import followers
from cloud_elastic.worker.comm.ops import Average, Max, Min, Product, Sum
from cloud_elastic.worker.commit.follow import PACE_EVERY, Window, _refusal, _tensor, at_commit, pace_word, plan, quiet
from cloud_elastic.worker.commit.handlers import ModelHandler, OptimizerHandler


def _state():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Linear(5, 1))
    model[1].bias.requires_grad_(False)  # frozen, outside the optimizer: sent once, as a parameter of its own
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=0.1)
    model(torch.randn(3, 6)).sum().backward()
    opt.step()
    opt.state[model[0].weight]["extra"] = torch.zeros(37)  # an entry of another shape (the benchmark's ballast)
    return SimpleNamespace(_handlers={"model": ModelHandler(model), "optimizer": OptimizerHandler(opt)}), model, opt


@pytest.mark.parametrize("budget", [1, 40, 100, 10_000])
def test_every_element_is_sent_once_within_the_budget(budget):
    state, model, opt = _state()
    boundaries = plan(state, budget)
    seen: dict[tuple, list[int]] = {}
    for pieces in boundaries:
        size = sum((s.stop - s.start) * sum(_tensor(state, r).element_size() for r in s.refs) for s in pieces)
        assert size <= budget or len(pieces) == 1  # one piece more than the budget only when it alone is bigger
        for s in pieces:
            for ref in s.refs:
                seen.setdefault(ref, []).extend(range(s.start, s.stop))
    tensors = {ref: _tensor(state, ref) for ref in seen}
    assert all(sorted(seen[ref]) == list(range(t.numel())) for ref, t in tensors.items())
    expected = sum(len(s) for s in opt.state.values()) + sum(1 for _ in model.parameters())
    assert len(seen) == expected  # every parameter (the frozen one too) and every state tensor


def test_a_parameters_step_count_comes_no_later_than_its_first_elements():
    state, _, opt = _state()
    order = [(ref, s.start) for pieces in plan(state, 16) for s in pieces for ref in s.refs]
    for index in range(len(opt.param_groups[0]["params"])):
        step_at = order.index((("s", 1, 0, index, "step"), 0))
        first = order.index((("p", 1, 0, index), 0))
        assert step_at < first


def test_the_plan_is_the_same_from_the_same_shapes():
    a, _, _ = _state()
    b, _, _ = _state()
    assert plan(a, 64) == plan(b, 64)


@pytest.mark.parametrize("op,dtype,others,expected", [
    (Sum, torch.float32, [1.5, 2.0], 3.5), (Average, torch.float32, [1.5, 2.0], 3.5),
    (Product, torch.float32, [1.5, 2.0], 3.0), (Min, torch.float32, [1.5, 2.0], 1.5),
    (Max, torch.float32, [-1.5, -2.0], -1.5), (Min, torch.int64, [4, 7], 4), (Max, torch.int32, [-4, -7], -4),
])
def test_a_followers_share_of_a_reduction_changes_nothing(op, dtype, others, expected):
    mine = torch.full((3,), 123, dtype=dtype)
    followers.identity_fill(mine, op)
    values = torch.stack([torch.full((3,), v, dtype=dtype) for v in others] + [mine])
    reduced = {Sum: values.sum(0), Average: values.sum(0), Product: values.prod(0), Min: values.min(0).values,
               Max: values.max(0).values}[op]
    assert reduced.tolist() == [expected] * 3


def _rank0(size: int, previous_size: int, commit_interval: float | None = 0.05):
    """Rank 0 of a round of ``size`` on one host each, its round before of ``previous_size``, committing every
    ``commit_interval`` s; follow mode on, its windows bounded to 30 s."""
    info = SimpleNamespace(size=size, rank=0, round=2, from_checkpoint=False)
    ledger = SimpleNamespace(sync_hosts=list(range(size)), commit_interval=commit_interval)
    return SimpleNamespace(info=info, ledger=ledger, settings=SimpleNamespace(follow=True, follow_window_s=30.0),
                           backend="gloo", device=torch.device("cpu"), following=None, previous_size=previous_size, worker_id="w")


@pytest.mark.parametrize("size, previous, receivers, takes_a_place", [
    (3, 2, [2], False),  # a newcomer grows the job: it may follow
    (4, 2, [2, 3], False),  # two newcomers, two more members
    (3, 3, [2], True),  # a spare in a lost (or leaving) member's place: the round is no larger
    (4, 3, [2, 3], True),  # one newcomer and one spare in a lost member's place
])
def test_a_receiver_that_takes_a_members_place_gets_the_whole_sync(size, previous, receivers, takes_a_place):
    why = _refusal(_rank0(size, previous), SimpleNamespace(_handlers={}), receivers, 5, receivers)
    assert ("takes a lost or leaving member's place" in why) == takes_a_place, why
    assert takes_a_place or why == "no model and optimizer"  # past the rule, to the state's own checks


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64, torch.int64, torch.bool])
def test_a_followers_optimizer_state_starts_as_zeros_it_can_write_without_touching_a_gigabyte_first(dtype):
    """bench41: a follower zeroed each parameter's optimizer state at the commit of its first piece, while the running
    workers waited for that piece (0.4-1 s for 1 GB of Adam state). Its state is now zeros from an anonymous mapping:
    no page is written until a piece arrives, and what it reads before then is zero (finite: no NaN loss)."""
    from cloud_elastic.worker.comm.skeleton import zeros

    small = zeros((3, 5), dtype)
    assert small.shape == (3, 5) and small.dtype == dtype and not small.any()
    numel = (1 << 30) // torch.tensor([], dtype=dtype).element_size()
    rss = _rss()
    big = zeros((numel // 1024, 1024), dtype)
    assert big.dtype == dtype and big.shape == (numel // 1024, 1024)
    assert _rss() - rss < 64 << 20  # 1 GiB made, its pages not written
    assert not big[-1].any() and not big[12345].any()
    big[7].fill_(1)  # written like any tensor (a piece received)
    assert big[7].all() and not big[8].any()


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


@pytest.mark.parametrize("interval, follows", [(None, True), (0.05, True), (14.9, True), (15.1, False), (40.0, False)])
def test_a_script_whose_two_commits_outlast_the_window_bound_gets_the_whole_sync(interval, follows):
    why = _refusal(_rank0(3, 2, interval), SimpleNamespace(_handlers={}), [2], 5, [2])
    assert ("a window of two commits would outlast CLOUD_ELASTIC_FOLLOW_WINDOW_S=30 s" in why) != follows, why


def _window(planned: int, bound: float, interval, before: float) -> tuple[float, int, int]:
    """A window of ``planned`` commits as ``follow.at_commit`` runs it, commits ``interval(t)`` seconds apart:
    (when its check's commit comes, the commits it took, how many words rank 0 said on the pace)."""
    left, done, decide_at, pace, words, t = planned, 0, 0, 1, 0, 0.0
    while done < left:
        if left - done > 1:
            if done >= decide_at:
                pace, gap = pace_word(left - done, done, t, bound, before)
                decide_at, words = done + gap, words + 1
            left -= min(pace, left - done) - 1
        done += 1
        t += interval(t)
    return t, done + 1, words


@pytest.mark.parametrize("planned, interval, slower", [(240, 0.05, 1.0), (1000, 0.05, 1.0), (1000, 0.05, 1.9),
                                                       (60, 0.4, 1.0), (60, 0.4, 1.9), (5, 6.0, 1.0)])
def test_the_pace_is_said_every_few_commits_and_the_window_still_ends_within_its_bound(planned, interval, slower):
    """Rank 0 says the pace at the window's first commit and then every PACE_EVERY commits at most, not at every
    commit (a synchronisation of every member, 3 ms each), and a window still ends within its bound, even where
    the commits come up to twice as slowly from a third of the bound on."""
    bound = 30.0
    end, took, words = _window(planned, bound, lambda t: interval * (slower if t > bound / 3 else 1.0), interval)
    assert end <= bound
    assert took <= planned + 1
    assert words <= max(1, took // 2)  # the old rule: one word a commit
    if planned * interval < bound / 4:  # no hurry: one word every PACE_EVERY commits
        assert words <= -(-took // PACE_EVERY)


def test_once_the_time_is_up_everything_left_moves_at_the_next_commit():
    assert pace_word(50, 10, 31.0, 30.0, 0.1) == (50, 1)
    assert pace_word(50, 0, 0.0, 30.0, 0.0) == (1, 1)  # no interval known: said again at the next commit


@pytest.mark.parametrize("interval, bound, skips", [(None, 30.0, False), (0.004, 30.0, True), (1.0, 30.0, True),
                                                    (1.1, 30.0, False), (10.0, 30.0, False), (0.5, 4.0, False)])
def test_the_switching_commit_moves_no_piece_where_commits_are_short(interval, bound, skips):
    """Rank 0's word (``follow.quiet``): the switching step already carries the rendezvous, the small parts and
    the newcomer's first step with the running workers waiting, so its commit moves nothing, where commits come
    every second at most and a tenth of the window's bound: a commit more there costs the window next to
    nothing, where a script committing every 10 s would have had a window 10 s longer (review rvQ)."""
    ctx = _rank0(3, 2, interval)
    ctx.settings.follow_window_s = bound
    assert quiet(ctx) == skips


def test_a_quiet_commit_moves_nothing_and_the_next_one_moves_the_first_pieces():
    state, _, _ = _state()
    ctx = _rank0(3, 2)
    ctx.following = window = Window(2, [2], 3, 5, plan(state, 10_000), quiet=True)
    at_commit(ctx, state)  # the switching commit: no collective (none could run here), nothing sent
    assert (window.boundary, window.bytes, window.quiet, window.digests) == (0, 0, False, [])
    assert ctx.following is window  # the window goes on; the next commit sends its first pieces


@pytest.mark.parametrize("ahead, count, posted", [(True, 1, True), (True, 5, False), (False, 1, False)])
def test_a_commits_pieces_travel_on_while_they_are_one_commits_and_rank_0_said_so(monkeypatch, ahead, count, posted):
    """Posted (landing before the next update) only where rank 0 said the loop changes nothing before ``step()``
    and the commit moves one commit's pieces: several at once (the pace's catch-up, ``complete``) would need
    landing buffers for all of them (review s67 rvU F2); they are received in place, now."""
    from cloud_elastic.worker.comm.heal import Heal, InFlight

    calls = []
    monkeypatch.setattr(Heal, "post", lambda self, views, name: calls.append("post") or InFlight(name))
    monkeypatch.setattr(Heal, "tensors", lambda self, views, name, **kw: calls.append("now"))
    state, _, _ = _state()
    ctx = _rank0(3, 2)
    ctx.settings.follow_bytes = 100
    ctx.following = window = Window(2, [2], 3, 5, plan(state, 100), ahead=ahead, decide_at=10 ** 6)
    assert len(window.plan) > count
    window.plan[0:count] = [[piece for pieces in window.plan[0:count] for piece in pieces]]  # as _merge does
    at_commit(ctx, state)
    assert calls == (["post"] if posted else ["now"]) and window.boundary == 1
    assert (window.in_flight is not None) == posted


def test_rank_0_keeps_the_pieces_at_the_commit_where_the_loop_changes_parameters_before_step():
    from cloud_elastic.worker.commit.follow import ahead

    state, _, opt = _state()
    opt._ce_outside = False
    assert ahead(state)
    opt._ce_outside = True  # DistributedOptimizer._ce_check_outside saw a clamp at the top of the loop (WGAN)
    assert not ahead(state)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.uint8, torch.float64])
@pytest.mark.parametrize("start,stop", [(0, 64), (1, 64), (3, 40), (5, 6), (5, 61)])
def test_a_pieces_digest_depends_on_its_bytes_alone_and_sees_one_changed_element(dtype, start, stop):
    # A holder's view and a follower's may lie at different offsets of their storages (alignment) and still be
    # the same bytes; one element that differs is a different digest, so the window ends with the whole sync.
    from cloud_elastic.worker.commit.follow import _digest

    torch.manual_seed(1)
    source = (torch.rand(64) * 200).to(dtype)
    holder = source[start:stop]
    follower = torch.cat([torch.zeros(3, dtype=dtype), source[start:stop]])[3:]  # the same bytes, moved
    # A storage whose base is 4 bytes off an 8-byte boundary (numpy's, safetensors' weights loaded with
    # assign=True): torch views it by its offset, not its address (review s67 rvU F1).
    shifted = torch.from_numpy(np.frombuffer(bytearray(4) + bytearray(source.view(torch.uint8).numpy().tobytes()),
                                             dtype=np.uint8)[4:]).view(dtype)[start:stop]
    assert _digest([holder]) == _digest([follower.clone()]) == _digest([follower]) == _digest([shifted])
    follower[len(follower) // 2] += 1
    assert _digest([holder]) != _digest([follower])
    assert _digest([holder, holder]) != _digest([holder])


def _reference_digest(views: list[torch.Tensor]) -> int:
    """The digest's definition, from the bytes: each view zero-padded to 8 bytes, as little-endian words, summed."""
    total = 0
    for v in views:
        data = v.contiguous().view(torch.uint8).numpy().tobytes()
        data += bytes(-len(data) % 8)
        total += sum(int.from_bytes(data[i:i + 8], "little") for i in range(0, len(data), 8))
    return total & (2**62 - 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.uint8, torch.float64, torch.int64])
@pytest.mark.parametrize("start,stop", [(0, 64), (2, 63), (8, 9), (0, 0), (16, 61)])
def test_a_digest_is_its_views_bytes_as_little_endian_words_summed(dtype, start, stop):
    # An aligned view with a tail that is not a whole word is read in place and its last bytes padded alone: the
    # same value as the definition, whatever the tail's length.
    from cloud_elastic.worker.commit.follow import _digest

    torch.manual_seed(2)
    source = (torch.rand(64) * 250 - (0 if dtype == torch.uint8 else 125)).to(dtype)
    views = [source[start:stop], source[stop // 2:stop]]
    assert _digest(views) == _reference_digest(views)


def test_adams_slices_start_and_end_on_8_byte_boundaries_so_the_digest_reads_them_in_place():
    # Adam: a parameter and its two moments, 12 bytes an element. A budget of 1,212 bytes is 101 elements a
    # slice; rounded to 100, every slice of a tensor starts 8-byte aligned and only a tensor's last one may end
    # off a word (review s67 rvU: 4 MB made 333,333-element slices, every other one copied to be digested).
    torch.manual_seed(0)
    model = torch.nn.Linear(40, 30)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.randn(2, 40)).sum().backward()
    opt.step()
    state = SimpleNamespace(_handlers={"model": ModelHandler(model), "optimizer": OptimizerHandler(opt)})
    slices = [s for pieces in plan(state, 1_212) for s in pieces]
    weight = [s for s in slices if ("p", 1, 0, 0) in s.refs]
    assert len(weight[0].refs) == 3 and [s.stop - s.start for s in weight] == [100] * 12  # 1,200 elements
    for s in slices:
        for ref in s.refs:
            t = _tensor(state, ref)
            assert (s.start * t.element_size()) % 8 == 0
            assert ((s.stop - s.start) * t.element_size()) % 8 == 0 or s.stop == t.numel()


def test_an_optimizer_that_stepped_with_a_closure_gets_the_whole_sync():
    """Its gradients come from inside ``step()`` (``optim.closure``), where a follower's share is not the window's
    to arrange: rank 0 refuses the window once it has seen a closure step, and the newcomer gets the whole sync."""
    import cloud_elastic.torch as hvd

    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Linear(5, 1))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model, opt)
    x = torch.randn(3, 6)
    opt.zero_grad()
    model(x).sum().backward()
    opt.step()
    assert _refusal(_rank0(3, 2), state, [2], 5, [2]) == ""

    def closure():
        opt.zero_grad()
        loss = model(x).sum()
        loss.backward()
        return loss

    before = float(model(x).sum().detach())
    assert float(opt.step(closure)) == before  # the closure's loss, at the weights before the update (one worker)
    assert _refusal(_rank0(3, 2), state, [2], 5, [2]) == "an optimizer stepped with a closure"


@pytest.mark.parametrize("norm", ["hvd", "torch"])
def test_a_model_with_a_sync_batch_norm_gets_the_whole_sync(norm):
    """A follower's batch statistics would go into the members' (review h6, 2026-12-01: ``hvd.SyncBatchNorm``
    subclasses ``_BatchNorm``, not ``torch.nn.SyncBatchNorm``, and a newcomer's activations from half-received
    weights moved the members' running means): rank 0 refuses the window for either."""
    import cloud_elastic.torch as hvd

    hvd.init()
    layer = hvd.SyncBatchNorm(5) if norm == "hvd" else torch.nn.SyncBatchNorm(5)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), layer)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model, opt)
    assert _refusal(_rank0(3, 2), state, [2], 5, [2]) == "SyncBatchNorm"
