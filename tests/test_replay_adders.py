"""Adders against hand-written expected items."""

import numpy as np
import pytest

from rlherd.core import EnvSpec, Leaf
from rlherd.replay import (
    BatchAdder,
    EpisodeAdder,
    Fifo,
    NStepTransitionAdder,
    SequenceAdder,
    Table,
)

SPEC = EnvSpec("test", Leaf((1,), np.dtype(np.float32)), "discrete", num_actions=2)


def obs(i):
    return np.array([i], dtype=np.float32)


def drain(table):
    """Every item of a queue table, in insertion order."""
    items = []
    while table.size:
        s = table.sample(1)
        items.append({k: v[0] for k, v in s.data.items()})
    return items


def run_episode(adder, rewards, end="terminated", start=0):
    adder.add_first(obs(start))
    for t, r in enumerate(rewards):
        last = t == len(rewards) - 1
        adder.add(
            np.int64(t % 2), r, obs(start + t + 1),
            terminated=last and end == "terminated", truncated=last and end == "truncated",
        )  # fmt: skip


def nstep(n, gamma=0.5, extras=None):
    table = Table.queue("q", NStepTransitionAdder.signature(SPEC, extras), 100)
    return table, NStepTransitionAdder(table, n, gamma)


def expect(items, rows):
    assert len(items) == len(rows)
    for got, (o, a, r, d, nxt) in zip(items, rows, strict=True):
        assert got["obs"][0] == o and got["action"] == a and got["next_obs"][0] == nxt
        assert got["reward"] == pytest.approx(r) and got["discount"] == pytest.approx(d)


def test_nstep_terminated():
    table, adder = nstep(3)
    run_episode(adder, [1.0, 2.0, 3.0, 4.0])
    expect(
        drain(table),
        [
            (0, 0, 1 + 0.5 * 2 + 0.25 * 3, 0.125, 3),
            (1, 1, 2 + 0.5 * 3 + 0.25 * 4, 0.0, 4),
            (2, 0, 3 + 0.5 * 4, 0.0, 4),
            (3, 1, 4, 0.0, 4),
        ],
    )


def test_nstep_truncated_bootstraps_from_the_final_observation():
    table, adder = nstep(3)
    run_episode(adder, [1.0, 2.0, 3.0, 4.0], end="truncated")
    expect(
        drain(table),
        [
            (0, 0, 2.75, 0.125, 3),
            (1, 1, 4.5, 0.125, 4),
            (2, 0, 5.0, 0.25, 4),
            (3, 1, 4.0, 0.5, 4),
        ],
    )


def test_nstep_longer_than_the_episode_and_two_episodes():
    table, adder = nstep(5)
    run_episode(adder, [1.0, 2.0])
    run_episode(adder, [3.0], start=10)
    expect(drain(table), [(0, 0, 2.0, 0.0, 2), (1, 1, 2.0, 0.0, 2), (10, 0, 3.0, 0.0, 11)])


def test_nstep_one_step_with_extras_and_priority():
    extras = {"q": ((2,), np.float32)}
    table = Table("t", NStepTransitionAdder.signature(SPEC, extras), 10, Fifo())
    adder = NStepTransitionAdder(table, 1, 0.9, priority_fn=lambda item: float(item["reward"]))
    adder.add_first(obs(0))
    adder.add(np.int64(1), 7.0, obs(1), False, False, {"q": np.array([1, 2], np.float32)})
    s = table.sample(1)
    assert s.data["reward"][0] == 7.0 and s.data["discount"][0] == pytest.approx(0.9)
    assert s.data["q"][0].tolist() == [1.0, 2.0] and s.priorities[0] == 7.0


def test_nstep_needs_add_first():
    _, adder = nstep(2)
    with pytest.raises(RuntimeError, match="add_first"):
        adder.add(np.int64(0), 1.0, obs(1), False, False)


def seq_table(length, state=None):
    sig = SequenceAdder.signature(SPEC, length, extras={"h": ((), np.float32)}, state=state)
    return Table.queue("q", sig, 100)


def seq_episode(adder, steps, start=0):
    adder.add_first(obs(start))
    for t in range(steps):
        last = t == steps - 1
        extras = {"h": np.float32(start + t)}
        if adder.state_keys:
            extras["state"] = np.float32(100 + start + t)
        adder.add(np.int64(1), float(start + t), obs(start + t + 1), last, False, extras)


def rows_of(item):
    return [int(o[0]) for o, m in zip(item["obs"], item["mask"], strict=True) if m]


def test_sequence_pad_with_period():
    table = seq_table(3)
    seq_episode(SequenceAdder(table, length=3, period=2, end_of_episode="pad"), steps=3)
    items = drain(table)
    assert [rows_of(i) for i in items] == [[0, 1, 2], [2, 3]]
    last = items[1]
    assert last["mask"].tolist() == [True, True, False]
    assert last["reset"].tolist() == [False, True, False]  # obs 3 is the final observation
    assert last["terminated"].tolist() == [True, False, False]
    assert last["reward"].tolist() == [2.0, 0.0, 0.0] and last["h"].tolist() == [2.0, 0.0, 0.0]
    assert items[0]["first"].tolist() == [True, False, False]


def test_sequence_pad_vs_truncate():
    table = seq_table(4)
    seq_episode(SequenceAdder(table, length=4, period=1, end_of_episode="pad"), steps=2)
    assert [rows_of(i) for i in drain(table)] == [[0, 1, 2], [1, 2]]
    table = seq_table(4)
    seq_episode(SequenceAdder(table, length=4, period=1, end_of_episode="truncate"), steps=2)
    assert [rows_of(i) for i in drain(table)] == [[0, 1, 2]]


def test_sequence_continue_across_episodes_with_state():
    table = seq_table(3, state={"state": ((), np.float32)})
    adder = SequenceAdder(table, 3, 2, end_of_episode="continue", state_keys=("state",))
    seq_episode(adder, steps=2)
    seq_episode(adder, steps=2, start=10)
    items = drain(table)
    assert [rows_of(i) for i in items] == [[0, 1, 2], [2, 10, 11]]
    assert items[1]["reset"].tolist() == [True, False, False]
    assert items[1]["first"].tolist() == [False, True, False]
    assert items[0]["state"] == 100.0  # the state before reading the first row
    assert items[1]["state"] == 0.0  # a final-observation row has no state


def test_sequence_many_full_sequences():
    table = seq_table(2)
    seq_episode(SequenceAdder(table, length=2, period=2), steps=5)
    assert [rows_of(i) for i in drain(table)] == [[0, 1], [2, 3], [4, 5]]


def test_episode_adder():
    sig = EpisodeAdder.signature(SPEC, 5, extras={"h": ((), np.float32)})
    table = Table.queue("q", sig, 10)
    adder = EpisodeAdder(table, max_length=5)
    seq_episode(adder, steps=3)
    (item,) = drain(table)
    assert rows_of(item) == [0, 1, 2, 3] and item["mask"].tolist() == [True] * 4 + [False]
    with pytest.raises(ValueError, match="max_length"):
        seq_episode(adder, steps=5)


def test_batch_adder_skips_autoreset_steps():
    table, _ = nstep(1)
    adders = BatchAdder([NStepTransitionAdder(table, 1, 0.9) for _ in range(2)])
    adders.add_first(np.stack([obs(0), obs(10)]), np.array([True, True]))
    actions = np.array([1, 1], dtype=np.int64)
    no = np.array([False, False])
    adders.add(actions, np.array([1.0, 2.0]), np.stack([obs(1), obs(11)]),
               np.array([True, False]), no, skip=no)  # fmt: skip
    # env 0 autoresets now: its step is skipped, and it starts again from obs 20
    adders.add(actions, np.array([0.0, 3.0]), np.stack([obs(20), obs(12)]),
               no, no, skip=np.array([True, False]))  # fmt: skip
    adders.add_first(np.stack([obs(20), obs(12)]), np.array([True, False]))
    items = drain(table)
    assert [(int(i["obs"][0]), int(i["next_obs"][0])) for i in items] == [
        (0, 1),
        (10, 11),
        (11, 12),
    ]


def test_a_sequence_adder_restored_mid_episode_writes_what_it_would_have():
    """A checkpoint holds an adder's open rows as plain data (a deque comes back a list), and a
    resumed R2D2 run's adder goes on from them: the sequences written are those of an adder
    never stopped. (A restored list once failed at the next sequence: no ``popleft``.)"""
    from rlherd.run.plain import from_plain, to_plain

    straight_table = seq_table(3)
    seq_episode(SequenceAdder(straight_table, length=3, period=2), steps=9)
    table = seq_table(3)
    adder = SequenceAdder(table, length=3, period=2)
    adder.add_first(obs(0))
    for t in range(4):  # four steps in: one sequence written, rows 2-4 open
        adder.add(np.int64(1), float(t), obs(t + 1), False, False, {"h": np.float32(t)})
    restored = SequenceAdder(table, length=3, period=2)
    restored.load_state_dict(from_plain(to_plain(adder.state_dict())))
    for t in range(4, 9):
        last = t == 8
        restored.add(np.int64(1), float(t), obs(t + 1), last, False, {"h": np.float32(t)})
    expected = [rows_of(i) for i in drain(straight_table)]
    assert [rows_of(i) for i in drain(table)] == expected == [[0, 1, 2], [2, 3, 4], [4, 5, 6],
                                                              [6, 7, 8], [8, 9]]  # fmt: skip


def test_a_new_episode_forgets_the_steps_of_one_left_unfinished():
    """``add_first`` without the last episode's end (a resume whose environments could not be
    restored starts new episodes while the restored adder holds the old one's steps): no item
    may join the old episode's observations to the new one's."""
    table, adder = nstep(3)
    adder.add_first(obs(0))
    adder.add(np.int64(0), 1.0, obs(1), False, False)
    adder.add(np.int64(1), 2.0, obs(2), False, False)
    adder.add_first(obs(10))
    adder.add(np.int64(0), 3.0, obs(11), True, False)
    items = drain(table)
    assert [(int(i["obs"][0]), int(i["next_obs"][0]), float(i["reward"])) for i in items] == [
        (10, 11, 3.0)
    ]
    table = _sequence_table(3)
    adder = SequenceAdder(table, length=3, period=2, end_of_episode="pad")
    adder.add_first(obs(0))
    adder.add(np.int64(1), 0.0, obs(1), False, False, {"h": np.float32(0)})
    adder.add_first(obs(10))
    for t in range(2):
        adder.add(np.int64(1), 1.0, obs(11 + t), t == 1, False, {"h": np.float32(t)})
    assert [_rows(i) for i in drain(table)] == [[10, 11, 12]]


def _sequence_table(length):
    signature = SequenceAdder.signature(SPEC, length, extras={"h": ((), np.float32)})
    return Table.queue("q", signature, 100)


def _rows(item):
    return [int(o[0]) for o, m in zip(item["obs"], item["mask"], strict=True) if m]


def test_a_sequence_cut_by_the_time_limit_is_written_and_its_last_row_is_a_reset():
    """A truncated episode is flushed as a terminated one is (its tail would be lost), and its
    final observation's row is marked ``reset`` (nothing was taken there, so R2D2's learner
    must not train on it), ``truncated`` and not ``terminated`` on the step before."""
    table = _sequence_table(3)
    adder = SequenceAdder(table, length=3, period=2, end_of_episode="pad")
    adder.add_first(obs(0))
    for t in range(3):
        adder.add(np.int64(1), float(t), obs(t + 1), False, t == 2, {"h": np.float32(t)})
    items = drain(table)
    assert [_rows(i) for i in items] == [[0, 1, 2], [2, 3]]
    assert items[1]["truncated"].tolist() == [True, False, False]
    assert items[1]["terminated"].tolist() == [False, False, False]
    assert items[1]["reset"].tolist() == [False, True, False]
