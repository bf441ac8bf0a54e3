"""Device environments (WarpDrive): consistency with the numpy references, autoreset and seeding,
the sampler, and the device runtime (resume, eval, learning)."""

import csv
import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import learn_to

import rlherd
from rlherd.commands.evaluate import evaluate
from rlherd.envs.device import (
    ConsistencyError,
    TagContinuous,
    TagGridWorld,
    check_consistency,
    make_device,
    sample_categorical,
    sample_multi_categorical,
)
from rlherd.envs.reference.tag import TagGridWorldReference
from rlherd.errors import ConfigError
from rlherd.run.rundir import RunDir

pytest.importorskip("pettingzoo")

GRID_OPTIONS = [
    {},
    dict(use_full_observation=False),
    dict(num_taggers=1, grid_length=3, episode_length=15, use_full_observation=False),
    dict(num_taggers=3, grid_length=4, episode_length=30, wall_hit_penalty=0.5,
         tag_reward_for_tagger=2.0, tag_penalty_for_runner=1.0, step_cost_for_tagger=0.1),
]  # fmt: skip
CONTINUOUS_OPTIONS = [
    {},
    dict(use_full_observation=False),
    dict(num_taggers=3, num_runners=5, tagging_distance=0.2, episode_length=40),
    dict(num_taggers=2, num_runners=6, tagging_distance=0.25, use_full_observation=False,
         num_other_agents_observed=4, episode_length=40),
    dict(num_taggers=3, num_runners=4, tagging_distance=0.3, runner_exits_game_after_tagged=False,
         edge_hit_penalty=-0.5, step_penalty_for_tagger=-0.01, step_reward_for_runner=0.02,
         skill_level_runner=0.5, max_speed=2.0, grid_length=5.0, episode_length=30),
    dict(num_taggers=2, num_runners=3, max_acceleration=0.1, min_acceleration=-0.1,
         max_turn=2.3, min_turn=-2.3, num_acceleration_levels=20, num_turn_levels=20,
         tagging_distance=0.3, tag_reward_for_tagger=10.0, tag_penalty_for_runner=-10.0,
         end_of_game_reward_for_runner=3.0, episode_length=25, tagger_seed=3),
]  # fmt: skip


@pytest.mark.parametrize("options", GRID_OPTIONS)
def test_tag_gridworld_matches_its_reference(options):
    env = TagGridWorld(8, seed=1, **options)
    result = check_consistency(env, steps=250, seed=1)
    assert result["episodes"] >= 8  # autoresets were crossed


@pytest.mark.parametrize("options", CONTINUOUS_OPTIONS)
def test_tag_continuous_matches_its_reference(options):
    env = TagContinuous(6, seed=2, **options)
    result = check_consistency(env, steps=120, seed=2)
    assert result["episodes"] >= 6


def test_device_cartpole_matches_gymnasium():
    env = make_device("CartPole-v1", 8, seed=0)
    assert check_consistency(env, steps=300)["episodes"] > 8


class PerturbedGrid(TagGridWorld):
    """A deliberately wrong device step: agent 1 of game 2 gets 0.5 too much at step 3."""

    def _transition(self, actions):
        reward, terminated, truncated = super()._transition(actions)
        wrong = (self.state["timestep"] == 3) & (torch.arange(self.num_envs) == 2)
        reward[:, 1] += 0.5 * wrong
        return reward, terminated, truncated


def test_a_perturbed_device_step_is_reported_precisely():
    env = PerturbedGrid(4, seed=0, episode_length=50, grid_length=20)
    with pytest.raises(ConsistencyError) as err:
        check_consistency(env, steps=10)
    message = str(err.value)
    assert "step 3, environment 2, agent 'tagger_1': reward" in message
    assert "on the device but" in message and "in the reference" in message


class PerturbedObservation(TagContinuous):
    def _observe(self):
        obs = super()._observe().clone()
        obs[:, 0, 5] += 0.1 * (self.state["timestep"] >= 2)
        return obs


def test_a_perturbed_observation_names_the_feature():
    env = PerturbedObservation(2, seed=0, num_taggers=1, num_runners=2)
    with pytest.raises(
        ConsistencyError, match=r"step 2, environment 0, agent '.*': observation\[5\]"
    ):
        check_consistency(env, steps=5)


def test_next_step_autoreset_and_seeded_starts():
    env = TagGridWorld(16, seed=0, num_taggers=2, grid_length=2, episode_length=5)
    env.reset(seed=7)
    first = env.state["pos"].clone()
    env.reset(seed=7)
    torch.testing.assert_close(env.state["pos"], first)  # same seed, same starts
    env.reset(seed=8)
    assert not torch.equal(env.state["pos"], first)
    assert not all(torch.equal(first[0], first[i]) for i in range(1, 16))  # per game
    rng = np.random.default_rng(0)
    done_before = torch.zeros(16, dtype=torch.bool)
    for _ in range(12):
        obs, reward, terminated, truncated = env.step(torch.as_tensor(env.sample_actions(rng)))
        # Games that ended last step restart now: reward 0, no flags, timestep 0.
        assert (reward[done_before] == 0).all()
        assert not (terminated | truncated)[done_before].any()
        assert (env.state["timestep"][done_before] == 0).all()
        done_before = (terminated | truncated).clone()


def test_fixed_start_restarts_every_game_from_the_same_state():
    env = TagGridWorld(3, seed=0, fixed_start=True, num_taggers=2, grid_length=2, episode_length=3)
    env.reset()
    start = env.state["pos"].clone()
    rng = np.random.default_rng(0)
    for _ in range(4):  # episodes of 3 steps end by step 3; step 4 restarts them
        env.step(torch.as_tensor(env.sample_actions(rng)))
    restarted = env.state["timestep"] == 0
    assert restarted.any()
    torch.testing.assert_close(env.state["pos"][restarted], start[restarted])


def test_reset_and_load_write_into_the_tensors_a_cuda_graph_reads():
    """A recorded step reads and writes the games' own tensors, so starting the games again or
    loading a checkpoint must write into those tensors, not replace them (a replaced tensor
    would leave the graph stepping games nobody reads)."""
    env = TagGridWorld(4, seed=0, fixed_start=True, num_taggers=2)
    env.reset()
    tensors = [*env.state.values(), *env._first_start.values()]
    saved = env.state_dict()
    env.step(torch.zeros(4, 3, dtype=torch.int64))
    env.reset(seed=3)
    assert not torch.equal(env.state["pos"], saved["state"]["pos"])  # a new fixed start
    env.load_state_dict(saved)
    torch.testing.assert_close(env.state["pos"], saved["state"]["pos"])
    torch.testing.assert_close(env._first_start["pos"], saved["first_start"]["pos"])
    now = [*env.state.values(), *env._first_start.values()]
    assert all(a is b for a, b in zip(now, tensors, strict=True))


def _graphed_and_eager(env_id: str, games: int, **options):
    return [make_device(env_id, games, "cuda", seed=3, cuda_graph=graph, **options)
            for graph in (True, False)]  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("env_id, options", [
    ("tag-gridworld", dict(num_taggers=2, grid_length=3, episode_length=8)),
    ("tag-continuous", dict(num_taggers=2, num_runners=3, episode_length=12,
                            use_full_observation=False)),
    ("tag-gridworld", dict(fixed_start=True, episode_length=5)),
    ("CartPole-v1", {}),
])  # fmt: skip
def test_a_cuda_graph_replays_the_eager_step_exactly(env_id, options):
    """Through autoresets, a reset with a new seed and a checkpoint loaded back: the replayed
    step gives the eager step's games bit for bit, and leaves the generator where it does."""
    graphed, eager = _graphed_and_eager(env_id, 64, **options)
    g = torch.Generator("cuda").manual_seed(0)
    high = torch.as_tensor(eager.action_nvec, device="cuda")

    def steps(n: int) -> None:
        for _ in range(n):
            actions = (torch.rand(eager.action_shape, generator=g, device="cuda") * high).long()
            for env in (graphed, eager):
                env.step(actions)
            for name in ("obs", "reward", "terminated", "truncated", "tags"):
                assert torch.equal(getattr(graphed, name), getattr(eager, name)), name
            for k, v in eager.state.items():
                assert torch.equal(graphed.state[k], v), k
            assert torch.equal(graphed.generator.get_state(), eager.generator.get_state())

    for env in (graphed, eager):
        env.reset()
    steps(40)
    saved = [env.state_dict() for env in (graphed, eager)]
    steps(10)
    for env in (graphed, eager):
        env.reset(seed=5)
    steps(20)
    for env, state in zip((graphed, eager), saved, strict=True):
        env.load_state_dict(state)
    steps(20)


def test_cuda_graph_needs_a_cuda_device_and_no_compile(tmp_path, monkeypatch):
    from rlherd.runtime.device import DeviceLoop
    from rlherd.runtime.settings import Device

    with pytest.raises(ValueError, match="cuda_graph needs a CUDA device"):
        make_device("tag-gridworld", 2, "cpu", cuda_graph=True)
    with pytest.raises(ConfigError, match="add --device cuda"):
        rlherd.train("ppo", "tag-gridworld", runtime="device", cuda_graph=True,
                     total_steps=100, run_dir=tmp_path, progress=False)  # fmt: skip
    with pytest.raises(ValueError, match="needs games on a CUDA device"):
        DeviceLoop(make_device("tag-gridworld", 2, "cpu"), [], 0, cuda_graph=True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(ConfigError, match="choose one"):
        Device(device="cuda", cuda_graph=True, compile=True).check()


def test_bad_device_env_input_is_a_clear_error():
    with pytest.raises(ValueError, match="no device version.*Did you mean tag-gridworld"):
        make_device("tag-gridwrld", 2)
    with pytest.raises(ValueError, match="bad option"):
        make_device("tag-gridworld", 2, num_runers=3)
    env = make_device("tag-gridworld", 2, num_taggers=2)
    env.reset()
    with pytest.raises(ValueError, match=r"actions must have shape \(2, 3\)"):
        env.step(torch.zeros(2, 4, dtype=torch.int64))
    with pytest.raises(ValueError, match="multi-agent game.*--runtime device"):
        rlherd.train("ppo", "tag-gridworld", total_steps=10, progress=False)


def test_reference_is_a_pettingzoo_parallel_env():
    from pettingzoo.test import parallel_api_test

    parallel_api_test(TagGridWorldReference(num_taggers=2), num_cycles=50)
    assert (
        rlherd.make("tag-continuous", num_runners=3)
        .possible_agents[-1]
        .startswith(("tagger", "runner"))
    )


def test_sampler_frequencies_match_the_probabilities():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 5, generator=g) * 2
    draws = torch.stack([sample_categorical(logits, g) for _ in range(20_000)])
    freq = torch.nn.functional.one_hot(draws, 5).float().mean(0)
    torch.testing.assert_close(freq, torch.softmax(logits, -1), atol=0.015, rtol=0)
    multi = sample_multi_categorical([logits, logits[..., :3]], g)
    assert multi.shape == (2, 3, 2) and multi[..., 1].max() < 3
    # Zero-probability actions are never drawn.
    masked = torch.tensor([[0.0, -1e9, 0.0]]).expand(1000, 3)
    assert (sample_categorical(masked, g) != 1).all()


def test_device_run_resumes_exactly_and_evaluates_with_an_animation(tmp_path):
    kw = dict(runtime="device", seed=0, progress=False, num_envs=32, unroll_length=10,
              objective="clip", epochs=2, minibatches=2,
              env_kwargs=dict(num_taggers=2, num_runners=3, tagging_distance=0.2))  # fmt: skip
    straight = rlherd.train(
        "ppo", "tag-continuous", total_steps=9_600, run_dir=tmp_path / "a", **kw
    )
    rlherd.train("ppo", "tag-continuous", total_steps=4_800, run_dir=tmp_path / "b", **kw)
    resumed = rlherd.train(resume=tmp_path / "b", total_steps=9_600, progress=False)
    for key in ("actor_steps", "learner_steps", "episodes", "final_return_mean_tagger",
                "final_return_mean_runner"):  # fmt: skip
        assert resumed.summary[key] == straight.summary[key], key
    # A competitive game reports each policy's returns, never taggers and runners averaged.
    assert straight.summary["final_return_mean"] is None
    a, b = (RunDir(tmp_path / d).load_checkpoint() for d in "ab")
    for name in ("tagger", "runner"):
        for k, v in a["learner"][name]["net"].items():
            torch.testing.assert_close(b["learner"][name]["net"][k], v, rtol=0, atol=0)
    result = evaluate(tmp_path / "a", episodes=3, video=tmp_path / "game.gif")
    assert (tmp_path / "game.gif").stat().st_size > 1000
    assert {"eval_return_tagger", "eval_return_runner", "eval_tag_rate"} <= set(result)
    from rlherd.commands.plot import plot_runs  # one curve per policy

    assert plot_runs([tmp_path / "a"], tmp_path / "curves.png").stat().st_size > 1000


def test_device_ppo_keeps_its_observation_normalisation(tmp_path):
    """PPO's observation statistics are learner state: on the device, which runs no actor, they
    are updated from every batch and checkpointed like anywhere else."""
    rlherd.train("ppo", "CartPole-v1", runtime="device", total_steps=2_048, seed=0,
                 run_dir=tmp_path, progress=False, normalize_obs=True, num_envs=8)  # fmt: skip
    net = RunDir(tmp_path).load_checkpoint()["learner"]["agent"]["net"]
    assert net["obs_norm.count"].item() >= 1_024


@pytest.mark.parametrize("command", ["eval", "resume"])
def test_network_sizes_edited_after_a_device_run_are_one_line(command, tmp_path, capsys):
    """The device runtime's own evaluation loaded the policy unchecked: torch's size-mismatch
    traceback, not the one line every other runtime's run gets."""
    from rlherd.cli import main

    rlherd.train("ppo", "CartPole-v1", runtime="device", total_steps=512, seed=0, num_envs=8,
                 run_dir=tmp_path / "run", progress=False)  # fmt: skip
    record = json.loads((tmp_path / "run" / "config.json").read_text())
    record["config"]["hidden_sizes"] = [7]
    (tmp_path / "run" / "config.json").write_text(json.dumps(record))
    argv = (["eval", str(tmp_path / "run"), "--episodes", "1"] if command == "eval" else
            ["train", "--resume", str(tmp_path / "run"), "--total-steps", "1024",
             "--no-progress"])  # fmt: skip
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "does not fit the run's config" in err, err


def test_recurrent_impala_on_the_device(tmp_path):
    """The device carries each policy's recurrent state across steps and rollouts."""
    run = rlherd.train("impala", "CartPole-v1", runtime="device", total_steps=4_000, seed=0,
                       run_dir=tmp_path, progress=False, use_lstm=True, num_envs=8)  # fmt: skip
    assert run.summary["learner_steps"] >= 40 and run.summary["episodes"] > 0


def test_check_env_command():
    out = subprocess.run(
        [sys.executable, "-m", "rlherd.cli", "check-env", "tag-gridworld", "--consistency",
         "--num-envs", "4", "--steps", "60", "--env-kwargs", '{"num_taggers": 2}'],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["consistent"] is True


@pytest.mark.parametrize("flags, says", [
    (["--steps", "-1"], "--num-envs and --steps must be >= 1"),  # reported consistent, unchecked
    (["--num-envs", "0"], "--num-envs and --steps must be >= 1"),
    (["--device", "mars"], "--device='mars' is not a torch device"),  # torch's RuntimeError
])  # fmt: skip
def test_check_env_consistency_refuses_what_would_check_nothing_in_one_line(flags, says, capsys):
    from rlherd.cli import main

    assert main(["check-env", "tag-gridworld", "--consistency", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and says in err, err


def test_check_env_flags_of_the_consistency_check_without_it_are_one_line(capsys):
    """``check-env CartPole-v1 --num-envs -3`` checked CartPole as one environment, silently."""
    from rlherd.cli import main

    assert main(["check-env", "CartPole-v1", "--num-envs", "-3", "--seconds", "0.2"]) == 2
    assert "--num-envs, --steps and --device go with --consistency" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal of a machine without CUDA")
def test_check_env_consistency_on_cuda_without_it_is_one_line(capsys):
    from rlherd.cli import main

    assert main(["check-env", "tag-gridworld", "--consistency", "--device", "cuda"]) == 2
    assert "--device='cuda' but CUDA is not available" in capsys.readouterr().err


def test_check_env_of_a_device_game_without_consistency_names_the_flag():
    """The single-agent checks do not apply to the device runtime's games: one line that says
    which check does."""
    from rlherd.commands.check_env import check

    with pytest.raises(ConfigError, match="rlherd check-env tag-gridworld --consistency"):
        check("tag-gridworld")


@pytest.mark.slow
def test_device_ppo_raises_the_taggers_tag_rate(tmp_path):
    """Taggers trained by PPO on the device against a fixed random runner tag far more often
    than the random policy they started from."""
    rlherd.train(
        "ppo", "tag-gridworld", runtime="device", total_steps=1_200_000, seed=0,
        run_dir=tmp_path, progress=False, num_envs=250, unroll_length=40, objective="clip",
        epochs=4, minibatches=4, learning_rate=3e-3, entropy_cost=0.01, gae_lambda=0.95,
        policy_overrides={"runner": {"learning_rate": 1e-12}},
        env_kwargs=dict(num_taggers=2, grid_length=10, episode_length=40),
    )  # fmt: skip
    with open(tmp_path / "metrics" / "train.csv") as f:
        rates = [float(row["tag_rate"]) for row in csv.DictReader(f)]
    first, last = rates[0], np.mean(rates[-3:])
    assert first < 0.5 and last > 0.8 and last > 2 * first


@pytest.mark.slow
def test_device_cartpole_learns(tmp_path):
    run, reached = learn_to(475, "ppo", "CartPole-v1", runtime="device", total_steps=100_000,
                            seed=0, run_dir=tmp_path, progress=False)  # fmt: skip
    assert reached, run.summary


@pytest.mark.gpu
def test_device_environments_on_cuda_match_their_references():
    for env in (TagGridWorld(64, "cuda", seed=0), TagContinuous(32, "cuda", seed=0),
                make_device("CartPole-v1", 64, "cuda")):  # fmt: skip
        check_consistency(env, steps=100)


@pytest.mark.gpu
def test_device_runtime_on_cuda(tmp_path):
    run = rlherd.train(
        "ppo", "tag-gridworld", runtime="device", total_steps=400_000, seed=0, run_dir=tmp_path,
        progress=False, device="cuda", num_envs=1000, unroll_length=20,
    )  # fmt: skip
    assert run.summary["actor_steps"] >= 400_000


@pytest.mark.gpu
@pytest.mark.parametrize("agent, env_id, options", [
    ("ppo", "tag-continuous", dict(env_kwargs=dict(num_taggers=2, num_runners=3,
                                                   episode_length=20))),
    ("impala", "tag-gridworld", dict(use_lstm=True, env_kwargs=dict(num_taggers=2),
                                     policy_overrides={"runner": {"unroll_length": 7}})),
])  # fmt: skip
def test_a_cuda_graph_run_is_the_eager_run_and_resumes_exactly(
    agent, env_id, options, interrupt_at, tmp_path
):
    """Recorded steps act, step the games and fill the rollouts as the eager ones do (a
    recurrent state, two groups whose rollouts complete at different steps), and a run that
    records them, stopped halfway, resumes where it stopped."""
    kw = dict(runtime="device", device="cuda", seed=0, progress=False, num_envs=256,
              unroll_length=10, total_steps=60_000, **options)  # fmt: skip
    eager = rlherd.train(agent, env_id, run_dir=tmp_path / "eager", **kw)
    interrupt_at(30_000)
    stopped = rlherd.train(agent, env_id, run_dir=tmp_path / "graph", cuda_graph=True, **kw)
    assert stopped.stopped
    graph = rlherd.train(resume=tmp_path / "graph", progress=False)
    for key in ("actor_steps", "learner_steps", "episodes", "final_return_mean_tagger",
                "final_return_mean_runner"):  # fmt: skip
        assert graph.summary[key] == eager.summary[key], key
    assert eager.summary["episodes"] > 0
    a, b = (RunDir(tmp_path / d).load_checkpoint() for d in ("eager", "graph"))
    for name in ("tagger", "runner"):
        for k, v in a["learner"][name]["net"].items():
            assert torch.equal(b["learner"][name]["net"][k], v), (name, k)


@pytest.mark.gpu
def test_a_step_that_replaces_its_state_is_refused_a_cuda_graph():
    """A recorded step reads the tensors it saw; one that replaces ``self.state[k]`` instead
    of writing into it would leave every replay on the old tensor, so recording it fails."""

    class Replacing(TagGridWorld):
        def _transition(self, actions):
            out = super()._transition(actions)
            self.state["timestep"] = self.state["timestep"].clone()
            return out

    env = Replacing(8, "cuda", cuda_graph=True, num_taggers=2)
    env.reset()
    with pytest.raises(RuntimeError, match="replaced a tensor it should write into"):
        env.step(torch.zeros(8, 3, dtype=torch.int64, device="cuda"))


def test_the_policies_setting_regroups_a_device_games_agents():
    """The device's agent groups are the run's policies: the same setting that maps a
    PettingZoo game's agents maps these (the game's own groups are its default)."""
    from rlherd.agents.ppo.builder import PPOBuilder
    from rlherd.agents.ppo.config import PPOConfig
    from rlherd.runtime.device import make_groups
    from rlherd.runtime.settings import Device

    env = make_device("tag-gridworld", 2, "cpu", 0, num_taggers=2)
    builder = PPOBuilder(PPOConfig())

    def groups(**settings):
        return {g.name: g.ids.tolist() for g in make_groups(builder, "tag-gridworld",
                                                             Device(**settings), env)}

    assert groups() == {"tagger": [0, 1], "runner": [2]}
    assert groups(policies="shared") == {"shared": [0, 1, 2]}
    assert groups(policies="first=tagger_0,rest=*") == {"first": [0], "rest": [1, 2]}
    with pytest.raises(ConfigError, match="policy_overrides names"):
        groups(policies="shared", policy_overrides={"tagger": {"learning_rate": 1.0}})
