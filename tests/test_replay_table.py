"""Replay tables: selectors, rate limiters (Reverb's arithmetic), blocking, checkpoints."""

import threading
import time

import numpy as np
import pytest

from rlherd.errors import ConfigError
from rlherd.replay import (
    Bursts,
    Fifo,
    Lifo,
    MaxHeap,
    MinHeap,
    MinSize,
    Prioritized,
    Queue,
    RateLimiter,
    RateLimiterTimeout,
    SampleToInsertRatio,
    Table,
    Uniform,
)

SIG = {"x": ((2,), np.float32), "i": ((), np.int64)}
CHI2_P001 = {3: 16.27, 4: 18.47, 9: 27.88}  # chi-square critical values at p = 0.001


def item(i):
    return {"x": np.full(2, i, dtype=np.float32), "i": np.int64(i)}


def filled(sampler, n=5, priorities=None, **kw):
    table = Table("t", SIG, max_size=kw.pop("max_size", 100), sampler=sampler, **kw)
    for i in range(n):
        table.insert(item(i), priority=1.0 if priorities is None else priorities[i])
    return table


def chi_square(counts, expected):
    return float(((counts - expected) ** 2 / expected).sum())


def test_uniform_distribution():
    table = filled(Uniform(), n=10)
    s = table.sample(20_000)
    counts = np.bincount(s.data["i"], minlength=10)
    assert chi_square(counts, np.full(10, 2000.0)) < CHI2_P001[9]
    assert np.allclose(s.probabilities, 0.1) and (s.table_size == 10).all()


def test_prioritized_distribution_and_probabilities():
    priorities = np.array([1.0, 2.0, 3.0, 4.0, 10.0])
    table = filled(Prioritized(priority_exponent=0.5), priorities=priorities)
    expected = priorities**0.5 / (priorities**0.5).sum()
    s = table.sample(40_000)
    counts = np.bincount(s.data["i"], minlength=5)
    assert chi_square(counts, expected * 40_000) < CHI2_P001[4]
    np.testing.assert_allclose(s.probabilities, expected[s.data["i"]])
    np.testing.assert_allclose(s.priorities, priorities[s.data["i"]])


def test_prioritized_sampling_across_blocks_against_the_exact_distribution():
    """Many blocks of slots (a partial last one), whole blocks and single slots at zero, and
    priorities from 1e-6 to 1e3: the sampled frequencies follow the priorities (chi-square on
    the slots expected 50+ times), the probabilities given are exact, zeros are never drawn."""
    rng = np.random.default_rng(0)
    selector, capacity = Prioritized(1.0), 1_000
    selector.reset(capacity)
    priorities = 10.0 ** rng.uniform(-6, 3, size=capacity)
    priorities[rng.random(capacity) < 0.3] = 0.0
    priorities[Prioritized.BLOCK * 3 : Prioritized.BLOCK * 5] = 0.0
    for slot, p in enumerate(priorities):
        selector.insert(slot, slot, p)
    selector.update(np.arange(0, capacity, 7), priorities[::7])  # a batch update of the same
    expected = priorities / priorities.sum()
    slots, probabilities = selector.sample(400_000, rng)
    assert priorities[slots].min() > 0
    np.testing.assert_allclose(probabilities, expected[slots], rtol=1e-12)
    counts = np.bincount(slots, minlength=capacity)
    often = expected * 400_000 >= 50
    rest = counts[~often].sum(), expected[~often].sum() * 400_000
    chi2 = chi_square(counts[often], expected[often] * 400_000) + (rest[0] - rest[1]) ** 2 / rest[1]
    k = int(often.sum())  # degrees of freedom: k + 1 cells; Wilson-Hilferty's p = 0.001 bound
    assert chi2 < k * (1 - 2 / (9 * k) + 3.09 * (2 / (9 * k)) ** 0.5) ** 3


def test_prioritized_updates_and_zero_priorities():
    table = Table("t", SIG, 10, Prioritized(1.0))
    keys = np.array([table.insert(item(i)) for i in range(5)])
    table.update_priorities(keys[3:4], np.array([0.0]))
    assert 3 not in table.sample(2000).data["i"]
    table.update_priorities(keys[:2], np.array([5.0, 5.0]))
    s = table.sample(1000)
    np.testing.assert_allclose(s.probabilities[s.data["i"] == 0], 5.0 / 12.0)
    table.update_priorities(keys, np.zeros(5))
    s = table.sample(500)  # all zero: falls back to uniform over the items
    assert set(s.data["i"].tolist()) == {0, 1, 2, 3, 4}
    with pytest.raises(ValueError, match="finite and >= 0"):
        table.update_priorities(keys[:1], np.array([-1.0]))


@pytest.mark.parametrize(
    "selector,priorities,order",
    [
        (Fifo(), None, [0, 1, 2, 3, 4]),
        (Lifo(), None, [4, 3, 2, 1, 0]),
        (MaxHeap(), [3.0, 1.0, 5.0, 3.0, 0.5], [2, 0, 3, 1, 4]),
        (MinHeap(), [3.0, 1.0, 5.0, 3.0, 0.5], [4, 1, 0, 3, 2]),
    ],
)
def test_deterministic_selectors_order(selector, priorities, order):
    table = filled(selector, priorities=priorities, max_times_sampled=1)
    got = [int(table.sample(1).data["i"][0]) for _ in range(5)]
    assert got == order  # ties (priority 3.0) go to the older item
    assert table.size == 0


def test_insert_many_is_inserting_each_row_in_order_and_stops_where_the_limiter_does():
    rows = [item(i) for i in range(7)]
    columns = {k: np.stack([r[k] for r in rows]) for k in SIG}
    priorities = np.arange(1.0, 8.0)
    one, many = (Table("t", SIG, 5, Uniform(), seed=3) for _ in range(2))
    for row, priority in zip(rows, priorities, strict=True):
        one.insert(row, priority)
    assert many.insert_many(columns, priorities) == 7
    for a, b in zip(one.state_dict().values(), many.state_dict().values(), strict=True):
        np.testing.assert_array_equal(a, b)
    # A limiter that lets 3 inserts through before a sample: the rest time out, uninserted.
    limited = Table("t", SIG, 10, Uniform(), rate_limiter=SampleToInsertRatio(1.0, 1, 2.0))
    assert limited.insert_many(columns, priorities, timeout=0.05) == 3
    assert limited.size == 3


def test_a_sample_of_several_batches_takes_no_more_than_the_limiter_allows():
    """A replay node's reply: the first batch waited for, then whole batches while the limiter
    allows them (2 samples per insert, 10 inserts: 20 samples, so 5 batches of 4 at most)."""
    table = Table("t", SIG, 100, Uniform(), rate_limiter=SampleToInsertRatio(2.0, 1, (0.0, 100.0)))
    for i in range(10):
        table.insert(item(i))
    batch = table.sample(4, timeout=1.0, batches=8)
    assert len(batch.keys) == 20 and table.limiter.samples == 20
    parts = batch.split(4)
    assert [len(p.keys) for p in parts] == [4] * 5
    np.testing.assert_array_equal(np.concatenate([p.data["i"] for p in parts]), batch.data["i"])
    np.testing.assert_array_equal(parts[2].keys, batch.keys[8:12])
    # A queue's items go when sampled: it never gives more than the batch asked for.
    queue = Table.queue("q", SIG, 10)
    for i in range(8):
        queue.insert(item(i))
    assert queue.sample(2, batches=3).data["i"].tolist() == [0, 1]


def test_fifo_names_the_oldest_live_item_whatever_is_deleted_or_inserted_out_of_order():
    """Against a naive reference (the smallest live key), under inserts, deletes anywhere
    (sampled-out items, removals) and inserts out of key order (what a restored table does)."""
    rng = np.random.default_rng(0)
    fifo, live, capacity = Fifo(), {}, 16  # slot -> key
    fifo.reset(capacity)
    keys = list(rng.permutation(40))  # the first inserts come in no order
    keys += list(range(40, 2_000))
    for key in keys:
        free = [s for s in range(capacity) if s not in live]
        if not free or rng.random() < 0.3:
            gone = int(rng.choice(list(live)))
            fifo.delete(gone)
            del live[gone]
            free = [s for s in range(capacity) if s not in live]
        slot = int(rng.choice(free))
        fifo.insert(slot, int(key), 1.0)
        live[slot] = int(key)
        slots, probs = fifo.sample(2, rng)
        oldest = min(live, key=live.get)
        assert slots.tolist() == [oldest, oldest] and probs.tolist() == [1.0, 1.0]
    assert len(fifo.queue) <= 2 * len(live) + 64  # deleted entries do not pile up


def test_heap_priority_update_moves_items():
    table = filled(MaxHeap(), n=3, priorities=[1.0, 2.0, 3.0])
    top = table.sample(1)
    assert top.data["i"][0] == 2
    table.update_priorities(top.keys, np.array([0.0]))
    assert table.sample(1).data["i"][0] == 1


def test_max_size_removes_the_removers_choice():
    table = Table("t", SIG, 3, Uniform(), remover=Fifo())
    for i in range(5):
        table.insert(item(i))
    assert sorted(set(table.sample(300).data["i"].tolist())) == [2, 3, 4]
    assert table.limiter.deletes == 2
    table = Table("t", SIG, 3, Uniform(), remover=MinHeap())
    for i, p in enumerate([5.0, 1.0, 3.0, 4.0]):
        table.insert(item(i), priority=p)
    assert sorted(set(table.sample(300).data["i"].tolist())) == [0, 2, 3]


def test_max_times_sampled_removes_items():
    table = filled(Uniform(), n=3, max_times_sampled=2)
    for _ in range(6):
        table.sample(1)
    assert table.size == 0 and table.limiter.deletes == 3


def test_wrong_items_are_rejected_naming_the_field():
    table = Table("replay", SIG, 10, Uniform())
    with pytest.raises(ValueError, match="field 'x' has shape \\(3,\\), expected \\(2,\\)"):
        table.insert({"x": np.zeros(3, np.float32), "i": np.int64(0)})
    with pytest.raises(TypeError, match="field 'i' has dtype float64, expected int64"):
        table.insert({"x": np.zeros(2, np.float32), "i": 1.5})
    with pytest.raises(ValueError, match="missing \\['i'\\]"):
        table.insert({"x": np.zeros(2, np.float32)})


def test_a_table_larger_than_the_machines_memory_is_refused_with_a_size_that_fits(monkeypatch):
    """Storage is preallocated: DQN's Atari replay (1M items of two 4x84x84 frame stacks, 53
    GiB) once failed deep in numpy, or on a larger machine only once it filled."""
    import rlherd.replay.table as table_mod

    monkeypatch.setattr(table_mod, "machine_memory", lambda: 2**30)  # 1 GiB
    atari = {"obs": ((4, 84, 84), np.uint8), "next_obs": ((4, 84, 84), np.uint8)}
    with pytest.raises(ConfigError, match=r"1,000,000 items of 56,448 bytes need 52\.6 GiB, more "
                       r"than this machine's 1\.0 GiB of memory; 9,510 items.*replay_size=9510"):
        Table("replay", atari, 1_000_000, Uniform())
    assert Table("replay", atari, 9_510, Uniform()).item_nbytes == 56_448  # what it said fits


def test_update_priorities_ignores_removed_items():
    table = Table("t", SIG, 2, Prioritized(1.0))
    k0 = table.insert(item(0))
    table.insert(item(1))
    table.insert(item(2))  # removes item 0
    table.update_priorities(np.array([k0]), np.array([100.0]))
    assert 0 not in table.sample(100).data["i"]


# ----------------------------------------------------------------------------- rate limiters
def test_min_size():
    lim = MinSize(3)
    lim.inserts = 2
    assert lim.can_insert(100) and not lim.can_sample(1)
    lim.inserts = 3
    assert lim.can_sample(10**6)
    lim.deletes = 1
    assert not lim.can_sample(1)


def test_sample_to_insert_ratio_hand_computed():
    # spi = 2, min size 4, error buffer 3: min_diff = 8 - 3 = 5, max_diff = 8 + 3 = 11.
    lim = SampleToInsertRatio(samples_per_insert=2.0, min_size_to_sample=4, error_buffer=3.0)
    assert (lim.min_diff, lim.max_diff) == (5.0, 11.0)
    lim.inserts = 3
    assert not lim.can_sample(1)  # size 3 < 4
    assert lim.can_insert(1)  # size 4 <= 4: filling up is free
    assert lim.can_insert(2)  # (3 + 2) * 2 - 0 = 10 <= 11
    assert not lim.can_insert(3)  # 6 * 2 = 12 > 11
    lim.inserts = 4
    assert lim.can_sample(3) and not lim.can_sample(4)  # 8 - 0 - n >= 5  <=>  n <= 3
    assert lim.samples_allowed() == 3
    lim.samples = 3
    assert not lim.can_sample(1)  # 8 - 3 - 1 = 4 < 5
    assert lim.can_insert(3) and not lim.can_insert(4)  # 7 * 2 - 3 = 11; 8 * 2 - 3 = 13
    lim.deletes = 1  # size 3 < 4 again: back to stage 1
    assert not lim.can_sample(1)


def test_sample_to_insert_ratio_range_and_validation():
    lim = SampleToInsertRatio(1.0, 10, error_buffer=(-5.0, 20.0))
    assert (lim.min_diff, lim.max_diff) == (-5.0, 20.0)
    with pytest.raises(ValueError, match="at least"):
        SampleToInsertRatio(1.0, 10, error_buffer=0.5)
    with pytest.raises(ValueError, match="deadlock"):
        SampleToInsertRatio(1.0, 10, error_buffer=(11.0, 20.0))
    with pytest.raises(ValueError, match="min_size_to_sample"):
        RateLimiter(1.0, 0, 0.0, 1.0)


def test_queue_limiter():
    lim = Queue(3)
    lim.inserts = 3
    assert not lim.can_insert(1)  # 4 * 1 - 0 = 4 > 3
    assert lim.can_sample(3) and not lim.can_sample(4)
    lim.samples = 1
    assert lim.can_insert(1)


def test_bursts_hand_computed():
    """SB3's schedule: 6 samples at each multiple of 4 inserts once 5 items are in: the first
    burst at 8 inserts (SB3 trains at step t when t % train_freq == 0 and t > learning_starts,
    learning_starts = 4 here)."""
    lim = Bursts(train_every=4, samples_per_burst=6, min_size_to_sample=5)
    lim.inserts = 7
    assert lim.samples_allowed() == 0 and not lim.can_sample(1)
    lim.inserts = 8
    assert lim.samples_allowed() == 6 and lim.can_sample(6) and not lim.can_sample(7)
    lim.inserts = 10
    assert lim.can_insert(1)  # the 11th insert starts no burst
    lim.inserts = 11
    assert lim.samples_allowed() == 6 and not lim.can_insert(1)  # the 12th starts the next...
    lim.samples = 3
    assert not lim.can_insert(1)  # ...not before the previous burst was sampled
    lim.samples = 6
    assert lim.can_insert(1) and lim.can_insert(100)
    lim.inserts = 12
    assert lim.samples_allowed() == 6
    assert lim.without_insert_blocking().can_insert(1)
    lim.samples = 0
    assert lim.without_insert_blocking().can_insert(1) and not lim.can_insert(4)


def test_bursts_drive_a_table_in_whole_bursts():
    """In one process (no insert blocking) a learner that samples while it can takes exactly
    one burst after each train_every inserts."""
    limiter = Bursts(train_every=3, samples_per_burst=4, min_size_to_sample=2)
    table = Table("t", SIG, 100, Uniform(), rate_limiter=limiter.without_insert_blocking())
    bursts = []
    for i in range(12):
        table.insert(item(i))
        taken = 0
        while table.can_sample(2):
            table.sample(2)
            taken += 2
        bursts.append(taken)
    assert bursts == [0, 0, 4, 0, 0, 4, 0, 0, 4, 0, 0, 4]


def test_inserts_allowed_is_the_most_inserts_the_limiter_lets_in_now():
    """The bisection against a count of ``can_insert(n)`` for every ``n``, for each kind of
    limiter, in states where it holds inserts back and where it does not."""
    limiters = [MinSize(3), Queue(5), SampleToInsertRatio(4.0, 10, 20.0), Bursts(4, 6, 8)]
    for lim in limiters:
        for _ in range(60):
            naive = max(n for n in range(41) if n == 0 or lim.can_insert(n))
            assert lim.inserts_allowed(40) == naive, (lim, lim.state_dict())
            if lim.can_insert(1):
                lim.inserts += 1
            if lim.can_sample(3):
                lim.samples += 3
    assert Queue(5).inserts_allowed(40) == 5 and MinSize(3).inserts_allowed(40) == 40


def test_without_insert_blocking():
    lim = SampleToInsertRatio(1.0, 2, error_buffer=2.0).without_insert_blocking()
    lim.inserts = 10**6
    assert lim.can_insert(1) and lim.can_sample(1)


# ----------------------------------------------------------------------------- blocking
def test_sample_blocks_until_another_thread_inserts():
    table = Table("t", SIG, 10, Uniform(), rate_limiter=MinSize(2))
    table.insert(item(0))
    threading.Timer(0.3, table.insert, (item(1),)).start()
    start = time.monotonic()
    s = table.sample(4, timeout=10)
    assert time.monotonic() - start >= 0.2 and len(s.keys) == 4


def test_queue_blocks_inserts_when_full_and_samples_release_them():
    table = Table.queue("q", SIG, max_size=2)
    table.insert(item(0))
    table.insert(item(1))
    done = threading.Event()

    def producer():
        table.insert(item(2), timeout=10)
        done.set()

    threading.Thread(target=producer).start()
    assert not done.wait(0.3), "an insert into a full queue must block"
    assert table.sample(1).data["i"][0] == 0
    assert done.wait(5)
    assert [int(table.sample(1).data["i"][0]) for _ in range(2)] == [1, 2]


def test_timeouts_raise_clear_errors():
    table = Table("replay", SIG, 10, Uniform(), rate_limiter=MinSize(5))
    with pytest.raises(RateLimiterTimeout, match="table 'replay': sample waited 0.2s"):
        table.sample(1, timeout=0.2)
    queue = Table.queue("q", SIG, max_size=1)
    queue.insert(item(0))
    with pytest.raises(RateLimiterTimeout, match="insert waited"):
        queue.insert(item(1), timeout=0.2)


def test_concurrent_inserts_and_samples_keep_the_ratio():
    """A producer and a consumer thread, each blocked by the limiter in turn: the error
    inserts * spi - samples never leaves [min_diff, max_diff] once the table has filled up."""
    limiter = SampleToInsertRatio(samples_per_insert=2.0, min_size_to_sample=10, error_buffer=4.0)
    table = Table("t", SIG, 1000, Uniform(), rate_limiter=limiter)
    sampled, errors = [], []

    def consumer():
        for _ in range(100):
            sampled.append(len(table.sample(3, timeout=10).keys))
            errors.append(limiter.inserts * 2.0 - limiter.samples)

    thread = threading.Thread(target=consumer)
    thread.start()
    for i in range(160):
        table.insert(item(i), timeout=10)
        if limiter.inserts > 10:
            errors.append(limiter.inserts * 2.0 - limiter.samples)
    thread.join(10)
    assert sum(sampled) == 300
    assert limiter.min_diff <= min(errors) and max(errors) <= limiter.max_diff


# ----------------------------------------------------------------------------- checkpoints
@pytest.mark.parametrize("sampler", [Uniform, lambda: Prioritized(0.7), Fifo, MaxHeap])
def test_checkpoint_round_trip(tmp_path, sampler):
    limiter = lambda: SampleToInsertRatio(1.0, 3, error_buffer=100.0)  # noqa: E731
    a = Table("t", SIG, 8, sampler(), rate_limiter=limiter(), seed=1)
    rng = np.random.default_rng(0)
    for i in range(12):
        a.insert(item(i), priority=float(rng.uniform(0.1, 2)))
    a.sample(5)
    a.save(tmp_path / "t.npz")
    b = Table("t", SIG, 8, sampler(), rate_limiter=limiter(), seed=99)
    b.restore(tmp_path / "t.npz")
    assert b.info() == a.info()
    for table in (a, b):
        table.insert(item(100), priority=1.5)
    sa, sb = a.sample(6), b.sample(6)
    np.testing.assert_array_equal(sa.keys, sb.keys)
    np.testing.assert_array_equal(sa.data["x"], sb.data["x"])
    np.testing.assert_allclose(sa.probabilities, sb.probabilities)
    assert not list(tmp_path.glob(".*tmp"))


def test_a_run_checkpoint_holds_a_tables_items_in_one_copy(tmp_path):
    """A replay table's items are most of a run's checkpoint, and its state is already a copy
    (taken under the table's lock, so actors may go on inserting). Turning that state into the
    checkpoint's plain data must not copy the items again: each copy is the table's size, and a
    table of 8 GB once took 24 GB to checkpoint, where the kernel stopped the run. The
    checkpoint still restores the table exactly."""
    import tracemalloc

    import torch

    from rlherd.run.plain import from_plain, to_plain

    sig = {"obs": ((2_500,), np.float32)}  # a size-50 deep sea's observation
    table = Table("t", sig, 400, Uniform(), seed=1)
    for i in range(400):
        table.insert({"obs": np.full(2_500, i, np.float32)})
    items = 400 * 2_500 * 4
    tracemalloc.start()
    try:
        plain = to_plain(table.state_dict())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert items <= peak < 1.5 * items
    torch.save(plain, tmp_path / "ckpt.pt")
    restored = Table("t", sig, 400, Uniform(), seed=2)
    restored.load_state_dict(from_plain(torch.load(tmp_path / "ckpt.pt", weights_only=True)))
    assert restored.info() == table.info()
    np.testing.assert_array_equal(restored.sample(32).data["obs"], table.sample(32).data["obs"])


@pytest.mark.parametrize("cls", [MaxHeap, MinHeap])
def test_the_heaps_agree_with_a_naive_reference(cls):
    """Random inserts, deletes of any slot and priority updates up and down: the top is always
    the naive best (ties: the older key), and taking the top out repeatedly, as a sampler with
    ``max_times_sampled=1`` does, gives each next best in turn."""
    rng = np.random.default_rng(0)
    heap, live, capacity, key = cls(), {}, 32, 0  # slot -> (priority, key)
    heap.reset(capacity)
    sign = -1.0 if cls is MaxHeap else 1.0

    def best():
        return min(live, key=lambda s: (sign * live[s][0], live[s][1]))

    for _ in range(3000):
        u = rng.random()
        free = [s for s in range(capacity) if s not in live]
        if free and (u < 0.4 or not live):
            slot, p = int(rng.choice(free)), float(rng.integers(0, 20))
            heap.insert(slot, key, p)
            live[slot] = (p, key)
            key += 1
        elif u < 0.7:
            slot = int(rng.choice(list(live)))
            heap.delete(slot)
            del live[slot]
        else:
            slot, p = int(rng.choice(list(live))), float(rng.integers(0, 20))
            heap.update(np.array([slot]), np.array([p]))
            live[slot] = (p, live[slot][1])
        if live:
            assert int(heap.sample(1, rng)[0][0]) == best()
        if len(live) > 20:
            while len(live) > 3:
                top = best()
                assert int(heap.sample(1, rng)[0][0]) == top
                heap.delete(top)
                del live[top]


class _ZeroDraws:
    """Uniform draws of exactly 0.0, which numpy's ``random()`` can return."""

    def random(self, n):
        return np.zeros(n)


def test_a_draw_of_zero_never_lands_on_a_zero_priority():
    sampler = Prioritized(1.0)
    sampler.reset(128)
    for slot in range(128):  # the first block all zero, and slot 64 too
        sampler.insert(slot, slot, 1.0 if slot == 65 else 0.0)
    slots, probabilities = sampler.sample(3, _ZeroDraws())
    assert slots.tolist() == [65, 65, 65] and probabilities.tolist() == [1.0, 1.0, 1.0]


def test_filling_up_to_the_minimum_size_is_never_blocked():
    """Inserts up to ``min_size_to_sample`` are free whatever the error buffer, or a table whose
    buffer ends below ``spi * min_size`` could never be sampled."""
    limiter = SampleToInsertRatio(1.0, 10, error_buffer=(-5.0, 8.0))
    for _ in range(10):
        assert limiter.can_insert(1)
        limiter.inserts += 1
    assert limiter.can_sample(1)


def test_samples_allowed_is_the_most_samples_the_limiter_lets_out_at_fractional_ratios():
    for limiter in (RateLimiter(0.5, 1, 0.0, 100.0), SampleToInsertRatio(0.25, 4, 10.0)):
        for _ in range(40):
            most = max(n for n in range(100) if n == 0 or limiter.can_sample(n))
            assert limiter.samples_allowed() == most, limiter.state_dict()
            limiter.inserts += 1
            if limiter.can_sample(1):
                limiter.samples += 1


def test_the_first_burst_comes_when_the_table_first_holds_the_minimum_at_a_multiple():
    """Stable-Baselines3's rule: with ``train_freq=4`` and ``learning_starts=3``, the first
    update is at step 4 (a minimum size of 4 items), the next at 8."""
    limiter = Bursts(train_every=4, samples_per_burst=6, min_size_to_sample=4)
    for inserts, allowed in ((3, 0), (4, 6), (8, 12)):
        limiter.inserts = inserts
        assert limiter.samples_allowed() == allowed


def test_times_sampled_counts_each_draw_and_starts_at_zero_in_a_reused_slot():
    table = Table("t", SIG, 10, Uniform())
    table.insert(item(0))
    assert table.sample(4).times_sampled.tolist() == [4, 4, 4, 4]  # repeats in one batch
    assert table.sample(1).times_sampled.tolist() == [5]
    table = Table("t", SIG, 1, Uniform(), max_times_sampled=2)
    table.insert(item(0))
    table.sample(1)
    table.insert(item(1))  # removes item 0 and takes its slot
    sample = table.sample(1)
    assert sample.data["i"].tolist() == [1] and sample.times_sampled.tolist() == [1]
    assert table.size == 1


def test_the_last_of_a_key_repeated_in_one_update_wins():
    table = Table("t", SIG, 10, Prioritized(1.0))
    k0, _ = table.insert(item(0)), table.insert(item(1))
    table.update_priorities(np.array([k0, k0]), np.array([1.0, 3.0]))
    sample = table.sample(2000)
    np.testing.assert_allclose(sample.probabilities[sample.data["i"] == 0], 0.75)


def test_an_item_removed_by_its_sample_comes_back_with_its_key_and_the_size_it_was_drawn_at():
    queue = Table.queue("q", SIG, 4)
    k0 = queue.insert(item(0))
    queue.insert(item(1))
    sample = queue.sample(1)
    assert sample.keys.tolist() == [k0] and sample.table_size.tolist() == [2]


def test_batches_that_do_not_divide_what_is_allowed_never_take_more():
    """Two samples per insert and ten inserts allow 20: batches of 3 take six, 18."""
    table = Table("t", SIG, 100, Uniform(), rate_limiter=SampleToInsertRatio(2.0, 1, (0.0, 100.0)))
    for i in range(10):
        table.insert(item(i))
    batch = table.sample(3, timeout=1.0, batches=8)
    assert len(batch.keys) == 18 and table.limiter.samples == 18


def test_a_restored_tables_checkpoint_copy_is_let_go():
    """The run's context holds its checkpoint until the run ends; a checkpoint still holding
    the tables' items after restoring doubled the replay's memory for the whole resumed run (a
    resumed size-50 deep sea R2D2 run, an 8 GB table, was killed for memory on a 24 GB VM)."""
    import gc
    import weakref

    from rlherd.runtime import load_tables

    table = filled(Uniform(), n=5)
    states = [table.state_dict()]  # as the run's checkpoint holds them
    items = weakref.ref(states[0]["data/x"])
    restored = Table("t", SIG, max_size=100, sampler=Uniform())
    load_tables([restored], states)
    gc.collect()
    assert items() is None, "the checkpoint still holds the table's items"
    assert restored.info() == table.info()


# ------------------------------------------------------------------------ compressed frames
FRAMES = {"obs": ((4, 84, 84), np.uint8), "next_obs": ((4, 84, 84), np.uint8),
          "grid": ((10, 10, 4), np.uint8), "action": ((), np.int64)}  # fmt: skip


def frames_item(i, rng=None):
    """An item whose frames are mostly background, as Atari's are (or noise, with ``rng``)."""
    shape = (4, 84, 84)
    obs = np.zeros(shape, np.uint8) if rng is None else rng.integers(0, 256, shape, np.uint8)
    obs[:, i % 84, :] = i % 256
    return {"obs": obs, "next_obs": obs[::-1].copy(), "grid": np.full((10, 10, 4), i % 2, np.uint8),
            "action": np.int64(i)}  # fmt: skip


def test_frames_are_kept_compressed_and_sampled_back_exactly():
    """DQN's Atari replay holds two stacks of four 84x84 frames per item: 53 GiB for a million
    as arrays, more than a workstation has. A table that compresses keeps the frame fields
    compressed (small fields, MinAtar's grid, and others as they are) and samples back the same
    keys and the same arrays as a plain table."""
    plain = Table("t", FRAMES, 50, Prioritized(0.6), seed=3)
    packed = Table("t", FRAMES, 50, Prioritized(0.6), seed=3, compress=True)
    assert packed.compressed == ["obs", "next_obs"]
    for i in range(80):  # past full: the remover's choice goes, in both
        for table in (plain, packed):
            table.insert(frames_item(i), priority=1.0 + i % 3)
    a, b = plain.sample(32), packed.sample(32)
    np.testing.assert_array_equal(a.keys, b.keys)
    for field in FRAMES:
        np.testing.assert_array_equal(a.data[field], b.data[field])
    assert b.data["obs"].flags.writeable  # torch.from_numpy takes it as a plain sample
    assert 0 < packed.storage["obs"].nbytes < 50 * 4 * 84 * 84 / 20


def test_a_compressed_item_that_leaves_the_table_lets_its_bytes_go():
    """An item removed by its sample (``max_times_sampled``) is gone from the table's memory,
    not only from its keys."""
    table = Table("t", FRAMES, 20, Fifo(), max_times_sampled=1, compress=True)
    for i in range(10):
        table.insert(frames_item(i))
    held = table.storage["obs"].nbytes
    table.sample(4)
    assert 0 < table.storage["obs"].nbytes < held
    table.sample(6)
    assert table.size == 0 and table.storage["obs"].nbytes == table.storage["next_obs"].nbytes == 0


def test_a_compressed_tables_checkpoint_holds_its_items_compressed_and_restores_exactly(tmp_path):
    """A checkpoint holds the compressed bytes (a million Atari items stay gigabytes, not 53 GiB)
    in plain arrays that load without pickle, and the restored table samples what the saved one
    does. A checkpoint of a table from before frames were compressed restores into one too."""
    import torch

    from rlherd.run.plain import from_plain, to_plain

    a = Table("t", FRAMES, 40, Uniform(), seed=1, compress=True)
    for i in range(60):
        a.insert(frames_item(i))
    state = a.state_dict()
    assert "data/obs" not in state and state["zdata/obs"].dtype == np.uint8
    assert state["zdata/obs"].nbytes == a.storage["obs"].nbytes < 40 * 4 * 84 * 84 / 20
    torch.save(to_plain(state), tmp_path / "ckpt.pt")
    b = Table("t", FRAMES, 40, Uniform(), seed=1, compress=True)
    b.load_state_dict(from_plain(torch.load(tmp_path / "ckpt.pt", weights_only=True)))
    old = Table("t", FRAMES, 40, Uniform(), seed=1)
    for i in range(60):
        old.insert(frames_item(i))
    c = Table("t", FRAMES, 40, Uniform(), seed=1, compress=True)
    c.load_state_dict(old.state_dict())
    assert b.info() == a.info() == c.info()
    want = a.sample(16)
    for restored in (b, c):
        got = restored.sample(16)
        np.testing.assert_array_equal(got.keys, want.keys)
        np.testing.assert_array_equal(got.data["obs"], want.data["obs"])
        np.testing.assert_array_equal(got.data["next_obs"], want.data["next_obs"])


def test_compressed_frames_that_would_not_fit_stop_the_run_once_measured(monkeypatch):
    """Compressed items' size is known only once some are in: the table measures its first
    thousand and refuses a size that would not fit then, with one that does, rather than when
    it fills. Frames that compress well go on."""
    import rlherd.replay.table as table_mod

    monkeypatch.setattr(table_mod, "machine_memory", lambda: 2**30)  # 1 GiB
    background = Table("replay", FRAMES, 1_000_000, Uniform(), compress=True)
    for i in range(1_001):
        background.insert(frames_item(i))
    noise = Table("replay", FRAMES, 1_000_000, Uniform(), compress=True)  # up front: 408 B/item
    rng = np.random.default_rng(0)
    for i in range(1_000):
        noise.insert(frames_item(i, rng))
    with pytest.raises(ConfigError, match=r"1,000,000 items of 56,\d{3} bytes \(the mean of "
                       r"the 1,000 it holds, compressed\) need 52\.\d GiB, more than this "
                       r"machine's 1\.0 GiB of memory; 9,\d{3} items .*replay_size=9\d{3}\)"):
        noise.insert(frames_item(1_000, rng))


def test_a_compressed_table_loaded_over_its_own_items_holds_only_the_checkpoints():
    """Loading a checkpoint replaces what a table held: its compressed bytes are the
    checkpoint's items' alone, as its keys are."""
    a = Table("t", FRAMES, 40, Uniform(), compress=True)
    for i in range(5):
        a.insert(frames_item(i))
    b = Table("t", FRAMES, 40, Uniform(), compress=True)
    for i in range(30):
        b.insert(frames_item(i))
    b.load_state_dict(a.state_dict())
    assert b.size == 5 and b.storage["obs"].nbytes == a.storage["obs"].nbytes


def test_an_empty_compressed_tables_checkpoint_loads():
    """A run stopped before its first insert (Ctrl-C while actors start) checkpoints an empty
    table; its resume loaded it into a zip() error, told as a config that does not fit."""
    import io

    empty = Table("t", FRAMES, 40, Uniform(), compress=True)
    restored = Table("t", FRAMES, 40, Uniform(), compress=True)
    restored.load_state_dict(empty.state_dict())
    buffer = io.BytesIO()
    np.savez(buffer, **empty.state_dict())
    buffer.seek(0)
    with np.load(buffer) as data:
        restored.load_state_dict(dict(data))
    assert restored.size == 0 and restored.storage["obs"].nbytes == 0


def test_a_replay_nodes_reply_is_sized_by_the_items_it_sends():
    """A replay node sends a learner as many batches in one reply as fit ``PREFETCH_BYTES``,
    reckoned by an item as it is sampled: decompressed. Reckoned by what a compressed item takes
    in the table, R2D2's Atari sequences went 16 batches to a reply (0.66 GiB), not 1."""
    from rlherd.runtime.program import PREFETCH_BYTES, ReplayNode

    node = ReplayNode(lambda: [Table("t", FRAMES, 400, Uniform(), compress=True)])
    for i in range(400):
        node.tables[0].insert(frames_item(i))
    reply, _ = node.sample(0, 32, timeout=1.0, batches=64)
    assert node.tables[0].item_nbytes == 56_856  # two 4x84x84 stacks, a 10x10x4 grid, an int64
    assert len(reply.keys) == 32 * (PREFETCH_BYTES // (32 * 56_856)) == 32 * 18


def test_frames_are_packed_and_unpacked_while_the_table_is_free(monkeypatch):
    """Compressing an item takes a tenth of a millisecond, decompressing a batch milliseconds
    (R2D2's Atari sequences, a tenth of a second); done under the table's lock, every other
    insert and sample waited for it. Inserts compress before they take the lock, and samples
    copy the compressed bytes under it and unpack them after."""
    from rlherd.replay.table import ZlibColumn

    table = Table("t", FRAMES, 40, Uniform(), compress=True)
    free = []

    def looking(method):
        def look(*args):
            free.append(table._cond.acquire(blocking=False))
            if free[-1]:
                table._cond.release()
            return method(*args)
        return look

    monkeypatch.setattr(ZlibColumn, "pack", looking(ZlibColumn.pack))
    monkeypatch.setattr(ZlibColumn, "unpack", looking(ZlibColumn.unpack))
    table.insert(frames_item(0))
    rows = [frames_item(i) for i in range(1, 4)]
    table.insert_many({k: np.stack([r[k] for r in rows]) for k in FRAMES}, np.ones(3))
    batch = table.sample(8, batches=2)
    assert len(free) == 2 + 6 + 2 and all(free)
    assert batch.data["obs"].shape == (16, 4, 84, 84)
