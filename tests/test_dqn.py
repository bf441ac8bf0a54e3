"""DQN end to end on the single runtime: tiny environments, exact resume, evaluation that does not
touch training, and learning CartPole."""

import os
import signal
import threading

import numpy as np
import pytest
import torch

import rlherd
from rlherd.agents.dqn.acting import DQNActor, linear_epsilon
from rlherd.run.evaluate import evaluate


def checkpoint(run_dir):
    pointer = (run_dir / "checkpoints" / "latest").read_text()
    return torch.load(run_dir / "checkpoints" / pointer, weights_only=False)


def test_epsilon_schedules():
    eps = linear_epsilon(1.0, 0.1, 100)
    assert [eps(0), eps(50), eps(100), eps(1000)] == [1.0, pytest.approx(0.55), 0.1, 0.1]


def test_epsilon_follows_the_runs_experience_not_one_actors_steps(tmp_path):
    """With N actors, each sees 1/N of the steps: the schedule runs on the experience the learner
    sends with the parameters, so exploration ends when the run (not each actor) has decayed."""
    from rlherd.agents.dqn import DQNBuilder, DQNConfig

    spec = rlherd.envs.spec_for("CartPole-v1")
    builder = DQNBuilder(DQNConfig(hidden_sizes=(8,)))
    policy = builder.make_policy(builder.make_networks(spec))
    actor = DQNActor(policy, None, linear_epsilon(1.0, 0.0, 100), seed=0)
    obs = np.random.default_rng(0).normal(size=(256, 4)).astype(np.float32)
    greedy = policy(torch.as_tensor(obs), None, (), None)[0]["action"].numpy()
    assert (actor.select_action(obs) != greedy).any()  # epsilon 1: random actions
    policy.net.experience.fill_(100)  # the run has decayed its schedule
    assert (actor.select_action(obs) == greedy).all()
    # An evaluation that samples (rlherd eval --sample) explores with the final epsilon.
    sampling = builder.make_actor(0, builder.make_policy(policy.net), spec, None, None)
    greedy_actor = builder.make_actor(0, builder.make_policy(policy.net, True), spec, None, None)
    assert sampling.epsilon(0) == builder.config.epsilon_end and greedy_actor.epsilon(0) == 0.0
    # The learner sets it from the replay table's inserts: every step but the autoreset ones
    # (Corridor's episodes are a few steps long) and those the learner has not seen yet.
    rlherd.train("dqn", "rlherd/Corridor-v0", total_steps=3_000, run_dir=tmp_path,
                 progress=False)  # fmt: skip
    experience = checkpoint(tmp_path)["learner"]["net"]["experience"].item()
    assert 2_000 <= experience <= 3_000


@pytest.mark.parametrize("env_id", ["rlherd/Bandit-v0", "rlherd/Corridor-v0"])
def test_tiny_environments_are_solved(env_id, tmp_path):
    run = rlherd.train("dqn", env_id, run_dir=tmp_path, progress=False)
    assert run.summary["learner_steps"] > 0
    optimum = rlherd.make(env_id).unwrapped.optimal_return
    assert evaluate(tmp_path, episodes=5)["eval_return_mean"] == pytest.approx(optimum)


def test_interrupt_then_resume_continues_exactly(tmp_path):
    """Replay, adders' pending steps, environments, epsilon and RNGs are all in the checkpoint,
    so an interrupted and resumed run ends exactly where an uninterrupted one does."""
    kw = dict(total_steps=12_000, seed=5, progress=False)
    straight = rlherd.train("dqn", "CartPole-v1", run_dir=tmp_path / "a", **kw)
    timer = threading.Timer(2.0, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    stopped = rlherd.train("dqn", "CartPole-v1", run_dir=tmp_path / "b", **kw)
    timer.join()
    assert 0 < stopped.summary["actor_steps"] < kw["total_steps"], "the interrupt came too late"
    resumed = rlherd.train(resume=tmp_path / "b", progress=False)
    for key in ("actor_steps", "learner_steps", "episodes", "final_return_mean"):
        assert resumed.summary[key] == straight.summary[key], key
    a, b = checkpoint(tmp_path / "a"), checkpoint(tmp_path / "b")
    for name in ("net", "target_net"):
        for k, v in a["learner"][name].items():
            torch.testing.assert_close(b["learner"][name][k], v, rtol=0, atol=0)
    np.testing.assert_array_equal(a["tables"][0]["keys"], b["tables"][0]["keys"])
    np.testing.assert_array_equal(a["tables"][0]["priorities"], b["tables"][0]["priorities"])


def test_evaluation_never_touches_training(tmp_path):
    """The evaluator acts on its own environment and network copy: with or without it, the
    replay table and the learned parameters are identical."""
    kw = dict(total_steps=4_000, seed=2, progress=False)
    plain = rlherd.train("dqn", "CartPole-v1", run_dir=tmp_path / "a", **kw)
    evaluated = rlherd.train(
        "dqn", "CartPole-v1", run_dir=tmp_path / "b", eval_every=1_000, eval_episodes=2, **kw
    )
    assert "eval_return_mean" in evaluated.summary and "eval_return_mean" not in plain.summary
    rows = (tmp_path / "b" / "metrics" / "evaluator.csv").read_text().splitlines()
    assert len(rows) == 1 + 4
    a, b = checkpoint(tmp_path / "a"), checkpoint(tmp_path / "b")
    for key in ("keys", "data/obs", "limiter"):
        np.testing.assert_array_equal(a["tables"][0][key], b["tables"][0][key])
    for k, v in a["learner"]["net"].items():
        torch.testing.assert_close(b["learner"]["net"][k], v, rtol=0, atol=0)


@pytest.mark.slow
def test_dqn_learns_cartpole(tmp_path):
    run = rlherd.train(
        "dqn", "CartPole-v1", total_steps=100_000, seed=0, run_dir=tmp_path, progress=False
    )
    assert run.summary["final_return_mean"] >= 475, run.summary
