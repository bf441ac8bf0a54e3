"""PPO and BatchPPO: losses against naive per-row code, the KL-penalty rule, distributions
against torch.distributions, the rollout queue, normalisers, resume, and learning CartPole."""

import csv
import math

import numpy as np
import pytest
import torch
from conftest import learn_to

import rlherd
from rlherd import types as F
from rlherd.agents.ppo.acting import RewardScaler
from rlherd.agents.ppo.config import PPOConfig
from rlherd.agents.ppo.learning import flatten_valid
from rlherd.agents.ppo.networks import PPONet
from rlherd.envs import spec_for
from rlherd.errors import ConfigError
from rlherd.losses.ppo import (
    adapt_kl_beta,
    clipped_surrogate_loss,
    kl_penalty_loss,
    normalize_advantages,
    value_loss,
)
from rlherd.networks.distributions import Categorical, DiagGaussian
from rlherd.replay.rollouts import RolloutQueue, allocate_rollout
from rlherd.run.rundir import RunDir


def _rows(n=50, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(n, generator=g, dtype=torch.float64) * 0.3,  # log prob
        torch.randn(n, generator=g, dtype=torch.float64) * 0.3,  # behaviour log prob
        torch.randn(n, generator=g, dtype=torch.float64),  # advantages
    )


def test_clipped_surrogate_against_a_loop():
    log_prob, behaviour, adv = _rows()
    clip = 0.2
    total, clipped_rows = 0.0, 0
    for lp, b, a in zip(log_prob.tolist(), behaviour.tolist(), adv.tolist(), strict=True):
        r = math.exp(lp - b)
        total += -min(r * a, min(max(r, 1 - clip), 1 + clip) * a)
        clipped_rows += abs(r - 1) > clip
    out = clipped_surrogate_loss(log_prob, behaviour, adv, clip)
    assert out.loss.item() == pytest.approx(total / len(adv), rel=1e-12)
    assert out.clip_fraction.item() == pytest.approx(clipped_rows / len(adv))
    assert 0 < clipped_rows < len(adv)  # both branches were exercised


def test_kl_penalty_loss_against_a_loop():
    log_prob, behaviour, adv = _rows(seed=1)
    kl = torch.rand(len(adv), generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    kl = kl * 0.05  # some rows beyond twice the target
    beta, target = 1.7, 0.01
    expected = 0.0
    for lp, b, a, k in zip(log_prob.tolist(), behaviour.tolist(), adv.tolist(), kl.tolist(),
                           strict=True):  # fmt: skip
        expected += -math.exp(lp - b) * a + beta * k
        if k > 2 * target:
            expected += 1000 * (k - 2 * target) ** 2
    got = kl_penalty_loss(log_prob, behaviour, adv, kl, beta, target, 2.0, 1000.0)
    assert got.item() == pytest.approx(expected / len(adv), rel=1e-12)


@pytest.mark.parametrize(
    "kl, expected",
    [
        (0.02, 1.5),  # above 1.3 x target: x1.5
        (0.0131, 1.5),
        (0.013, 1.0),  # exactly 1.3 x target: unchanged
        (0.01, 1.0),
        (0.007, 1.0),  # exactly 0.7 x target: unchanged
        (0.0069, 1 / 1.5),  # below 0.7 x target: /1.5
        (0.0, 1 / 1.5),
    ],
)
def test_kl_beta_adaptation_rule(kl, expected):
    assert adapt_kl_beta(1.0, kl, 0.01) == pytest.approx(expected)


def test_value_loss_clipping_against_a_loop():
    g = torch.Generator().manual_seed(3)
    values, returns, old = (torch.randn(40, generator=g, dtype=torch.float64) for _ in range(3))
    clip = 0.3
    expected = 0.0
    for v, r, o in zip(values.tolist(), returns.tolist(), old.tolist(), strict=True):
        vc = o + min(max(v - o, -clip), clip)
        expected += 0.5 * max((v - r) ** 2, (vc - r) ** 2)
    assert value_loss(values, returns, old, clip).item() == pytest.approx(expected / 40)
    plain = sum(0.5 * (v - r) ** 2 for v, r in zip(values.tolist(), returns.tolist(), strict=True))
    assert value_loss(values, returns).item() == pytest.approx(plain / 40)
    with pytest.raises(ValueError, match="behaviour_values"):
        value_loss(values, returns, None, clip)


def test_advantage_normalisation():
    a = torch.tensor([1.0, 2.0, 3.0, 6.0])
    n = normalize_advantages(a)
    assert n.mean().item() == pytest.approx(0.0, abs=1e-6)
    assert n.std().item() == pytest.approx(1.0, abs=1e-6)


def test_distributions_match_torch():
    g = torch.Generator().manual_seed(4)
    mean, log_std = torch.randn(6, 3, generator=g), torch.randn(6, 3, generator=g) * 0.5
    mean2, log_std2 = torch.randn(6, 3, generator=g), torch.randn(6, 3, generator=g) * 0.5
    p, q = torch.cat([mean, log_std], -1), torch.cat([mean2, log_std2], -1)
    ref_p = torch.distributions.Independent(torch.distributions.Normal(mean, log_std.exp()), 1)
    ref_q = torch.distributions.Independent(torch.distributions.Normal(mean2, log_std2.exp()), 1)
    action = torch.randn(6, 3, generator=g)
    torch.testing.assert_close(DiagGaussian.log_prob(p, action), ref_p.log_prob(action))
    torch.testing.assert_close(DiagGaussian.entropy(p), ref_p.entropy())
    torch.testing.assert_close(
        DiagGaussian.kl(p, q), torch.distributions.kl_divergence(ref_p, ref_q)
    )

    logits, logits2 = torch.randn(6, 4, generator=g), torch.randn(6, 4, generator=g)
    ref, ref2 = (
        torch.distributions.Categorical(logits=logits),
        torch.distributions.Categorical(logits=logits2),
    )
    a = torch.tensor([0, 1, 2, 3, 1, 0])
    torch.testing.assert_close(Categorical.log_prob(logits, a), ref.log_prob(a))
    torch.testing.assert_close(Categorical.entropy(logits), ref.entropy())
    torch.testing.assert_close(
        Categorical.kl(logits, logits2), torch.distributions.kl_divergence(ref, ref2)
    )


def test_gaussian_samples_have_the_policy_moments():
    params = torch.tensor([[0.5, -1.0, math.log(0.2), math.log(2.0)]]).expand(20000, 4)
    x = DiagGaussian.sample(params, torch.Generator().manual_seed(0))
    torch.testing.assert_close(x.mean(0), torch.tensor([0.5, -1.0]), atol=0.05, rtol=0)
    torch.testing.assert_close(x.std(0), torch.tensor([0.2, 2.0]), atol=0.05, rtol=0)


def _queue(T=3, B=2):
    fields = {
        F.OBS: ((1,), torch.float32),
        F.RESET: ((), torch.bool),
        F.BASELINE: ((), torch.float32),
        F.REWARD: ((), torch.float32),
        F.TERMINATED: ((), torch.bool),
        F.TRUNCATED: ((), torch.bool),
    }
    return RolloutQueue(allocate_rollout(fields, T, B))


def test_rollout_queue_rows_overlap_and_resets():
    q = _queue()
    no = torch.zeros(2, dtype=torch.bool)
    for t in range(7):
        q.add_row(obs=torch.full((2, 1), float(t)), baseline=torch.full((2,), float(t)))
        if t == 3:
            assert q.ready()
            first = next(q)
            assert not q.ready()
        q.add_outcome(torch.full((2,), 10.0 + t), torch.tensor([t == 1, False]), no)
    q.add_row(obs=torch.full((2, 1), 7.0), baseline=torch.full((2,), 7.0))
    second = next(q)
    assert first[F.OBS][:, 0, 0].tolist() == [0, 1, 2, 3]
    assert second[F.OBS][:, 0, 0].tolist() == [3, 4, 5, 6]  # row 3 is shared
    assert first[F.REWARD][:3, 0].tolist() == [10, 11, 12]
    # Env 0 terminated at row 1, so row 2 (its final observation) is an autoreset row.
    assert first[F.RESET][:, 0].tolist() == [False, False, True, False]
    assert not first[F.RESET][:, 1].any()
    with pytest.raises(ValueError, match="expected shape"):
        q.add_row(obs=torch.zeros(3, 1))
    with pytest.raises(RuntimeError, match="no full batch"):
        next(q)


def test_flatten_valid_drops_autoreset_rows_and_bootstraps_truncation():
    T, B = 3, 1
    rollout = {
        F.OBS: torch.arange(T + 1, dtype=torch.float32).view(T + 1, B, 1),
        F.ACTION: torch.zeros(T + 1, B, dtype=torch.int64),
        F.BEHAVIOUR_LOG_PROB: torch.zeros(T + 1, B),
        F.POLICY_PARAMS: torch.zeros(T + 1, B, 2),
        F.BASELINE: torch.tensor([[1.0], [5.0], [999.0], [2.0]]),
        F.REWARD: torch.tensor([[1.0], [999.0], [3.0], [0.0]]),
        F.TERMINATED: torch.zeros(T + 1, B, dtype=torch.bool),
        F.TRUNCATED: torch.tensor([[True], [False], [False], [False]]),
        F.RESET: torch.tensor([[False], [True], [False], [False]]),
    }
    config = PPOConfig(discount=0.9, gae_lambda=1.0)
    rows = flatten_valid(rollout, config)
    assert rows[F.OBS][:, 0].tolist() == [0.0, 2.0]  # row 1 (the autoreset step) is gone
    # Row 0 was truncated: its return bootstraps from V(final obs) = 5, and stops there.
    assert rows["return"].tolist() == pytest.approx([1.0 + 0.9 * 5.0, 3.0 + 0.9 * 2.0], abs=1e-4)
    assert rows["advantage"].tolist() == pytest.approx([1.0 + 4.5 - 1.0, 3.0 + 1.8 - 999.0])


def test_reward_scaler_against_numpy_over_the_stream():
    rng = np.random.default_rng(0)
    rewards = rng.normal(1.0, 2.0, size=(30, 3))
    skip = rng.random((30, 3)) < 0.1
    for mode in ("return", "reward"):
        scaler = RewardScaler(mode, 3, discount=0.9, clip=10.0)
        seen, ret = [], np.zeros(3)
        for r, s in zip(rewards, skip, strict=True):
            r = np.where(s, 0.0, r)
            out = scaler(torch.as_tensor(r), torch.as_tensor(s))
            ret = np.where(s, 0.0, ret * 0.9 + r)
            seen.extend((ret if mode == "return" else r)[~s].tolist())
            expected = np.clip(r / np.sqrt(np.var(seen) + 1e-8), -10, 10)
            np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5)


def test_batchppo_network_and_optimisers_are_separate():
    spec = spec_for("Pendulum-v1")
    net = PPONet(spec, PPOConfig(**rlherd.agents.ppo.config.PRESETS["batchppo"]))
    policy, value = set(map(id, net.policy_parameters())), set(map(id, net.value_parameters()))
    assert policy and value and not policy & value
    assert policy | value == set(map(id, net.parameters()))
    assert [m.out_features for m in net.policy_torso.modules() if hasattr(m, "out_features")] == [
        200,
        100,
    ]
    x = torch.randn(5, 3) * 100
    params, _ = net(x)
    assert params[:, :1].abs().max() <= 1.0  # the tanh on the action mean
    assert params[0, 1].exp().item() == pytest.approx(0.35, rel=1e-3)


def test_config_errors_are_clear(tmp_path):
    with pytest.raises(ValueError, match="objective"):
        PPOConfig(objective="trpo")
    with pytest.raises(ValueError, match="shared network"):
        PPOConfig(shared_network=True, value_learning_rate=1e-3)
    # The device acts with the policy alone; reward scaling is done by the actor.
    with pytest.raises(ConfigError, match="reward_scaling happens in its actor"):
        rlherd.train("ppo", "CartPole-v1", runtime="device", reward_scaling="return",
                     run_dir=tmp_path / "run", progress=False)  # fmt: skip
    assert not (tmp_path / "run").exists()
    with pytest.raises(ConfigError, match="reward_scaling happens in its actor"):  # per policy too
        rlherd.train("ppo", "tag-gridworld", runtime="device", run_dir=tmp_path / "run",
                     policy_overrides={"runner": {"reward_scaling": "reward"}},
                     total_steps=1_000, progress=False)  # fmt: skip


def test_batchppo_learns_on_the_corridor_and_adapts_beta(tmp_path):
    """The KL objective with separate optimisers and full-batch epochs solves a small task, and
    its penalty weight moves."""
    run = rlherd.train(
        "ppo", "rlherd/Corridor-v0", preset="toy", total_steps=6_000, seed=0,
        run_dir=tmp_path, progress=False, objective="kl", minibatches=1,
        value_learning_rate=1e-2, learning_rate=1e-2, normalize_obs=True,
        reward_scaling="reward", log_interval_s=0.0,  # a learner row at every step
    )  # fmt: skip
    assert run.summary["final_return_mean"] >= 0.9  # optimal 0.95
    with open(tmp_path / "metrics" / "learner.csv") as f:
        betas = [float(row["kl_beta"]) for row in csv.DictReader(f)]
    assert len(set(betas)) > 1


@pytest.mark.parametrize("env_id", ["rlherd/Bandit-v0", "rlherd/Corridor-v0"])
def test_tiny_environments_are_solved(env_id, tmp_path):
    run = rlherd.train("ppo", env_id, total_steps=8_000, seed=1, run_dir=tmp_path, progress=False)
    assert run.summary["final_return_mean"] >= 0.9


def test_interrupt_then_resume_continues_exactly(interrupt_at, tmp_path):
    """Rollout queue, observation statistics, reward scale, optimiser, environments and RNGs are
    in the checkpoint: a resumed run ends exactly where an uninterrupted one does. (Ctrl-C comes
    at 1,500 steps, two learner steps in, with Adam's moments and the statistics behind it and
    a rollout part-filled; the 2,500 steps after it are five learner steps and a dozen
    episodes, which any state not restored sends elsewhere.)"""
    kw = dict(
        total_steps=4_000, seed=3, progress=False, num_envs=2, unroll_length=64,
        normalize_obs=True, reward_scaling="return",
    )  # fmt: skip
    straight = rlherd.train("ppo", "Pendulum-v1", run_dir=tmp_path / "a", **kw)
    interrupt_at(1_500)
    stopped = rlherd.train("ppo", "Pendulum-v1", run_dir=tmp_path / "b", **kw)
    assert 0 < stopped.summary["actor_steps"] < kw["total_steps"], "the run went on past Ctrl-C"
    resumed = rlherd.train(resume=tmp_path / "b", progress=False)
    for key in ("actor_steps", "learner_steps", "episodes", "final_return_mean"):
        assert resumed.summary[key] == straight.summary[key], key
    a, b = (RunDir(tmp_path / d).load_checkpoint() for d in "ab")
    assert a["learner"]["net"]["obs_norm.count"] > 0
    for k, v in a["learner"]["net"].items():
        torch.testing.assert_close(b["learner"]["net"][k], v, rtol=0, atol=0)
    assert a["actor"]["scaler"]["stats"]["var"] == b["actor"]["scaler"]["stats"]["var"]


def test_eval_uses_the_trained_observation_statistics(tmp_path):
    run = rlherd.train(
        "ppo", "Pendulum-v1", total_steps=2_048, seed=0, run_dir=tmp_path, progress=False,
        normalize_obs=True, num_envs=2, unroll_length=64,
    )  # fmt: skip
    from rlherd.commands.evaluate import evaluate, load_run

    _, _, checkpoint, _ = load_run(run.path)
    # The learner's statistics: every observation of its batches (8 rollouts of 64 steps) but
    # the few autoreset rows (Pendulum's episodes are 200 steps).
    learned = run.summary["learner_steps"] * 8 * 64
    assert learned - 12 <= checkpoint["learner"]["net"]["obs_norm.count"].item() < learned
    result = evaluate(run.path, episodes=1)
    assert np.isfinite(result["eval_return_mean"])


@pytest.mark.slow
def test_ppo_learns_cartpole(tmp_path):
    run, reached = learn_to(475, "ppo", "CartPole-v1", total_steps=100_000, seed=0,
                            run_dir=tmp_path, progress=False)  # fmt: skip
    assert reached, run.summary


def test_chunked_passes_give_the_same_update():
    """A minibatch run in chunks of max_rows_per_pass rows accumulates the same gradient."""
    from rlherd.agents.ppo.learning import PPOLearner

    spec = spec_for("Pendulum-v1")
    T, B = 6, 5
    g = torch.Generator().manual_seed(0)
    rollout = {
        F.OBS: torch.randn(T + 1, B, 3, generator=g),
        F.ACTION: torch.randn(T + 1, B, 1, generator=g),
        F.BEHAVIOUR_LOG_PROB: torch.randn(T + 1, B, generator=g) * 0.1 - 1.0,
        F.POLICY_PARAMS: torch.zeros(T + 1, B, 2),
        F.BASELINE: torch.randn(T + 1, B, generator=g),
        F.REWARD: torch.randn(T + 1, B, generator=g),
        F.TERMINATED: torch.rand(T + 1, B, generator=g) < 0.1,
        F.TRUNCATED: torch.zeros(T + 1, B, dtype=torch.bool),
        F.RESET: torch.rand(T + 1, B, generator=g) < 0.1,
    }
    nets = []
    for rows in (7, 65536):
        torch.manual_seed(0)
        config = PPOConfig(minibatches=1, epochs=2, max_rows_per_pass=rows, objective="kl")
        net = PPONet(spec, config)
        PPOLearner(net, config, 1000, dataset=iter([rollout])).step()
        nets.append(net.state_dict())
    for k, v in nets[0].items():
        torch.testing.assert_close(nets[1][k], v, rtol=1e-5, atol=1e-6)


def test_sign_reward_scaling_keeps_the_sign_only():
    """CleanRL's ClipRewardEnv for the Atari preset: rewards become -1, 0 or 1."""
    from rlherd.agents.ppo.acting import RewardScaler

    scaler = RewardScaler("sign", 3, 0.99)
    reward = torch.tensor([-7.5, 0.0, 0.2], dtype=torch.float64)
    assert scaler(reward, torch.zeros(3, dtype=torch.bool)).tolist() == [-1.0, 0.0, 1.0]


@pytest.mark.parametrize("env_id, preset", [("MinAtar/Breakout-v1", "minatar"),
                                            ("ALE/Pong-v5", "atari")])  # fmt: skip
def test_pixel_envs_get_their_presets(env_id, preset):
    from rlherd.agents import BUILDERS

    assert BUILDERS["ppo"].preset_for(env_id) == preset
