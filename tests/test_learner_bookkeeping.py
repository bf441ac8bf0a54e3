"""What each learner and actor does besides its loss, each against a reference computed here:
target copies, priorities written back, importance weights and their schedule, learning-rate
and entropy schedules, gradient clipping, epochs and minibatches, recurrent state at episode
starts, action masks and bounds when acting, evaluation seeds, and MCTS's temperature and
terminal values."""

import copy
import math
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import random_transitions
from test_dqn import transition_batch as dqn_batch
from test_r2d2 import batch as r2d2_batch

from rlherd import envs as rl_envs
from rlherd import types as F
from rlherd.agents import BUILDERS
from rlherd.commands.train import resolve_config
from rlherd.replay import ReplaySample

REACH = "rlherd/Reach-v0"


def _builder(agent, env_id, **overrides):
    config, _ = resolve_config(agent, env_id, None, overrides)
    return BUILDERS[agent](config), rl_envs.spec_for(env_id)


def _learner(agent, env_id, steps=64, **overrides):
    builder, spec = _builder(agent, env_id, **overrides)
    offline = dict(dataset_size=steps) if agent in ("crr", "cql", "bc") else {}
    tables = random_transitions(builder, env_id, steps, **offline)
    torch.manual_seed(0)
    net = builder.make_networks(spec)
    return builder.make_learner(net, builder.make_dataset(tables), 1_000, tables)


R2D2_SMALL = dict(burn_in=3, trace_length=5, sequence_period=4, batch_size=4, replay_size=200,
                  min_replay_size=8, lstm_size=8, head_size=8, hidden_sizes=(8,))  # fmt: skip


class _PriorityTable:
    """Stands in for a replay table: records what a learner writes back."""

    insert_count = 123

    def __init__(self):
        self.written = []

    def update_priorities(self, keys, priorities):
        self.written.append((np.array(keys), np.array(priorities)))


def _state(module):
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def _equal(a, b, skip=("atoms",)):
    return all(torch.equal(a[k], b[k]) for k in a if not k.endswith(skip))


# ===================================================================== 1. learners
def _dqn_learner(period):
    from rlherd.agents.dqn.config import DQNConfig
    from rlherd.agents.dqn.learning import DQNLearner
    from rlherd.agents.dqn.networks import QNetwork

    spec = rl_envs.spec_for("CartPole-v1")
    config = DQNConfig(target_update_period=period, hidden_sizes=(16,), learning_rate=1e-2)
    torch.manual_seed(0)
    learner = DQNLearner(QNetwork(spec, config), config, 1000, None, None)
    batches = (ReplaySample(dqn_batch(spec, seed=s), None, None) for s in range(100))
    return learner, lambda: learner.learn(next(batches))


def _r2d2_learner(period):
    from rlherd.agents.r2d2 import R2D2Builder, R2D2Config
    from rlherd.agents.r2d2.learning import R2D2Learner

    spec = rl_envs.spec_for("rlherd/MaskedCartPole-v1")
    config = R2D2Config(**R2D2_SMALL, target_update_period=period)
    torch.manual_seed(0)
    learner = R2D2Learner(R2D2Builder(config).make_networks(spec), config, None, None)
    batches = (ReplaySample(r2d2_batch(spec, config, [False, True, False], seed=s), None, None)
               for s in range(100))  # fmt: skip
    return learner, lambda: learner.learn(next(batches))


def _replay_learner(agent, env_id):
    def make(period):
        learner = _learner(agent, env_id, batch_size=8, target_update_period=period)
        return learner, learner.step

    return make


@pytest.mark.parametrize("make", [_dqn_learner, _r2d2_learner, _replay_learner("crr", REACH),
                                  _replay_learner("cql", "rlherd/Corridor-v0")],
                         ids=["dqn", "r2d2", "crr", "cql-discrete"])  # fmt: skip
def test_targets_are_copied_after_every_target_update_period_th_step_and_only_then(make):
    """DQN, R2D2, CRR and discrete CQL copy the online network into the target after their
    ``target_update_period``-th step, every that many steps, and at no other step."""
    learner, step = make(3)
    for k in range(1, 8):
        before = _state(learner.target_net)
        step()
        now = _state(learner.target_net)
        if k % 3 == 0:
            assert _equal(_state(learner.net), now), k  # copied: the network as it is now
        else:
            assert _equal(before, now), k  # untouched between copies


def test_dqn_writes_back_the_absolute_td_errors_plus_eps_as_priorities():
    """Prioritised replay learns from what the learner writes back: |TD error| + eps per item."""
    from rlherd.agents.dqn.config import DQNConfig
    from rlherd.agents.dqn.learning import DQNLearner, dqn_loss
    from rlherd.agents.dqn.networks import QNetwork

    spec = rl_envs.spec_for("CartPole-v1")
    config = DQNConfig(prioritized=True, priority_eps=1e-3, hidden_sizes=(16,))
    table = _PriorityTable()
    learner = DQNLearner(QNetwork(spec, config), config, 1000, None, table)
    data, keys = dqn_batch(spec), np.arange(16) * 7 + 3
    with torch.no_grad():
        _, td = dqn_loss(learner.net, learner.target_net, data, None, config)
    learner.learn(ReplaySample(data, SimpleNamespace(keys=keys), torch.ones(16)))
    assert len(table.written) == 1
    written_keys, priorities = table.written[0]
    np.testing.assert_array_equal(written_keys, keys)
    np.testing.assert_allclose(priorities, td.abs().double().numpy() + 1e-3, rtol=1e-6)
    assert learner.net.experience.item() == table.insert_count


def test_r2d2_writes_back_each_sequences_priority():
    """Each sequence's priority (R2D2's mix of max and mean |TD error|) goes back to its key."""
    from rlherd.agents.r2d2 import R2D2Builder, R2D2Config
    from rlherd.agents.r2d2.learning import R2D2Learner, r2d2_loss

    spec = rl_envs.spec_for("rlherd/MaskedCartPole-v1")
    config = R2D2Config(**R2D2_SMALL)
    table = _PriorityTable()
    learner = R2D2Learner(R2D2Builder(config).make_networks(spec), config, None, table)
    data, keys = r2d2_batch(spec, config, [False, True, False]), np.array([5, 9, 2])
    with torch.no_grad():
        _, expected, _ = r2d2_loss(learner.net, learner.target_net, data, None, config)
    learner.learn(ReplaySample(data, SimpleNamespace(keys=keys), None))
    assert len(table.written) == 1
    np.testing.assert_array_equal(table.written[0][0], keys)
    np.testing.assert_allclose(table.written[0][1], expected.double().numpy(), rtol=1e-5)


def test_dqn_importance_beta_rises_linearly_from_its_start_to_one():
    """The importance exponent anneals from its start to 1 over the run (PER's schedule)."""
    from rlherd.agents.dqn.config import DQNConfig
    from rlherd.agents.dqn.learning import DQNLearner
    from rlherd.agents.dqn.networks import QNetwork

    spec = rl_envs.spec_for("CartPole-v1")
    config = DQNConfig(importance_beta=0.4, hidden_sizes=(8,))
    learner = DQNLearner(QNetwork(spec, config), config, 10_000, None, None)
    n = learner.expected_steps
    assert n == int(10_000 * config.replay_ratio / config.batch_size)
    got = []
    for steps in (0, n // 2, n, 3 * n):
        learner.num_steps = steps
        got.append(learner.importance_beta())
    assert got == pytest.approx([0.4, 0.4 + 0.6 * (n // 2) / n, 1.0, 1.0])


def test_r2d2_importance_weights_scale_each_sequences_loss():
    """A sequence's importance weight multiplies its loss."""
    from rlherd.agents.r2d2 import R2D2Builder, R2D2Config
    from rlherd.agents.r2d2.learning import r2d2_loss

    spec = rl_envs.spec_for("rlherd/MaskedCartPole-v1")
    config = R2D2Config(**R2D2_SMALL)
    builder = R2D2Builder(config)
    net, target = builder.make_networks(spec), builder.make_networks(spec)
    data = r2d2_batch(spec, config, [False, True, False])
    weights = torch.tensor([0.2, 1.0, 0.5])
    loss, _, td = r2d2_loss(net, target, data, weights, config)
    per_sequence = 0.5 * td.square().sum(0)
    assert loss.item() == pytest.approx((weights * per_sequence).mean().item(), rel=1e-5)
    assert loss.item() != pytest.approx(per_sequence.mean().item(), rel=1e-3)


def test_burn_in_changes_no_number_of_the_rows_learned_from():
    """Splitting the unroll at the burn-in must not change the online network's values: both
    halves start where the stored state says (not from zeros)."""
    from rlherd.agents.r2d2 import R2D2Builder, R2D2Config
    from rlherd.agents.r2d2.learning import r2d2_loss

    spec = rl_envs.spec_for("rlherd/MaskedCartPole-v1")
    burned = R2D2Config(**R2D2_SMALL)
    plain = R2D2Config(**{**R2D2_SMALL, "burn_in": 0, "trace_length": 8})
    assert burned.sequence_length == plain.sequence_length
    builder = R2D2Builder(burned)
    torch.manual_seed(0)
    net, target = builder.make_networks(spec), builder.make_networks(spec)
    data = r2d2_batch(spec, burned, [False, False, False])
    _, _, td_burned = r2d2_loss(net, target, data, None, burned)
    _, _, td_plain = r2d2_loss(net, target, data, None, plain)
    torch.testing.assert_close(td_burned[3:], td_plain[3:])
    assert (td_burned[3:-1] != 0).all()


def _impala_rollouts(num_envs=2, T=5, rollouts=8, **config):
    """The IMPALA actor stepping Corridor (episodes of at most 4 steps and a reset row) into a
    queue, as tests/test_acting.py's ``run_actor``."""
    from rlherd.agents.impala import ImpalaBuilder, ImpalaConfig
    from rlherd.replay.rollouts import RolloutQueue, allocate_rollout, rollout_layout
    from rlherd.run.loop import EnvironmentLoop

    vec = rl_envs.make_vector("rlherd/Corridor-v0", num_envs, length=3, max_steps=4)
    spec = rl_envs.spec_of(vec, "rlherd/Corridor-v0")
    config = ImpalaConfig(hidden_sizes=(8,), use_lstm=True, lstm_size=4, unroll_length=T,
                          **config)  # fmt: skip
    builder = ImpalaBuilder(config)
    torch.manual_seed(0)
    net = builder.make_networks(spec)
    policy = builder.make_policy(net)
    layout = rollout_layout(spec, builder.rollout_fields(spec))
    queue = RolloutQueue(allocate_rollout(layout, T, num_envs, policy.initial_state(num_envs)))
    actor = builder.make_actor(0, policy, spec, queue, None)
    EnvironmentLoop(vec, actor, seed=0).run(rollouts * T + 1)
    return [queue.queue.popleft() for _ in range(rollouts)], net, config


def test_impala_loss_on_the_actors_own_rollouts_finds_every_importance_ratio_one():
    """With the parameters the actor acted with, the learner recomputes the behaviour policy
    exactly, across episode ends and at rollouts that begin an episode, so every rho is 1: the
    learner resets the LSTM state on the row after an episode's final observation, and a
    rollout that begins an episode stores a zero state."""
    from rlherd.agents.impala.learning import impala_loss
    from rlherd.replay.rollouts import core_state_of

    rollouts, net, config = _impala_rollouts()
    begins = [r for prev, r in zip(rollouts, rollouts[1:], strict=False)
              if prev["reset"][-2].any()]  # fmt: skip
    assert begins, "some rollout must begin an episode"
    assert all(r["reset"][1:-1].any() for r in rollouts[:3])
    for r in rollouts:
        with torch.no_grad():
            _, metrics = impala_loss(net, r, core_state_of(r), config)
        assert metrics["mean_rho"].item() == pytest.approx(1.0, abs=1e-5)


def test_impala_learning_rate_decays_linearly_with_the_steps_consumed():
    """IMPALA's learning rate falls linearly to 0 over the run's steps (the paper's schedule)."""
    from rlherd.agents.impala.learning import ImpalaLearner

    rollouts, net, config = _impala_rollouts(rollouts=2, lr_decay=True, learning_rate=1e-3)
    T, B = 5, 2
    learner = ImpalaLearner(net, config, 4 * T * B, iter(rollouts))
    first, second = learner.step(), learner.step()
    assert first["learning_rate"] == pytest.approx(1e-3)
    assert second["learning_rate"] == pytest.approx(0.75e-3)
    assert learner.consumed_steps == 2 * T * B
    assert learner.optimizer.param_groups[0]["lr"] == pytest.approx(0.75e-3)


def _watch_grad_norms(optimizer, params, seen):
    step = optimizer.step

    def watched(*args, **kwargs):
        norms = [p.grad.norm() for p in params if p.grad is not None]
        seen.append(torch.linalg.vector_norm(torch.stack(norms)).item())
        return step(*args, **kwargs)

    optimizer.step = watched


def _ppo_rollout(T=6, B=5, seed=0, continuous=True):
    g = torch.Generator().manual_seed(seed)
    return {
        F.OBS: torch.randn(T + 1, B, 3, generator=g),
        F.ACTION: torch.randn(T + 1, B, 1, generator=g),
        F.BEHAVIOUR_LOG_PROB: torch.randn(T + 1, B, generator=g) * 0.1 - 1.0,
        F.POLICY_PARAMS: torch.zeros(T + 1, B, 2),
        F.BASELINE: torch.randn(T + 1, B, generator=g),
        F.REWARD: torch.randn(T + 1, B, generator=g) * 10,
        F.TERMINATED: torch.rand(T + 1, B, generator=g) < 0.1,
        F.TRUNCATED: torch.zeros(T + 1, B, dtype=torch.bool),
        F.RESET: torch.rand(T + 1, B, generator=g) < 0.1,
    }


def _ppo_learner(rollouts, total_steps=1000, **overrides):
    from rlherd.agents.ppo.config import PPOConfig
    from rlherd.agents.ppo.learning import PPOLearner
    from rlherd.agents.ppo.networks import PPONet

    torch.manual_seed(0)
    config = PPOConfig(**overrides)
    net = PPONet(rl_envs.spec_for("Pendulum-v1"), config)
    return PPOLearner(net, config, total_steps, dataset=iter(rollouts))


@pytest.mark.parametrize("agent", ["impala", "ppo", "d4pg"])
def test_the_optimiser_sees_gradients_clipped_to_the_configured_norm(agent):
    """The optimiser steps on gradients clipped to the configured global norm."""
    clip, seen = 1e-3, []
    if agent == "impala":
        from rlherd.agents.impala.learning import ImpalaLearner

        rollouts, net, config = _impala_rollouts(rollouts=2, grad_norm_clip=clip)
        learner = ImpalaLearner(net, config, 10_000, iter(rollouts))
        _watch_grad_norms(learner.optimizer, list(net.parameters()), seen)
        learner.step()
    elif agent == "ppo":
        learner = _ppo_learner([_ppo_rollout()], max_grad_norm=clip, epochs=2, minibatches=2)
        _watch_grad_norms(learner.optimizer, list(learner.net.parameters()), seen)
        learner.step()
    else:
        learner = _learner("d4pg", "Pendulum-v1", batch_size=8, min_replay_size=8,
                           grad_norm_clip=clip)  # fmt: skip
        _watch_grad_norms(learner.critic_optimizer, learner.critic_params, seen)
        _watch_grad_norms(learner.policy_optimizer, learner.policy_params, seen)
        learner.step()
    assert seen and all(n <= clip * (1 + 1e-4) for n in seen), seen


def test_ppo_runs_epochs_passes_of_minibatches_over_every_valid_row():
    """PPO makes ``epochs`` passes, each of ``minibatches`` minibatches over every valid row."""
    learner = _ppo_learner([_ppo_rollout(T=8, B=5)], epochs=3, minibatches=4)
    sizes, update = [], learner._update

    def counted(mb, clip):
        sizes.append(len(mb["advantage"]))
        return update(mb, clip)

    learner._update = counted
    metrics = learner.step()
    n = metrics["valid_rows"]
    assert len(sizes) == 3 * 4
    assert sizes[:4] == [math.ceil(n / 4)] * 3 + [n - 3 * math.ceil(n / 4)]
    assert sum(sizes) == 3 * n


def test_ppo_learning_rate_and_entropy_cost_follow_their_schedules():
    """The learning rate anneals to 0; the entropy cost runs from its start to its final one."""
    T, B = 6, 5
    learner = _ppo_learner([_ppo_rollout(seed=s) for s in range(2)], total_steps=4 * T * B,
                           learning_rate=1e-3, lr_anneal=True, entropy_cost=0.1,
                           entropy_cost_final=0.02, epochs=1, minibatches=1)  # fmt: skip
    first, second = learner.step(), learner.step()
    assert first["learning_rate"] == pytest.approx(1e-3)
    assert first["entropy_cost"] == pytest.approx(0.1)
    assert second["learning_rate"] == pytest.approx(0.75e-3)
    assert second["entropy_cost"] == pytest.approx(0.02 + 0.08 * 0.75)


def test_ppo_normalises_each_minibatchs_advantages():
    """Each minibatch's advantages are normalised to mean 0 and standard deviation 1."""
    learner = _ppo_learner([_ppo_rollout(T=8, B=5)], epochs=1, minibatches=2,
                           normalize_advantages=True)  # fmt: skip
    seen, loss = [], learner._loss

    def watched(mb, clip):
        seen.append(mb["advantage"].detach().clone())
        return loss(mb, clip)

    learner._loss = watched
    learner.step()
    assert len(seen) == 2
    for adv in seen:
        assert adv.mean().item() == pytest.approx(0.0, abs=1e-5)
        assert adv.std().item() == pytest.approx(1.0, rel=1e-4)


def test_td3_critic_target_is_the_smaller_target_critic_at_the_clipped_smoothed_action():
    """The learner's critic target is the smaller target critic at the target policy's action
    plus clipped noise: recomputed from the same draws, the critics' gradients are the
    learner's."""
    from rlherd.losses.actor_critic import smoothed_target_action, twin_critic_loss

    learner = _learner("td3", REACH, batch_size=16, min_replay_size=16, policy_noise=1.0,
                       noise_clip=0.1)  # fmt: skip
    learner.step()
    net, target = copy.deepcopy(learner.net), copy.deepcopy(learner.target_net)
    sample = next(learner.dataset)
    torch.manual_seed(7)
    learner.learn(sample)
    torch.manual_seed(7)
    d = sample.data
    obs, next_obs = F.obs_of(d, "obs"), F.obs_of(d, "next_obs")
    with torch.no_grad():
        mu = target.policy(next_obs)
        raw = torch.randn_like(mu)
        assert (raw.abs() > 0.1).any()  # some noise is clipped
        a = smoothed_target_action(mu, 1.0 * raw, 0.1)
        y = d["reward"] + d["discount"] * torch.min(target.q1(next_obs, a), target.q2(next_obs, a))
    action = net.from_env(d["action"])
    twin_critic_loss(net.q1(obs, action), net.q2(obs, action), y, 1.0).backward()  # summed
    for (name, p), q in zip(learner.net.named_parameters(), net.parameters(), strict=True):
        if name.startswith("q"):
            torch.testing.assert_close(p.grad, q.grad, msg=name)


def test_mpo_multipliers_are_floored_after_each_step():
    """The raw dual multipliers are floored after each step, as Acme's MPO floors them."""
    from rlherd.losses.mpo import MIN_RAW_MULTIPLIER

    learner = _learner("mpo", "Pendulum-v1", batch_size=8, min_replay_size=8)
    with torch.no_grad():
        for raw in learner.duals.values():
            raw.fill_(-50.0)
    learner.step()
    for name, raw in learner.duals.items():
        assert (raw >= MIN_RAW_MULTIPLIER).all(), name


def test_continuous_cql_clones_the_data_for_num_bc_iters_steps_then_follows_the_critics():
    """CQL's policy clones the dataset for ``num_bc_iters`` steps, then follows the critics."""
    from rlherd.networks.continuous import tanh_gaussian_log_prob, tanh_gaussian_sample

    learner = _learner("cql", REACH, batch_size=8, num_bc_iters=2)
    d = next(learner.dataset).data
    obs, data_action = F.obs_of(d, "obs"), learner.net.from_env(d["action"])
    with torch.no_grad():
        mean, log_std = learner.net.policy(obs)
        action, _ = tanh_gaussian_sample(mean, log_std)
        clone = tanh_gaussian_log_prob(mean, log_std, data_action)
        critic = torch.min(learner.net.q1(obs, action), learner.net.q2(obs, action))
        for steps, expected in ((0, clone), (1, clone), (2, critic), (5, critic)):
            learner.num_steps = steps
            got = learner.policy_value(obs, action, mean, log_std, data_action)
            torch.testing.assert_close(got, expected, msg=str(steps))


# ===================================================================== 2. acting
def test_r2d2_stores_a_zero_state_for_every_sequence_that_begins_an_episode():
    """Not only the run's first episode: every later one starts from zero too, in what the
    actor stores as well as in what it acts with."""
    from rlherd.agents.r2d2 import R2D2Builder, R2D2Config
    from rlherd.run.loop import EnvironmentLoop

    env_id = "rlherd/Corridor-v0"
    vec = rl_envs.make_vector(env_id, 1, length=6, max_steps=8)
    spec = rl_envs.spec_of(vec, env_id)
    builder = R2D2Builder(R2D2Config(**{**R2D2_SMALL, "burn_in": 1, "trace_length": 2,
                                         "sequence_period": 2}))  # fmt: skip
    (table,) = builder.make_replay_tables(spec, dataset_size=500)
    torch.manual_seed(0)
    net = builder.make_networks(spec)
    actor = builder.make_actor(0, builder.make_policy(net), spec, builder.make_adder([table], 1),
                               None)  # fmt: skip
    EnvironmentLoop(vec, actor, seed=0).run(80)
    items = table.sample(400).data
    starts = items["first"][:, 0].astype(bool)
    assert table.size > 10 and 2 <= starts.sum() < len(starts)
    h, c = items["core_h"], items["core_c"]
    assert np.abs(h[starts]).sum() == 0 and np.abs(c[starts]).sum() == 0
    assert np.abs(h[~starts]).sum() > 0  # mid-episode sequences carry a state


def test_r2d2_draws_each_episodes_epsilon_from_the_set():
    """Each episode draws its own epsilon from the actor's set (R2D2's per-actor exploration)."""
    from rlherd.agents.r2d2 import R2D2Builder, R2D2Config
    from rlherd.agents.r2d2.acting import R2D2Actor, epsilon_set

    spec = rl_envs.spec_for("rlherd/MaskedCartPole-v1")
    builder = R2D2Builder(R2D2Config(**R2D2_SMALL))
    epsilons = epsilon_set(8)
    actor = R2D2Actor(builder.make_policy(builder.make_networks(spec)), None, epsilons, seed=0)
    obs = np.zeros((64, *spec.obs_shape), np.float32)
    actor.observe_first(obs, np.ones(64, dtype=bool))
    drawn = set(actor.epsilon.tolist())
    assert drawn <= set(epsilons.tolist()) and len(drawn) == 8
    before = actor.epsilon.copy()
    again = np.arange(64) < 32
    actor.observe_first(obs, again)  # new episodes in half of the environments draw anew
    np.testing.assert_array_equal(actor.epsilon[~again], before[~again])
    assert (actor.epsilon[again] != before[again]).any()


class _FixedScores(torch.nn.Module):
    def __init__(self, scores):
        super().__init__()
        self.scores = torch.nn.Parameter(torch.tensor(scores))

    def forward(self, obs):
        return self.scores.expand(F.obs_len(obs), -1)


@pytest.mark.parametrize("greedy", [True, False])
def test_categorical_policy_acts_only_among_legal_actions(greedy):
    """BC's and discrete CQL's policy acts only among the legal actions, greedy or sampling."""
    from rlherd.agents.acting import CategoricalPolicy

    policy = CategoricalPolicy(_FixedScores([10.0, 0.0, 10.0, 0.0]), greedy=greedy)
    mask = np.tile(np.array([0, 1, 0, 1], np.int8), (256, 1))
    obs = {"obs": torch.zeros(256, 2), "action_mask": torch.as_tensor(mask)}
    action = policy(obs, None, (), torch.Generator().manual_seed(0))[0][F.ACTION]
    assert set(action.tolist()) <= {1, 3}
    if not greedy:
        assert set(action.tolist()) == {1, 3}


def test_ppo_actor_clips_gaussian_actions_to_the_box_for_the_environment():
    """The environment gets PPO's Gaussian sample clipped to the action box; the learner gets the
    sample itself."""
    from rlherd.agents.ppo.acting import PPOActor
    from rlherd.agents.ppo.config import PPOConfig

    spec = rl_envs.spec_for("Pendulum-v1")  # [-2, 2]
    actor = PPOActor(SimpleNamespace(device=torch.device("cpu")), None, 0, None, spec,
                     PPOConfig())  # fmt: skip
    out = actor.env_action(torch.tensor([[5.0], [-3.0], [0.5]]))
    np.testing.assert_allclose(out[:, 0], [2.0, -2.0, 0.5])


# ============================================================ 3. evaluation, MCTS search
class _SeedLog(gym.Env):
    observation_space = gym.spaces.Box(0.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self):
        self.seeds = []

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.seeds.append(seed)
        return np.zeros(1, np.float32), {}

    def step(self, action):
        return np.zeros(1, np.float32), 1.0, True, False, {}


class _FirstAction:
    def observe_first(self, obs, first):
        pass

    def select_action(self, obs):
        return np.zeros(len(obs), np.int64)


def test_evaluation_episode_i_is_seeded_seed_plus_i():
    """Evaluation episode i is reset with seed + i: every run plays the same distinct episodes."""
    from rlherd.run.evaluation import EVAL_SEED, run_episodes

    env = _SeedLog()
    returns, lengths, _ = run_episodes(env, _FirstAction(), 4, EVAL_SEED)
    assert env.seeds == [EVAL_SEED + i for i in range(4)]
    assert returns == [1.0] * 4 and lengths == [1] * 4


class _Rhythm:
    """A policy with a state per row: it pushes one way for ``2 + (first observation's sign)``
    steps of each episode, then the other. A row that began its episode at the wrong step, or
    kept another row's count, plays a different episode."""

    def observe_first(self, obs, first):
        if not hasattr(self, "count"):
            self.count, self.lean = np.zeros(len(obs), np.int64), np.zeros(len(obs), np.int64)
        self.count[first] = 0
        self.lean[first] = 2 + (obs[first, 2] > 0)

    def select_action(self, obs):
        self.count += 1
        return (self.count > self.lean).astype(np.int64)


@pytest.mark.parametrize("copies", [2, 3, 16])
def test_episodes_played_at_once_are_the_episodes_played_one_at_a_time(copies):
    """An evaluation plays its episodes in several copies of the environment at once; episode i
    is still seeded seed + i, played from its own first step, cut at the step limit, and
    reported in its place, whichever copy played it and however long the others' were."""
    from rlherd.run import evaluation
    from rlherd.run.evaluation import EVAL_SEED, run_episodes

    def cartpoles(n):
        return [gym.make("CartPole-v1") for _ in range(n)]

    alone = run_episodes(cartpoles(1), _Rhythm(), 9, EVAL_SEED)
    together = run_episodes(cartpoles(copies), _Rhythm(), 9, EVAL_SEED)
    assert together == alone and len(set(alone[1])) > 3  # episodes of several lengths
    lengths = np.array(alone[1])
    with pytest.MonkeyPatch.context() as patch:  # the cut, reached in some copies and not others
        patch.setattr(evaluation, "MAX_EPISODE_STEPS", int(np.median(lengths)))
        cut = run_episodes(cartpoles(copies), _Rhythm(), 9, EVAL_SEED)
    assert cut[1] == np.minimum(lengths, int(np.median(lengths))).tolist()


def test_visit_policy_sharpens_below_temperature_one_and_flattens_above():
    """``N ** (1 / temperature)``: below 1 the visit policy sharpens, above 1 it flattens."""
    from rlherd.agents.mcts.search import Tree, visit_policy

    tree = Tree(1, 4, 3)
    tree.children[0] = [1, 2, 3]
    tree.visits[1:4] = [1, 3, 0]
    np.testing.assert_allclose(visit_policy(tree, 1.0)[0], [0.25, 0.75, 0.0])
    np.testing.assert_allclose(visit_policy(tree, 0.5)[0], [0.1, 0.9, 0.0])
    np.testing.assert_allclose(visit_policy(tree, 2.0)[0], [1 / (1 + 3**0.5), 3**0.5 / (1 + 3**0.5),
                                                            0.0])  # fmt: skip


class _Bandit:
    """A model of one step: action a pays reward[a] and ends the episode (terminal)."""

    def __init__(self, rewards, terminal=True):
        self.rewards, self.terminal = np.asarray(rewards, np.float64), terminal

    def step(self, states, actions):
        from rlherd.agents.mcts.search import ModelStep

        k = len(actions)
        return ModelStep(list(states), np.zeros((k, 1), np.float32), self.rewards[actions],
                         np.full(k, self.terminal), np.full(k, not self.terminal), None)

    # what MCTSActor asks of a model
    def roots(self, live, obs):
        return [None] * len(live), None

    def after_search(self, roots):
        pass

    def bind(self, envs):
        pass


def test_a_terminal_states_value_is_zero_whatever_the_network_says():
    """A terminal state backs up 0, whatever the network says; a truncated one keeps its value."""
    from rlherd.agents.mcts.search import SearchSettings, search

    def evaluate(obs):  # uniform priors, every state worth 100
        return np.zeros((len(obs), 2)), np.full(len(obs), 100.0)

    settings = SearchSettings(num_simulations=6, discount=0.5, puct_c=1000.0)
    obs = np.zeros((1, 1), np.float32)
    for terminal, worth in ((True, 0.0), (False, 100.0)):
        tree = search([None], obs, None, _Bandit([1.0, 2.0], terminal), evaluate, settings,
                      np.random.default_rng(0))  # fmt: skip
        children = tree.children[0]
        assert (tree.visits[children] > 0).all()
        np.testing.assert_allclose(tree.value(children), [worth, worth])
        expected_root = (tree.visits[children] * (np.array([1.0, 2.0]) + 0.5 * worth)).sum()
        assert tree.value_sum[0] == pytest.approx(expected_root)


def test_mcts_actor_stores_the_temperature_one_visit_policy_whatever_it_acts_with(monkeypatch):
    """The learner's policy target is the search's own visit distribution; the acting
    temperature only shapes which action is played."""
    import rlherd.agents.mcts.acting as acting
    from rlherd.agents.mcts.search import SearchSettings, visit_policy

    trees, search = [], acting.search

    def kept(*args, **kwargs):
        trees.append(search(*args, **kwargs))
        return trees[-1]

    monkeypatch.setattr(acting, "search", kept)
    policy = SimpleNamespace(prior_and_value=lambda obs: (np.zeros((len(obs), 3)),
                                                          np.zeros(len(obs))))  # fmt: skip
    actor = acting.MCTSActor(policy, _Bandit([0.0, 1.0, 0.6]), SearchSettings(num_simulations=20),
                             0.25, None, 0, 3)  # fmt: skip
    actor.select_action(np.zeros((2, 1), np.float32))
    (tree,) = trees
    stored = actor.search_policy
    np.testing.assert_allclose(stored, visit_policy(tree, 1.0), rtol=1e-6)
    assert not np.allclose(stored, visit_policy(tree, 0.25))
