"""The rollout layout of rlherd.types, as the IMPALA actor writes it."""

import numpy as np
import torch

from rlherd import envs
from rlherd.agents.impala import ImpalaConfig
from rlherd.agents.impala.acting import ImpalaActor, allocate_rollout, rollout_fields
from rlherd.agents.impala.networks import ImpalaNet


def make_actor(num_envs=3, length=3, use_lstm=False):
    vec = envs.make_vector("rlherd/Corridor-v0", num_envs, length=length, max_steps=4)
    spec = envs.spec_of(vec, "rlherd/Corridor-v0")
    net = ImpalaNet(spec, ImpalaConfig(hidden_sizes=(8,), use_lstm=use_lstm, lstm_size=4))
    return ImpalaActor(net, vec, seed=0), spec


def test_rollouts_overlap_and_follow_the_autoreset_convention():
    actor, spec = make_actor()
    T = 7
    first, second = (allocate_rollout(rollout_fields(spec, 3, T)) for _ in range(2))
    actor.unroll(first)
    actor.unroll(second)
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


def test_episode_statistics_at_reset_rows():
    actor, spec = make_actor(num_envs=2, length=3)
    T = 40
    r = allocate_rollout(rollout_fields(spec, 2, T))
    actor.unroll(r)
    for b in range(2):
        ret, length = 0.0, 0
        for t in range(T):
            if r["reset"][t, b]:
                ret, length = 0.0, 0  # the autoreset step starts a new episode
                continue
            ret += r["reward"][t, b].item()
            length += 1
            if r["reset"][t + 1, b]:
                assert r["episode_return"][t + 1, b].item() == np.float32(ret)
                assert r["episode_length"][t + 1, b].item() == length
                assert length <= 4


def test_learner_recomputes_the_actors_outputs_across_episode_ends():
    """The learner zeroes the LSTM state exactly where the actor did, so with the same
    parameters it reproduces the behaviour logits of every row, across several episodes."""
    actor, spec = make_actor(num_envs=2, use_lstm=True)
    T = 12
    r = allocate_rollout(rollout_fields(spec, 2, T))
    for _ in range(2):
        state = actor.unroll(r)
        assert r["reset"][1:].any()
        first = torch.zeros_like(r["reset"])
        first[1:] = r["reset"][:-1]
        with torch.no_grad():
            out, _ = actor.net(r["obs"], first, state)
        torch.testing.assert_close(out["policy_logits"], r["policy_logits"])
        torch.testing.assert_close(out["baseline"], r["baseline"])
