"""The on-policy dataflow: the shared actor writing rlherd.types' rollout layout through a
RolloutWriter, the one EpisodeTracker, and the version-aware VariableClient."""

import numpy as np
import pytest
import torch

from rlherd import envs
from rlherd.agents.impala import ImpalaBuilder, ImpalaConfig
from rlherd.core import VariableClient
from rlherd.replay.rollouts import (
    RolloutQueue,
    RolloutWriter,
    allocate_rollout,
    core_state_of,
    rollout_layout,
)
from rlherd.run.counting import EpisodeTracker
from rlherd.run.loop import EnvironmentLoop


def run_actor(num_envs=3, T=7, rollouts=2, use_lstm=False, length=3):
    """The IMPALA actor stepping Corridor into a queue; returns the queued rollouts."""
    vec = envs.make_vector("rlherd/Corridor-v0", num_envs, length=length, max_steps=4)
    spec = envs.spec_of(vec, "rlherd/Corridor-v0")
    config = ImpalaConfig(hidden_sizes=(8,), use_lstm=use_lstm, lstm_size=4, unroll_length=T)
    builder = ImpalaBuilder(config)
    net = builder.make_networks(spec)
    policy = builder.make_policy(net)
    layout = rollout_layout(spec, builder.rollout_fields(spec))
    queue = RolloutQueue(allocate_rollout(layout, T, num_envs, policy.initial_state(num_envs)))
    actor = builder.make_actor(0, policy, spec, queue, None)
    EnvironmentLoop(vec, actor, seed=0).run(rollouts * T + 1)  # row T of the last one
    return [queue.queue.popleft() for _ in range(rollouts)], net


def test_rollouts_overlap_and_follow_the_autoreset_convention():
    (first, second), _ = run_actor()
    T = 7
    for key in ("obs", "reset", "action", "policy_logits", "baseline"):
        torch.testing.assert_close(first[key][T], second[key][0])
    for r in (first, second):
        ended = r["terminated"][:-1] | r["truncated"][:-1]
        # reset[t + 1] marks the final observation reached by an ending step
        assert torch.equal(r["reset"][1:], ended)
        # the step taken from a final observation only resets: reward 0, flags false
        autoreset = r["reset"][:-1]
        assert (r["reward"][:-1][autoreset] == 0).all()
        assert not ended[autoreset].any()
    assert first["reset"].any(), "corridor episodes of <= 4 steps must end within 7 steps"


def test_learner_recomputes_the_actors_outputs_across_episode_ends():
    """The learner zeroes the LSTM state exactly where the actor did, so with the same
    parameters it reproduces the behaviour logits of every row, across several episodes."""
    rollouts, net = run_actor(num_envs=2, T=12, use_lstm=True)
    for r in rollouts:
        assert r["reset"][1:].any()
        first = torch.zeros_like(r["reset"])
        first[1:] = r["reset"][:-1]
        with torch.no_grad():
            out, _ = net(r["obs"], first, core_state_of(r))
        torch.testing.assert_close(out["policy_logits"], r["policy_logits"])
        torch.testing.assert_close(out["baseline"], r["baseline"])


def test_the_writer_rejects_fields_and_shapes_it_does_not_hold():
    fields = rollout_layout(envs.spec_for("CartPole-v1"), {"action": ((), torch.int64)})
    writer = RolloutWriter(allocate_rollout(fields, 4, 2), on_full=lambda full: full)
    with pytest.raises(ValueError, match="'logits' is not a field"):
        writer.add_row(obs=torch.zeros(2, 4), logits=torch.zeros(2))
    with pytest.raises(ValueError, match="expected shape \\(2, 4\\)"):
        writer.add_row(obs=torch.zeros(3, 4))
    with pytest.raises(ValueError, match="must include"):
        RolloutWriter({"obs": torch.zeros(5, 2)}, on_full=lambda full: full)


def autoreset_flags(rng, T, B):
    """Random rewards and flags as a vector env with next-step autoreset gives them: the step
    after an end only resets (reward 0, both flags false)."""
    rewards = rng.normal(size=(T, B)).round(2)
    terminated, truncated = rng.random((T, B)) < 0.1, rng.random((T, B)) < 0.05
    resetting = np.zeros((T, B), dtype=bool)
    for t in range(1, T):
        resetting[t] = (terminated[t - 1] | truncated[t - 1]) & ~resetting[t - 1]
    terminated &= ~resetting
    truncated &= ~resetting
    rewards[resetting] = 0.0
    return rewards, terminated, truncated, resetting


def naive_episodes(rewards, terminated, truncated, resetting):
    """``(t, b, return, length)`` of every episode end, per environment in plain Python."""
    out = []
    for b in range(rewards.shape[1]):
        ret, length = 0.0, 0
        for t in range(rewards.shape[0]):
            if resetting[t, b]:
                ret, length = 0.0, 0
                continue
            ret, length = ret + rewards[t, b], length + 1
            if terminated[t, b] or truncated[t, b]:
                out.append((t, b, ret, length))
    return sorted(out)


@pytest.mark.parametrize("lib", ["numpy", "torch"])
def test_episode_tracker_matches_a_naive_count(lib):
    rewards, terminated, truncated, resetting = autoreset_flags(np.random.default_rng(0), 60, 4)
    as_ = (lambda x: x) if lib == "numpy" else torch.as_tensor
    tracker = EpisodeTracker(as_(np.zeros(4)), as_(np.zeros(4, dtype=np.int64)))
    seen = []
    for t in range(60):
        ended = tracker.step(as_(rewards[t]), as_(terminated[t]), as_(truncated[t]),
                             as_(resetting[t]))  # fmt: skip
        for b in np.flatnonzero(np.asarray(ended)):
            seen.append((t, b, float(tracker.returns[b]), int(tracker.lengths[b])))
    expected = naive_episodes(rewards, terminated, truncated, resetting)
    assert len(expected) > 5
    assert [(t, b, n) for t, b, _, n in sorted(seen)] == [(t, b, n) for t, b, _, n in expected]
    np.testing.assert_allclose([r for *_, r, _ in sorted(seen)], [r for *_, r, _ in expected])
    count, mean_return, mean_length = tracker.take()
    assert count == len(expected)
    assert float(mean_return) == pytest.approx(np.mean([r for *_, r, _ in expected]))
    assert mean_length == pytest.approx(np.mean([n for *_, n in expected]))
    assert tracker.take()[0] == 0  # take() empties the totals


class CountingSource:
    """A variable source that counts fetches and moves its version on demand."""

    def __init__(self, module):
        self.module, self.version, self.fetches = module, 0, 0

    def get_variables(self, names):
        self.fetches += 1
        return [self.module.state_dict()]

    def variables_version(self):
        return self.version


def test_variable_client_fetches_only_new_variables_every_update_period():
    learner_net, actor_net = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    source = CountingSource(learner_net)
    client = VariableClient(source, actor_net, update_period=3)
    client.update(wait=True)
    assert source.fetches == 1 and torch.equal(actor_net.weight, learner_net.weight)
    for _ in range(6):
        client.update()  # the version has not moved: nothing is fetched
    assert source.fetches == 1
    with torch.no_grad():
        learner_net.weight.add_(1.0)
    source.version += 1
    client.update()
    client.update()
    assert source.fetches == 1  # two calls: the period (3) has not passed
    client.update()
    assert source.fetches == 2 and torch.equal(actor_net.weight, learner_net.weight)


def test_waiting_for_variables_fetches_even_at_the_same_version():
    """After a checkpoint is loaded the version may be unchanged (a learner that never stepped)
    while the parameters are not: update(wait=True) must fetch."""
    learner_net, actor_net = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    source = CountingSource(learner_net)
    client = VariableClient(source, actor_net)
    client.update(wait=True)
    with torch.no_grad():
        learner_net.weight.add_(1.0)  # loaded from a checkpoint: same version (0)
    client.update(wait=True)
    assert torch.equal(actor_net.weight, learner_net.weight)


def test_a_reused_buffer_starts_without_a_stale_reset():
    fields = rollout_layout(envs.spec_for("CartPole-v1"), {})
    buffer = allocate_rollout(fields, 4, 2)
    buffer["reset"][0] = True  # left by the previous writer (a killed actor's slot)
    RolloutWriter(buffer, on_full=lambda full: full)
    assert not buffer["reset"][0].any()


def test_variable_client_never_copies_a_modules_own_tensors_onto_themselves(monkeypatch):
    import rlherd.core

    net, other = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    copied = []
    monkeypatch.setattr(rlherd.core, "copy_tensors", lambda dst, src: copied.append(len(dst)))
    VariableClient(CountingSource(other), net).update(wait=True)
    assert copied == [2]  # another module's tensors are copied: the hook sees copies
    copied.clear()
    source = CountingSource(net)
    VariableClient(source, net).update(wait=True)
    assert source.fetches == 1 and copied == []


def test_variable_client_names_what_differs_between_modules():
    client = VariableClient(CountingSource(torch.nn.Linear(2, 3)), torch.nn.Linear(2, 2))
    with pytest.raises(RuntimeError, match="size mismatch for weight"):
        client.update(wait=True)
