"""Bring your own environment: any Gymnasium id or factory, dict observations through every
buffer, action masks in every agent that acts in discrete spaces, and ``rlherd check-env``."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import pickle
import random
import re
import subprocess
import sys
import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import learn_to
from mixed_env import MIXED, assert_same

import rlherd
from rlherd import envs as rl_envs
from rlherd import types as F
from rlherd.agents.acting import explore
from rlherd.cli import main
from rlherd.commands.evaluate import evaluate
from rlherd.commands.train import ObservationNotice
from rlherd.core import OBS_KEY, EnvSpec, flatten_space, flatten_value
from rlherd.envs import ids
from rlherd.envs.wrappers import sample_action
from rlherd.errors import ConfigError, MissingExtra, UnsupportedEnv, one_line
from rlherd.losses.td import double_q_learning_td, greedy_action, large_margin, q_learning_td
from rlherd.networks import make_torso
from rlherd.networks.distributions import (
    MASKED_LOGIT,
    Categorical,
    mask_logits,
    sample_categorical,
)
from rlherd.replay import EpisodeAdder, Fifo, MinSize, NStepTransitionAdder, SequenceAdder, Table
from rlherd.replay.adders import obs_signature
from rlherd.replay.rollouts import RolloutWriter, allocate_rollout, rollout_layout


# ------------------------------------------------------------------------------ environments
class OneLegalAction(gym.Env):
    """Five actions, exactly one of them legal at each step (drawn at random); the observation
    says which (a one-hot), so an agent can learn to take it (+1). Taking another is an error,
    so a run in which any agent, exploring or greedy, ever takes an illegal action fails. The
    mask comes from ``source``: the observation (PettingZoo), ``info`` (Gymnasium's toy text) or
    ``action_masks()`` (MaskablePPO)."""

    N, LIMIT = 5, 10

    def __init__(self, source: str = "obs"):
        self.source = source
        hint = gym.spaces.Box(0.0, 1.0, (self.N,), np.float32)
        if source == "obs":
            hint = gym.spaces.Dict({"hint": hint, "action_mask": gym.spaces.MultiBinary(self.N)})
        self.observation_space, self.action_space = hint, gym.spaces.Discrete(self.N)

    def _observe(self):
        self.legal = int(self.np_random.integers(self.N))
        mask = np.eye(self.N, dtype=np.int8)[self.legal]
        hint = mask.astype(np.float32)
        obs = {"hint": hint, "action_mask": mask} if self.source == "obs" else hint
        return obs, ({"action_mask": mask} if self.source == "info" else {})

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._observe()

    def step(self, action):
        if int(action) != self.legal:
            raise ValueError(f"illegal action {action}: only {self.legal} is legal")
        self.t += 1
        obs, info = self._observe()
        return obs, 1.0, False, self.t >= self.LIMIT, info


class OneLegalActionMethod(OneLegalAction):
    def action_masks(self) -> np.ndarray:  # MaskablePPO's convention, found by rlherd.envs
        return np.eye(self.N, dtype=bool)[self.legal]


class ActionMasker(gym.Wrapper):
    """sb3-contrib's ActionMasker, in short: the mask method lives on a wrapper."""

    def action_masks(self) -> np.ndarray:
        return np.eye(self.env.unwrapped.N, dtype=bool)[self.env.unwrapped.legal]


@rlherd.env_factory
def one_legal_action(source: str = "obs") -> gym.Env:
    if source == "wrapper":
        return ActionMasker(OneLegalAction("method"))
    return (OneLegalActionMethod if source == "method" else OneLegalAction)(source)


class OddMask(OneLegalAction):
    """OneLegalAction whose mask goes wrong at step 3 (``fault``): none legal, a wrong length,
    a value of 2, missing from that step's info (``gone``), or the mask from step() but not from
    reset() (``late``)."""

    def __init__(self, source: str = "info", fault: str = "none", at_end: bool = False):
        super().__init__("info" if source == "late" else source)
        self.fault, self.late, self.at_end = fault, source == "late", at_end

    def _observe(self):
        obs, info = super()._observe()
        mask = obs["action_mask"] if self.source == "obs" else info.get("action_mask")
        if self.t == 3 and self.fault == "none":
            mask[:] = 0
        elif self.t == 3 and self.fault == "value":
            mask[self.legal] = 2
        elif self.t == 3 and self.fault == "length" and self.source == "info":
            info["action_mask"] = np.append(mask, 1)
        elif self.t == 3 and self.fault == "gone":
            info.pop("action_mask")
        if self.late and self.t == 0:
            info.pop("action_mask")
        return obs, info

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        return obs, reward, terminated or (self.at_end and self.t == 3), truncated, info


class Scalar(gym.Env):
    """A scalar observation (a Box of shape ()), alone or as a dict's leaf (``nested``)."""

    action_space = gym.spaces.Discrete(2)

    def __init__(self, nested: bool = False):
        box = gym.spaces.Box(-1.0, 1.0, (), np.float32)
        self.nested = nested
        self.observation_space = gym.spaces.Dict({"x": box, "n": gym.spaces.Discrete(3)}) \
            if nested else box  # fmt: skip

    def _obs(self):
        x = np.float32(self.t / 10)
        return {"x": x, "n": self.t % 3} if self.nested else x

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        return self._obs(), float(action), False, self.t >= 10, {}


class HumanView(OneLegalAction):
    """OneLegalAction, its mask in info, drawn for a human (here: not at all)."""

    metadata = {"render_modes": ["human"]}

    def __init__(self, render_mode: str | None = None):
        super().__init__("info")
        self.render_mode = render_mode

    def render(self):
        return None


class Codes(gym.Env):
    """Codes that do not count from 0: a Discrete from 5, a MultiDiscrete from -1 (int32)."""

    observation_space = gym.spaces.Dict({
        "d": gym.spaces.Discrete(3, start=5),
        "m": gym.spaces.MultiDiscrete([3, 4], start=[-1, -1], dtype=np.int32),
    })  # fmt: skip
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return {"d": 7, "m": np.array([-1, 2], np.int32)}, {}

    def step(self, action):
        return {"d": 5, "m": np.array([1, -1], np.int32)}, 0.0, True, False, {}


class NoRenderMode(Codes):
    """An environment whose constructor takes no ``render_mode``, as many of one's own do."""

    def __init__(self):
        super().__init__()


gym.register("test_your_env/NoRenderMode-v0", entry_point=NoRenderMode)


@pytest.mark.parametrize(("source", "fault", "says"), [
    ("info", "none", "allows no action mid-episode"),
    ("obs", "none", "allows no action mid-episode"),
    ("info", "value", r"is not one 0 or 1 per action \(5\)"),
    ("obs", "value", r"is not one 0 or 1 per action \(5\)"),
    ("info", "length", r"returned observation 'action_mask' of shape \(6,\); its observation "
                       r"space says \(5,\)"),
    ("late", "none", r"gives info\['action_mask'\] from step\(\) but not from reset\(\)"),
    ("info", "gone", r"gives info\['action_mask'\] from reset\(\) but not with every "
                     r"observation after it: give it from every step\(\)"),
])  # fmt: skip
def test_an_action_mask_that_cannot_be_kept_is_refused_not_ignored(source, fault, says):
    """Illegal actions were played in silence: a mask with no legal action mid-episode (96
    illegal actions in 2,000 steps, rc 0), one given from step() but not reset() (never read:
    1,551 illegal actions), one of other values than 0 and 1 (check-env crashed inside
    gymnasium's sampler); one missing from a step's info was a bare KeyError."""
    env = rl_envs.make(f"{__name__}:OddMask", source=source, fault=fault)
    env.reset(seed=0)
    with pytest.raises(UnsupportedEnv, match=says):
        for _ in range(3):
            env.step(env.unwrapped.legal)
    # No legal action once the episode has ended is no fault (a game's final position).
    env = rl_envs.make(f"{__name__}:OddMask", source="info", at_end=True)
    env.reset(seed=0)
    for _ in range(3):
        env.step(env.unwrapped.legal)


@pytest.mark.parametrize("nested", [False, True])
def test_a_scalar_observation_is_a_vector_of_one_and_trains(nested, tmp_path):
    """A Box of shape () crashed every network (IndexError: dimension out of range) where
    check-env said the agents train it."""
    env_id = f"{__name__}:Scalar"
    spec = rl_envs.spec_for(env_id, nested=nested)
    obs, _ = rl_envs.make(env_id, nested=nested).reset(seed=0)
    if nested:
        assert spec.obs["x"].shape == (1,) and obs["x"].shape == (1,) and obs["n"] == 0
    else:
        assert spec.obs.shape == (1,) and obs.shape == (1,)
    for agent in ("ppo", "dqn", "r2d2"):
        rlherd.train(agent, env_id, env_kwargs={"nested": nested}, total_steps=100,
                     run_dir=tmp_path / agent, progress=False)  # fmt: skip


class WrongShapes(Codes):
    """An observation of the wrong shape from reset() or step(), or a reward array."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)

    def __init__(self, fault: str):
        self.fault = fault

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(7 if self.fault == "reset" else 4, np.float32), {}

    def step(self, action):
        obs = np.zeros(7 if self.fault == "step" else 4, np.float32)
        obs[0] = np.nan if self.fault == "nan" else 0.0
        reward = {"reward": np.ones(2), "nan reward": np.nan, "no reward": None}.get(self.fault,
                                                                                   1.0)
        return obs, reward, False, False, {}


@pytest.mark.parametrize(("fault", "says"), [
    ("reset", r"reset\(\) returned an observation of shape \(7,\); its observation space says "
              r"\(4,\)"),
    ("step", r"step\(\) returned an observation of shape \(7,\)"),
    ("reward", r"step\(\) returned the reward array\(\[1\., 1\.\]\); a reward is one finite "
               "number"),
    ("nan reward", r"step\(\) returned the reward nan"),
    ("no reward", r"step\(\) returned the reward None"),
    ("nan", r"step\(\) returned an observation holding NaN or inf"),
])  # fmt: skip
def test_an_environment_off_its_own_spaces_is_one_line_naming_it(fault, says, tmp_path):
    """numpy's "Output array is the wrong shape" (or "setting an array element with a
    sequence"), from inside the batch, named neither the environment nor the shapes; a NaN
    from the environment was reported as training diverged, with a too high learning rate as
    the usual cause."""
    with pytest.raises(UnsupportedEnv, match=f"{__name__}:WrongShapes's {says}"):
        rlherd.train("ppo", f"{__name__}:WrongShapes", env_kwargs={"fault": fault},
                     total_steps=64, run_dir=tmp_path / "run", progress=False)  # fmt: skip


class OffCodes(Codes):
    """Codes outside their space: ``d`` 8 from a Discrete(3, start=5) at reset, ``m``'s second
    entry -2 from a MultiDiscrete([3, 4], start=-1) at a step, or a 12 in a grid of codes
    0 .. 9 (a ``grid``, embedded)."""

    def __init__(self, call: str):
        self.call = call
        if call == "grid":
            self.observation_space = gym.spaces.Dict(
                {**Codes.observation_space.spaces, "g": gym.spaces.Box(0, 9, (3, 3), np.int16)})

    def reset(self, *, seed=None, options=None):
        obs, info = super().reset(seed=seed)
        return dict(obs, d=8 if self.call == "reset" else 7, g=np.zeros((3, 3), np.int16)), info

    def step(self, action):
        obs, *outcome = super().step(action)
        grid = np.full((3, 3), 12 if self.call == "grid" else 0, np.int16)
        return dict(obs, m=np.array([0, -2 if self.call == "step" else 0], np.int32), g=grid), \
            *outcome


@pytest.mark.parametrize(("call", "says"), [
    ("reset", r"reset\(\) returned observation 'd' holding \[3\], outside the codes its space "
              r"declares \(below 3, a Discrete's counted from its start\)"),
    ("step", r"step\(\) returned observation 'm' holding \[-1\], outside the codes its space "
             r"declares \(below \[3, 4\]"),
    ("grid", r"step\(\) returned observation 'g' holding \[12\], outside the codes its space "
             r"declares \(below 10"),
])  # fmt: skip
def test_a_code_outside_its_space_is_one_line_naming_it(call, says):
    """torch's "Class values must be smaller than num_classes" (or "non-negative") from inside
    a network's one-hot, or "index out of range in self" from an embedding, named neither the
    environment nor the observation."""
    env = rl_envs.make(f"{__name__}:OffCodes", call=call)
    with pytest.raises(UnsupportedEnv, match=rf"{__name__}:OffCodes's {says}"):
        env.reset(seed=0)
        env.step(0)


class MissingKey(Codes):
    """A dict observation without one of its space's keys (nested: ``pose.speed``)."""

    observation_space = gym.spaces.Dict({
        "x": gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
        "pose": gym.spaces.Dict({"speed": gym.spaces.Box(-1.0, 1.0, (1,), np.float32)}),
    })  # fmt: skip

    def __init__(self, nested: bool):
        self.nested = nested

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.observation_space.sample(), {}

    def step(self, action):
        obs = {"x": np.zeros(2, np.float32), "pose": {}} if self.nested else {"pose": {
            "speed": np.zeros(1, np.float32)}}  # fmt: skip
        return obs, 1.0, False, False, {}


@pytest.mark.parametrize("nested", [False, True])
def test_a_dict_observation_without_a_key_of_its_space_is_one_line(nested, tmp_path):
    """The view that flattens dict observations failed on the missing key with a bare
    ``KeyError`` from inside rlherd."""
    key = "pose.speed" if nested else "x"
    with pytest.raises(UnsupportedEnv, match=rf"{__name__}:MissingKey's step\(\) returned an "
                                             rf"observation without '{key}'"):  # fmt: skip
        rlherd.train("ppo", f"{__name__}:MissingKey", env_kwargs={"nested": nested},
                     total_steps=64, run_dir=tmp_path / "run", progress=False)  # fmt: skip


@pytest.mark.parametrize("runtime", ["single", "poly"])
def test_an_environment_off_its_spaces_in_another_process_is_the_same_one_line(runtime, tmp_path):
    """With ``env_workers`` the refusal came back as the worker's traceback inside an
    ``EnvError``, not the one line the same fault gets in-process; an environment server
    named the environment twice."""
    workers = {"num_envs": 2, "env_workers": 2} if runtime == "single" else {}
    with pytest.raises(ConfigError) as refused:
        rlherd.train("ppo", f"{__name__}:WrongShapes", env_kwargs={"fault": "no reward"},
                     runtime=runtime, total_steps=64, run_dir=tmp_path / "run", progress=False,
                     **workers)  # fmt: skip
    assert re.match(rf"{__name__}:WrongShapes's step\(\) returned the reward None; a reward is "
                    "one finite number", str(refused.value)), refused.value  # fmt: skip


class Render(gym.Env):
    """Images laid out as renders are, channels-last (height, width, colour)."""

    observation_space = gym.spaces.Box(0, 255, (40, 40, 3), np.uint8)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.observation_space.sample(), {}

    def step(self, action):
        done = bool(self.np_random.random() < 0.1)
        return self.observation_space.sample(), 1.0, done, False, {}


@pytest.mark.parametrize("agent", ["ppo", "dqn", "impala"])
def test_agents_train_on_channels_last_images(agent, tmp_path):
    """A convolution made for channels-first frames got them: "Kernel size can't be greater
    than actual input size", from inside torch."""
    small = {"dqn": {"min_replay_size": 50},
             "ppo": {"batch_size": 1, "unroll_length": 32, "minibatches": 1}}.get(agent, {})
    run = rlherd.train(agent, f"{__name__}:Render", total_steps=200, progress=False,
                       run_dir=tmp_path / agent, **small)  # fmt: skip
    assert run.summary["learner_steps"] > 0


class Bits(gym.Env):
    """Three switches, each on or off (MultiBinary): one point a step for each set as 1, 0, 1."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.MultiBinary(3)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        assert self.action_space.contains(np.asarray(action, np.int8)), action
        self.t += 1
        right = float(np.sum(np.asarray(action) == (1, 0, 1)))
        return np.zeros(2, np.float32), right, self.t >= 10, False, {}


def test_ppo_learns_switches_of_a_multibinary_action_space(tmp_path):
    """MultiBinary actions (n choices of two, as MultiDiscrete([2] * n)) were refused."""
    run = rlherd.train("ppo", f"{__name__}:Bits", total_steps=5_000, seed=0, num_envs=2,
                       env_workers=2, run_dir=tmp_path / "run", progress=False)  # fmt: skip
    assert run.summary["actor_steps"] >= 5_000
    assert evaluate(tmp_path / "run", episodes=5)["eval_return_mean"] == 30.0  # all right


def test_check_env_names_a_multibinary_action_space_as_declared():
    """check-env showed MultiBinary(3) only as MultiDiscrete([2, 2, 2]), the space no line of
    the user's code declares, beside refusals that call its actions multidiscrete."""
    from rlherd.commands.check_env import check

    action = check(f"{__name__}:Bits", seconds=0.1)["action"]
    assert action == "MultiBinary(3), acted in as MultiDiscrete([2, 2, 2])"


class OldAPI(Codes):
    """The old Gym API: ``reset()`` returns the observation alone, ``step()`` four values."""

    def __init__(self, call: str):
        self.call = call

    def reset(self, *, seed=None, options=None):
        obs, info = super().reset(seed=seed)
        return obs if self.call == "reset" else (obs, info)

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        return (obs, reward, terminated, info) if self.call == "step" else (
            obs, reward, terminated, truncated, info)  # fmt: skip


# Registered, it is made inside gymnasium's own wrappers (TimeLimit unpacks a step's values).
gym.register("test_your_env/OldAPI-v0", entry_point=OldAPI, max_episode_steps=50)


@pytest.mark.parametrize(("call", "says"), [
    ("reset", r"reset\(\) returned a dict, not Gymnasium's \(observation, info\)"),
    ("step", r"step\(\) returned 4 values, not Gymnasium's \(observation, reward, terminated, "
             r"truncated, info\)"),
])  # fmt: skip
@pytest.mark.parametrize("env_id", [f"{__name__}:OldAPI", "test_your_env/OldAPI-v0"])
def test_the_old_gym_api_is_one_line_naming_the_fix(call, says, env_id, tmp_path):
    """numpy's "not iterable" from looking for an action mask, and "not enough values to
    unpack" from inside the batch (or inside gymnasium's TimeLimit)."""
    with pytest.raises(UnsupportedEnv, match=rf"{env_id.split('/')[0]}.*'s {says}"):
        rlherd.train("ppo", env_id, env_kwargs={"call": call}, total_steps=64,
                     run_dir=tmp_path / "run", progress=False)  # fmt: skip


class NoSeed(Codes):
    """A ``reset()`` of the old Gym API, which takes no ``seed`` (``env.seed(s)`` did that)."""

    def reset(self):
        return super().reset()


def test_a_reset_that_takes_no_seed_is_one_line_naming_the_fix():
    """Every vector env resets with ``seed=`` and ``options=``: Python's TypeError from inside
    rlherd's wrappers named neither the environment nor Gymnasium's signature."""
    with pytest.raises(UnsupportedEnv, match=rf"{__name__}:NoSeed's reset\(\) does not take "
                                             r"seed=, options= as Gymnasium's does: define it as "
                                             r"reset\(self, \*, seed=None, options=None\)"):
        rl_envs.make(f"{__name__}:NoSeed").reset(seed=0)


class NoInfo(Codes):
    """A step whose info is None, where Gymnasium's is a dict."""

    def step(self, action):
        return *super().step(action)[:4], None


def test_a_step_whose_info_is_not_a_dict_is_one_line_naming_the_fix(tmp_path):
    """Python's "argument of type 'NoneType' is not iterable" from inside the check for a late
    action mask, named neither the environment nor what to return."""
    with pytest.raises(UnsupportedEnv, match=rf"{__name__}:NoInfo's step\(\) returned the info "
                                             r"None, not a dict: return \{\}"):
        rlherd.train("ppo", f"{__name__}:NoInfo", total_steps=64, run_dir=tmp_path / "run",
                     progress=False)  # fmt: skip


def test_an_id_registered_by_ones_own_module_is_recorded_with_it(tmp_path):
    """A bare id that code of one's own registered was recorded bare, so ``rlherd eval`` and
    ``--resume`` (processes that never imported the module) called it unknown."""
    run = rlherd.train("ppo", "test_your_env/NoRenderMode-v0", total_steps=64,
                       run_dir=tmp_path / "run", progress=False)  # fmt: skip
    assert run.config.env == f"{__name__}:test_your_env/NoRenderMode-v0"
    resumed = rlherd.train("ppo", "test_your_env/NoRenderMode-v0", resume=run.path,
                           total_steps=128, progress=False)  # the id as it was given  # fmt: skip
    assert resumed.summary["actor_steps"] >= 128
    out = subprocess.run([sys.executable, "-m", "rlherd.cli", "eval", str(run.path), "--episodes",
                          "1"], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, PYTHONPATH=os.path.dirname(__file__)))  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert rlherd.train("ppo", "CartPole-v1", total_steps=64, run_dir=tmp_path / "gym",
                        progress=False).config.env == "CartPole-v1"  # fmt: skip
    # One registered by the script that runs, or by a module other than its entry point's,
    # cannot be made by the run's other processes.
    in_main = type("InMain", (NoRenderMode,), {"__module__": "__main__"})
    gym.register("test_your_env/InMain-v0", entry_point=in_main)
    gym.register("test_your_env/Elsewhere-v0", entry_point="mixed_env:MixedCorridor")
    cartpole = "gymnasium.envs.classic_control.cartpole"  # an entry point rlherd's processes know
    gym.register("test_your_env/LongCartPole-v0", entry_point=f"{cartpole}:CartPoleEnv",
                 max_episode_steps=2000)  # fmt: skip
    for env_id, module in (("test_your_env/InMain-v0", "__main__"),
                           ("test_your_env/Elsewhere-v0", "mixed_env"),
                           ("test_your_env/LongCartPole-v0", cartpole)):  # fmt: skip
        with pytest.raises(ConfigError, match=f"registered by code this process ran, not by "
                           f"importing {module} alone"):  # fmt: skip
            rl_envs.resolve(env_id)


def test_a_fresh_process_that_cannot_list_the_ids_says_what_it_said(tmp_path, monkeypatch):
    """Asking a fresh process which ids every process knows failed as a bare
    CalledProcessError, the child's own words (why it failed) dropped."""
    broken = tmp_path / "python"
    broken.write_text("#!/bin/sh\necho 'ModuleNotFoundError: No module named rlherd' >&2\nexit 1\n")
    broken.chmod(0o755)
    ids._ids_known.cache_clear()
    monkeypatch.setattr(sys, "executable", str(broken))
    try:
        with pytest.raises(RuntimeError, match="could not list the ids rlherd registers "
                           r"\(CalledProcessError\); it said: ModuleNotFoundError: No module "
                           "named rlherd"):  # fmt: skip
            ids._ids_known(False)
    finally:
        ids._ids_known.cache_clear()


def test_a_human_render_of_a_masked_environment_is_made_and_forgets_nothing():
    """rlherd does not reset an environment drawn for a human to look for its mask: its
    reset's mask was then refused as one given "from step() but not from reset()", and the id's
    later makes in the process remembered it had none."""
    env = rl_envs.make(f"{__name__}:HumanView", render_mode="human")
    env.reset(seed=0)
    env.step(env.unwrapped.legal)
    obs, _ = rl_envs.make(f"{__name__}:HumanView").reset(seed=0)
    assert obs["action_mask"].sum() == 1


def test_an_environment_that_takes_no_render_mode_trains_and_plays(tmp_path):
    """rlherd passed ``render_mode=None`` to every registered id, and gym.make handed it on:
    TypeError, where ``gym.make(id)`` made it."""
    env_id = f"{__name__}:test_your_env/NoRenderMode-v0"
    rl_envs.make(env_id).reset(seed=0)
    run = rlherd.train("ppo", env_id, total_steps=64, run_dir=tmp_path / "run", progress=False)
    assert evaluate(run.path, episodes=1)["eval_episodes"] == 1


@pytest.mark.parametrize("env_id", [f"{__name__}:test_your_env/NoRenderMode-v0",
                                    f"{__name__}:NoRenderMode"])  # fmt: skip
def test_a_video_of_an_environment_that_takes_no_render_mode_says_so(env_id):
    """A registered id whose constructor takes no render_mode, made for ``rlherd eval --video``,
    was gymnasium's TypeError with its traceback; made by its class, a line about options
    nobody gave."""
    with pytest.raises(ConfigError, match=r"does not take the options \{'render_mode': "
                                          r"'rgb_array'\}: .*; --video makes it with "
                                          r"render_mode='rgb_array': take render_mode in its "
                                          r"constructor, or drop --video"):  # fmt: skip
        rl_envs.make(env_id, render_mode="rgb_array")


@rlherd.env_factory
def codes() -> gym.Env:
    return Codes()


@rlherd.env_factory
def wrapping(env_id: str = "CartPole-v1", render_mode: str | None = None) -> gym.Env:
    """A factory whose own option is called ``env_id``, as a wrapper of other ids' often is."""
    return gym.make(env_id, render_mode=render_mode)


@rlherd.env_factory
def not_an_env() -> str:
    return "a string"


def unmarked_env(**options) -> gym.Env:
    """CartPole, from a function that is not marked as an environment factory."""
    return gym.make("CartPole-v1")


@rlherd.env_factory
def buggy_env(size: int = 3) -> gym.Env:
    """Takes its option, then fails inside: the factory's bug, not the user's option."""
    return gym.make("CartPole-v1", size=size)  # CartPole takes no size: a TypeError


ONE_LEGAL = f"{__name__}:one_legal_action"


@pytest.mark.parametrize("source", ["obs", "info", "method", "wrapper"])
def test_a_mask_from_any_of_its_three_places_reaches_the_observation(source):
    env = rl_envs.make(ONE_LEGAL, source=source)
    spec = rl_envs.spec_of(env, ONE_LEGAL)
    assert spec.has_action_mask and spec.obs[F.ACTION_MASK].shape == (5,)
    obs, _ = env.reset(seed=0)
    for _ in range(20):
        assert obs[F.ACTION_MASK].sum() == 1
        obs, *_ = env.step(int(np.argmax(obs[F.ACTION_MASK])))
    if source != "obs":  # an array observation joins the mask under "observation"
        assert set(obs) == {"observation", F.ACTION_MASK}


class MaskedDials(OneLegalAction):
    """OneLegalAction's mask (in the observation, or from ``action_masks()``) beside actions that
    are not one Discrete: MultiDiscrete dials, as MaskablePPO masks them."""

    def __init__(self, source: str):
        super().__init__(source)
        self.action_space = gym.spaces.MultiDiscrete([2, 3])

    def action_masks(self) -> np.ndarray:
        return np.ones(5, dtype=bool)


@pytest.mark.parametrize(("source", "where"), [
    ("obs", "its observation's action_mask"), ("method", r"its action_masks\(\)"),
])  # fmt: skip
def test_a_mask_of_actions_no_agent_masks_is_refused_not_ignored(source, where):
    """PPO trained on MultiDiscrete actions with the mask as one more input, playing illegal
    actions in silence; check-env failed on Gymnasium's assertion from sampling with it."""
    with pytest.raises(UnsupportedEnv, match=rf"{__name__}:MaskedDials: {where} would be ignored, "
                                             r"as rlherd honours action masks of Discrete actions "
                                             r"only, and its actions are MultiDiscrete"):
        rl_envs.make(f"{__name__}:MaskedDials", source=source)


def test_codes_count_from_zero_in_int64_whatever_their_start():
    env = rl_envs.make(f"{__name__}:codes")
    obs, _ = env.reset(seed=0)
    assert obs["d"] == 2 and obs["m"].tolist() == [0, 3] and obs["m"].dtype == np.int64
    spec = rl_envs.spec_of(env)
    assert (spec.obs["d"].categories, spec.obs["m"].categories) == (3, 4)
    torso = make_torso(spec)  # one-hots index 0 .. categories - 1
    batch = F.map_obs(lambda x: torch.as_tensor(np.asarray(x))[None], env.step(0)[0])
    assert torso(batch).shape == (1, 64)


def test_a_grid_of_codes_is_carried_without_gymnasiums_length_warning():
    """Leaves were kept by the truth of their space, which is its ``len()``: a 2-D MultiDiscrete
    warned "Getting the length of a multi-dimensional MultiDiscrete space" when the run started
    and from every process that stepped it, though nobody asked its length."""
    space = gym.spaces.MultiDiscrete([[3, 4], [5, 2]], start=[[1, 0], [0, -1]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        flat, dropped = flatten_space(space)
        value = flatten_value(space, np.array([[1, 3], [4, 0]]))
    assert list(flat) == [OBS_KEY] and flat[OBS_KEY].shape == (2, 2) and not dropped
    assert value[OBS_KEY].tolist() == [[0, 3], [4, 1]]


def test_two_arrays_named_alike_once_flattened_are_refused_naming_the_key():
    """A key holding "." beside a nested one flatten to the same name: one array overwrote the
    other in every observation, in silence (the spec kept one of their shapes)."""
    space = gym.spaces.Dict({"a.b": gym.spaces.Box(-1, 1, (2,)),
                             "a": gym.spaces.Dict({"b": gym.spaces.Box(-1, 1, (3,))})})  # fmt: skip
    with pytest.raises(UnsupportedEnv, match=r"two arrays of the observation are both named "
                                             r"'a\.b' once its nested keys are joined with '\.'"):
        flatten_space(space)
    # Made by rlherd, the line names the environment.
    gym.register("test_your_env/DotKeys-v0", entry_point=lambda: _Spaces(space))
    with pytest.raises(UnsupportedEnv, match=r"two arrays of test_your_env/DotKeys-v0's "
                                             r"observation are both named 'a\.b'"):
        rl_envs.make("test_your_env/DotKeys-v0")


class _Spaces(gym.Env):
    """An environment of ``observation_space`` and two actions, never stepped."""

    action_space = gym.spaces.Discrete(2)

    def __init__(self, observation_space: gym.Space):
        self.observation_space = observation_space


def test_ids_of_installed_packages_resolve_to_their_module():
    assert rl_envs.resolve("MiniGrid-Empty-5x5-v0") == "minigrid:MiniGrid-Empty-5x5-v0"
    assert rl_envs.resolve("NetHackScore-v0") == "nle:NetHackScore-v0"
    assert rl_envs.resolve("minigrid:MiniGrid-Empty-5x5-v0") == "minigrid:MiniGrid-Empty-5x5-v0"
    assert rl_envs.resolve("CartPole-v1") == "CartPole-v1"
    assert rl_envs.family("minigrid:MiniGrid-DoorKey-5x5-v0") == "minigrid"
    assert rl_envs.family("nle:NetHackScore-v0") == "nethack"
    assert rl_envs.family("Taxi-v3") == "toytext"
    env = rl_envs.make("minigrid:MiniGrid-Empty-5x5-v0")
    assert set(env.observation_space.spaces) == {"image", "direction"}


def test_ids_that_cannot_be_found_name_the_fix(monkeypatch):
    with pytest.raises(ConfigError, match="Did you mean: MiniGrid-DoorKey-5x5-v0"):
        rl_envs.make("minigrid:MiniGrid-DoorKey-5x5-v9")
    with pytest.raises(MissingExtra, match="no_such_package.*not found.*PYTHONPATH=."):
        rl_envs.make("no_such_package:Env-v0")
    # An id one's own module registers, run without it, is near no known id but by a few
    # letters: the line names the MODULE:ID form; a typo of a known id is left at the typo.
    with pytest.raises(ConfigError, match=r"name the module that does, MODULE:ProbeMask-v0\.$"):
        rl_envs.make("ProbeMask-v0")
    with pytest.raises(ConfigError, match=r"Did you mean: CartPole-v1, CartPole-v0\?$"):
        rl_envs.make("Cartpole")
    real = ids.importlib.util.find_spec
    monkeypatch.setattr(ids.importlib.util, "find_spec",
                        lambda name: None if name == "nle" else real(name))  # fmt: skip
    monkeypatch.setattr(gym, "registry", {k: v for k, v in gym.registry.items()
                                          if not k.startswith("NetHack")})  # fmt: skip
    with pytest.raises(MissingExtra, match=r"pip install 'rlherd\[nethack\]'"):
        rl_envs.resolve("NetHackScore-v0")


def test_an_environment_object_is_refused_naming_what_to_pass_instead():
    """It was "env must be an id or an environment factory, not <TimeLimit<...>>": which of
    them, and why not the object, it did not say."""
    with pytest.raises(ConfigError, match=r"environment object \(a CartPoleEnv\); a run makes its "
                       r"environments in every process it starts, so pass what makes it: its "
                       r"id, 'CartPole-v1', or a module-level function"):  # fmt: skip
        rlherd.train("ppo", gym.make("CartPole-v1"), total_steps=64, progress=False)


def test_factories_travel_as_import_paths_and_bad_ones_are_clear_errors():
    assert rl_envs.resolve(one_legal_action) == ONE_LEGAL

    def nested():
        return OneLegalAction()

    for bad in (nested, lambda: OneLegalAction()):
        with pytest.raises(ConfigError, match="top level of a module"):
            rl_envs.resolve(bad)
    with pytest.raises(ConfigError, match="an id or an environment factory"):
        rl_envs.resolve(42)
    with pytest.raises(ConfigError, match="not a gymnasium.Env"):
        rl_envs.make(f"{__name__}:not_an_env")
    with pytest.raises(ConfigError, match="does not take the options"):
        rl_envs.make(ONE_LEGAL, colour="blue")
    with pytest.raises(ConfigError, match="registered no environment 'nothing_here'"):
        rl_envs.make(f"{__name__}:nothing_here")
    # A function not marked as an environment factory is never called: a run's record could
    # name any function (os:system) with any options. It was called, sqrt() with no argument.
    for unmarked in ("math:sqrt", "os:system", f"{__name__}:unmarked_env"):
        with pytest.raises(ConfigError, match=f"'{unmarked}' is not marked as an environment "
                           "factory: put @rlherd.env_factory above"):  # fmt: skip
            rl_envs.make(unmarked, command="true")
    with pytest.raises(ConfigError, match="not marked as an environment factory"):
        rlherd.train("dqn", unmarked_env, total_steps=100, progress=False)
    with pytest.raises(TypeError, match="size") as inside:  # keeps its traceback
        rl_envs.make(f"{__name__}:buggy_env", size=4)
    assert not isinstance(inside.value, ConfigError)


@pytest.mark.parametrize("runtime", ["single", "mono"])
def test_a_factorys_options_may_be_named_like_rlherds_own_arguments(runtime, tmp_path):
    """Options go to the factory whatever their names: ``env_id`` collided with the id
    parameter of ``rlherd.envs.make`` and ``spec_for`` ("got multiple values")."""
    run = rlherd.train("dqn", wrapping, runtime=runtime, total_steps=200, progress=False,
                       run_dir=tmp_path / "run", env_kwargs=dict(env_id="Acrobot-v1"))  # fmt: skip
    assert run.summary["actor_steps"] >= 200
    assert rl_envs.spec_for(f"{__name__}:wrapping", env_id="Acrobot-v1").obs_shape == (6,)


@pytest.mark.parametrize("runtime", ["mono", "poly",
                                     pytest.param("distributed", marks=pytest.mark.ray)])
def test_a_factory_trains_in_other_processes_and_the_run_records_its_path(runtime, tmp_path):
    """This test module is importable here only (pytest put its folder on sys.path): actor
    processes, environment servers and Ray workers import it all the same; and the caller's
    ``PYTHONPATH`` is as it was (an embedded Ray starts with the import path in it)."""
    path = os.environ.get("PYTHONPATH")
    run = rlherd.train("ppo", one_legal_action, runtime=runtime, total_steps=600, seed=0,
                       run_dir=tmp_path / "run", progress=False, num_actors=2,
                       envs_per_actor=1)  # fmt: skip
    assert os.environ.get("PYTHONPATH") == path
    assert json.loads((run.path / "config.json").read_text())["env"] == ONE_LEGAL
    assert run.summary["actor_steps"] >= 600


@rlherd.env_factory
def cartpole_if_marked(mark: str) -> gym.Env:
    """CartPole, where this process's ``RLHERD_TEST_MARK`` is ``mark``; said on stderr."""
    found = os.environ.get("RLHERD_TEST_MARK")
    if found != mark:
        raise ValueError(f"RLHERD_TEST_MARK is {found!r}, not {mark!r}")
    print(f"cartpole for {mark} in {os.getpid()}", file=sys.stderr, flush=True)
    return gym.make("CartPole-v1")


def test_mono_actors_take_the_callers_environment_and_stderr_as_they_are_at_each_run(
        tmp_path, monkeypatch):  # fmt: skip
    """Actors fork from a server that outlives a run (an earlier run here, or a test before,
    started it): its environment and standard error are not those a later run's caller has."""
    for mark in ("first", "second"):
        monkeypatch.setenv("RLHERD_TEST_MARK", mark)
        err = tmp_path / f"{mark}.err"
        saved = os.dup(2)
        with open(err, "w") as f:
            os.dup2(f.fileno(), 2)
            try:
                run = rlherd.train("ppo", cartpole_if_marked, env_kwargs={"mark": mark},
                                   runtime="mono", total_steps=400, seed=0, progress=False,
                                   run_dir=tmp_path / mark, num_actors=1, envs_per_actor=2)
            finally:
                os.dup2(saved, 2)
                os.close(saved)
        assert run.summary["actor_steps"] >= 400
        said = [line.split()[-1] for line in err.read_text().splitlines()
                if line.startswith(f"cartpole for {mark} in ")]  # fmt: skip
        assert set(said) - {str(os.getpid())}, "no actor's line reached this run's stderr"


def test_mono_actors_import_what_the_command_imports_not_its_working_directory(tmp_path):
    """The ``rlherd`` command has no working directory on its import path; the fork server its
    actors come from (``python -c``) would put it first, and import a ``json.py`` there."""
    (tmp_path / "json.py").write_text("raise SystemExit('imported json.py from the cwd')\n")
    as_the_command = "import sys, runpy; del sys.path[0]; runpy.run_module('rlherd.cli', " \
                     "run_name='__main__')"  # fmt: skip
    out = subprocess.run([sys.executable, "-c", as_the_command, "train", "impala", "--env",
                          "CartPole-v1", "--runtime", "mono", "--total-steps", "500",
                          "--run-dir", str(tmp_path / "run"), "--no-progress"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]


def test_a_run_never_imports_a_module_from_its_own_directory(tmp_path, monkeypatch):
    run = tmp_path / "run"
    run.mkdir()
    (run / "evil.py").write_text("raise SystemExit('ran code from a run directory')\n")
    monkeypatch.syspath_prepend(str(run))  # as `python -m` from inside it would
    with pytest.raises(ConfigError, match="from inside the run directory"):
        rl_envs.check_recorded("evil:make_env", run)
    with pytest.raises(MissingExtra, match="not found here"):
        rl_envs.check_recorded("not_a_module_anywhere:Env-v0", run)
    rl_envs.check_recorded("minigrid:MiniGrid-Empty-5x5-v0", run)  # installed: fine


def test_a_leaf_that_is_not_an_array_is_left_out_with_one_notice(tmp_path):
    with pytest.warns(ObservationNotice, match="left out of the observation: mission"):
        rlherd.train("ppo", "MiniGrid-Empty-5x5-v0", total_steps=64, run_dir=tmp_path / "run",
                     progress=False)  # fmt: skip
    spec = rl_envs.spec_for("minigrid:MiniGrid-Empty-5x5-v0")
    assert spec.dropped == ("mission",) and "mission" not in spec.obs
    # At a terminal the notice is its one line, not where in rlherd it was raised
    out = subprocess.run([sys.executable, "-m", "rlherd.cli", "train", "ppo", "--env",
                          "MiniGrid-Empty-5x5-v0", "--total-steps", "64", "--no-progress",
                          "--run-dir", str(tmp_path / "cli")], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    lines = out.stderr.splitlines()
    assert any(line.startswith("rlherd: minigrid:MiniGrid-Empty-5x5-v0: left out of the "
                               "observation: mission") for line in lines), lines  # fmt: skip
    assert not any("ObservationNotice" in line or "run = train(" in line for line in lines), lines
    other = one_line("from elsewhere", DeprecationWarning, "lib.py", 7, "old()")
    assert other == "lib.py:7: DeprecationWarning: from elsewhere\n  old()\n"  # Python's form


@pytest.mark.parametrize("agent", ["ppo", "impala", "dqn"])
def test_codes_alone_are_read_as_codes(agent, tmp_path):
    """A Discrete observation alone (FrozenLake's cell) is a dict of one array, one-hot encoded
    like any dict's codes (an MLP once got its raw integer, and failed on its shape)."""
    spec = rl_envs.spec_for("FrozenLake-v1")
    assert spec.structured and set(spec.obs) == {"observation"}
    assert spec.obs["observation"].categories == 16
    run = rlherd.train(agent, "FrozenLake-v1", total_steps=300, run_dir=tmp_path / "run",
                       progress=False)  # fmt: skip
    assert run.summary["actor_steps"] >= 300


# ------------------------------------------------------------------------------ round trips
def _episode(seed: int, steps: int):
    """A MixedCorridor episode as rlherd carries it: observations (flattened dicts) and
    actions."""
    env = rl_envs.make(MIXED)
    obs, _ = env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    observations, actions = [obs], []
    for _ in range(steps):
        actions.append(int(rng.integers(2)))
        obs, _, terminated, truncated, _ = env.step(actions[-1])
        observations.append(obs)
        if terminated or truncated:
            break
    return observations, actions


def test_a_nested_observation_is_one_level_of_arrays_in_their_own_dtypes():
    spec = rl_envs.spec_for(MIXED)
    dtypes = {k: leaf.dtype.name for k, leaf in spec.obs.items()}
    assert dtypes == {"image": "uint8", "agent.cell": "int64", "agent.to_goal": "int16",
                      "agent.stats": "int64", "agent.grid": "int64", "visited": "int8",
                      "at_wall": "bool", "noise": "float32"}  # fmt: skip
    obs, _ = _episode(0, 1)
    assert obs[0]["agent.cell"] == 0  # Discrete(start=1) counted from 0
    assert obs[0]["agent.stats"][0] == 2**40  # not representable in float32 beside 2**40 + 1


def _write_rollout(buffer, seed, steps):
    """In a child process: write an episode's observations into shared-memory rollout rows."""
    observations, _ = _episode(seed, steps)
    writer = RolloutWriter(buffer, lambda full: {k: v.clone() for k, v in full.items()})
    for obs in observations[: steps + 1]:
        fields = F.obs_fields(F.OBS, F.map_obs(lambda x: torch.as_tensor(np.asarray(x))[None],
                                               obs))  # fmt: skip
        if not writer.add_row(**fields):
            no = torch.zeros(1, dtype=torch.bool)
            writer.add_outcome(torch.zeros(1), no, no)


def test_shared_memory_rollouts_carry_dict_observations_exactly():
    spec = rl_envs.spec_for(MIXED)
    steps = 4
    buffer = allocate_rollout(rollout_layout(spec, {}), steps, 1, share_memory=True)
    child = mp.get_context("spawn").Process(target=_write_rollout, args=(buffer, 7, steps))
    child.start()
    child.join(60)
    assert child.exitcode == 0
    observations, _ = _episode(7, steps)
    for t, expected in enumerate(observations[: steps + 1]):
        got = F.map_obs(lambda x, t=t: x[t, 0].numpy(), F.obs_of(buffer))
        assert_same(F.map_obs(np.asarray, expected), got)


def _table(signature):
    return Table("t", signature, 1_000, sampler=Fifo(), remover=Fifo(), max_times_sampled=1,
                 rate_limiter=MinSize(1))  # fmt: skip


def test_replay_items_carry_dict_observations_exactly():
    spec = rl_envs.spec_for(MIXED)
    observations, actions = _episode(3, 30)
    steps = len(actions)
    n_step = _table(NStepTransitionAdder.signature(spec))
    sequences = _table(SequenceAdder.signature(spec, 4))
    episodes = _table(EpisodeAdder.signature(spec, 32))
    adders = [NStepTransitionAdder(n_step, 2, 0.9), SequenceAdder(sequences, 4, 4),
              EpisodeAdder(episodes, 32)]  # fmt: skip
    for adder in adders:
        adder.add_first(observations[0])
        for t, action in enumerate(actions):
            last = t == steps - 1
            adder.add(action, 0.0, observations[t + 1], False, last)
    for t in range(steps):  # transitions: one per step, in order
        item = n_step.sample(1).data
        assert_same(F.map_obs(np.asarray, observations[t]),
                    F.map_obs(lambda x: x[0], F.obs_of(item, "obs")))  # fmt: skip
        following = observations[min(t + 2, steps)]
        assert_same(F.map_obs(np.asarray, following),
                    F.map_obs(lambda x: x[0], F.obs_of(item, "next_obs")))  # fmt: skip
    episode = episodes.sample(1).data
    for t, expected in enumerate(observations):
        assert_same(F.map_obs(np.asarray, expected),
                    F.map_obs(lambda x, t=t: x[0, t], F.obs_of(episode, "obs")))  # fmt: skip
    first = sequences.sample(1).data
    assert_same(F.map_obs(np.asarray, observations[0]),
                F.map_obs(lambda x: x[0, 0], F.obs_of(first, "obs")))  # fmt: skip
    assert set(obs_signature(spec, "obs")) == {f"obs.{k}" for k in spec.obs}


def test_environment_workers_carry_dict_observations_exactly():
    ours = rl_envs.make_vector(MIXED, 3, workers=2)
    theirs = rl_envs.make_vector(MIXED, 3)
    try:
        assert_same(theirs.reset(seed=5)[0], ours.reset(seed=5)[0])
        rng = np.random.default_rng(0)
        for _ in range(30):
            action = rng.integers(2, size=3)
            assert_same(theirs.step(action)[0], ours.step(action)[0])
    finally:
        ours.close()


# ------------------------------------------------------------------------------ masked losses
def _naive_masked(logits, mask):
    """The distribution over the legal actions alone, written out."""
    rows = []
    for row, legal in zip(logits.tolist(), mask.tolist(), strict=True):
        exp = [np.exp(x) if ok else 0.0 for x, ok in zip(row, legal, strict=True)]
        rows.append([e / sum(exp) for e in exp])
    return np.array(rows)


def test_masked_log_probability_entropy_and_kl_are_over_the_legal_actions():
    torch.manual_seed(0)
    logits = torch.randn(6, 5, dtype=torch.float64).float()
    mask = torch.rand(6, 5) < 0.5
    mask[:, 2] = True  # at least one legal action per row
    p = _naive_masked(logits, mask)
    masked = mask_logits(logits, mask)
    action = torch.tensor([2] * 6)
    expected_log_prob = np.log(p[np.arange(6), 2])
    assert np.allclose(Categorical.log_prob(masked, action).numpy(), expected_log_prob, atol=1e-6)
    expected_entropy = [-sum(q * np.log(q) for q in row if q > 0) for row in p]
    assert np.allclose(Categorical.entropy(masked).numpy(), expected_entropy, atol=1e-6)
    other = mask_logits(torch.randn(6, 5), mask)
    q = _naive_masked(other, mask)
    expected_kl = [sum(a * np.log(a / b) for a, b in zip(r, s, strict=True) if a > 0)
                   for r, s in zip(p, q, strict=True)]  # fmt: skip
    assert np.allclose(Categorical.kl(masked, other).numpy(), expected_kl, atol=1e-5)
    assert torch.isfinite(Categorical.entropy(masked)).all()
    grad = torch.zeros_like(logits, requires_grad=True)
    Categorical.entropy(mask_logits(logits + grad, mask)).sum().backward()
    assert (grad.grad[~mask] == 0).all()  # no gradient reaches an illegal action


def test_masked_sampling_never_draws_an_illegal_action(monkeypatch):
    mask = torch.tensor([[False, False, True, True], [False, True, False, False]])
    logits = mask_logits(torch.zeros(2, 4), mask)
    draws = torch.stack([sample_categorical(logits) for _ in range(500)])
    assert mask.gather(1, draws.T).all()
    # A uniform draw of exactly 0 once picked the first action, legal or not.
    monkeypatch.setattr(torch, "rand", lambda *a, **k: torch.zeros(2, 1))
    assert sample_categorical(logits).tolist() == [2, 1]
    assert (logits[~mask] == MASKED_LOGIT).all()


def test_masked_q_targets_against_naive_references():
    torch.manual_seed(1)
    B, A = 7, 4
    q_tm1, q_t, selector = torch.randn(B, A), torch.randn(B, A), torch.randn(B, A)
    a_tm1, reward, discount = torch.randint(A, (B,)), torch.randn(B), torch.rand(B)
    mask = torch.rand(B, A) < 0.5
    mask[:, 1] = True

    def best(row, legal):
        return max((v for v, ok in zip(row, legal, strict=True) if ok))

    def argbest(row, legal):
        return max((i for i in range(A) if legal[i]), key=lambda i: row[i])

    expected = [reward[b] + discount[b] * best(q_t[b].tolist(), mask[b].tolist())
                - q_tm1[b, a_tm1[b]] for b in range(B)]  # fmt: skip
    got = q_learning_td(q_tm1, a_tm1, reward, discount, q_t, mask)
    assert torch.allclose(got, torch.tensor(expected), atol=1e-6)
    expected = [reward[b] + discount[b] * q_t[b, argbest(selector[b].tolist(), mask[b].tolist())]
                - q_tm1[b, a_tm1[b]] for b in range(B)]  # fmt: skip
    got = double_q_learning_td(q_tm1, a_tm1, reward, discount, q_t, selector, mask)
    assert torch.allclose(got, torch.tensor(expected), atol=1e-6)
    # Without the mask the targets differ somewhere (the test can see the mask's absence).
    assert not torch.allclose(q_learning_td(q_tm1, a_tm1, reward, discount, q_t), got)
    assert [argbest(r, m) for r, m in zip(q_t.tolist(), mask.tolist(), strict=True)] == \
        greedy_action(q_t, mask).tolist()  # fmt: skip
    margin = 0.8
    expected = [max(q_tm1[b, a] + (0 if a == a_tm1[b] else margin)
                    for a in range(A) if mask[b, a] or a == a_tm1[b]) - q_tm1[b, a_tm1[b]]
                for b in range(B)]  # fmt: skip
    got = large_margin(q_tm1, a_tm1, margin, mask)
    assert torch.allclose(got, torch.tensor(expected), atol=1e-6)


def test_exploration_draws_only_legal_actions_and_all_of_them():
    rng = np.random.default_rng(0)
    mask = np.array([[0, 1, 0, 1, 1], [1, 0, 0, 0, 0]], np.int8)
    taken = np.stack([explore(rng, np.array([1, 0]), 1.0, {"action_mask": mask}, 5)
                      for _ in range(600)])  # fmt: skip
    assert set(taken[:, 0]) == {1, 3, 4} and set(taken[:, 1]) == {0}
    space = gym.spaces.Discrete(5, seed=0)
    assert {sample_action(space, {"action_mask": mask[0]}) for _ in range(200)} == {1, 3, 4}


# ------------------------------------------------------------------------------ masked agents
@pytest.mark.parametrize("agent", ["impala", "ppo", "dqn", "r2d2", "mcts"])
@pytest.mark.parametrize("source", ["obs", "info"])
def test_an_agent_never_takes_an_illegal_action(agent, source, tmp_path):
    """One legal action per step, the environment raises on any other: training (exploring
    from the first step) and greedy evaluation both go through without an error."""
    run = rlherd.train(agent, ONE_LEGAL, total_steps=1_500, seed=0, run_dir=tmp_path / "run",
                       progress=False, eval_every=1_000, eval_episodes=3,
                       env_kwargs=dict(source=source))  # fmt: skip
    assert run.summary["actor_steps"] >= 1_500 and run.summary["eval_return_mean"] == 10.0


@pytest.mark.parametrize("agent", ["dqfd", "r2d3"])
def test_agents_with_demonstrations_never_take_an_illegal_action(agent, tmp_path, monkeypatch):
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    from rlherd.commands.collect import collect

    collect(None, "onelegal/random-v0", 20, env=ONE_LEGAL, progress=False)  # random legal
    run = rlherd.train(agent, ONE_LEGAL, total_steps=1_500, seed=0, run_dir=tmp_path / "run",
                       progress=False, demonstrations="onelegal/random-v0")  # fmt: skip
    assert run.summary["actor_steps"] >= 1_500


# ------------------------------------------------------------------------------ check-env
def _check_env(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlherd.cli", "check-env", *args, "--seconds",
                           "0.2"], capture_output=True, text=True, timeout=300)  # fmt: skip


@pytest.mark.parametrize("env, shown", [
    # NLE 1.3.0 fails Gymnasium's checker (reset(options={}) raises KeyError 'wizkit_items'),
    # which is reported; rlherd never resets it with options, and trains it.
    ("NetHackScore-v0", ["env checker: FAILED", "KeyError: 'wizkit_items'",
                         "glyphs: (21, 79) int16 box (5977 values) -> embed",
                         "blstats: (27,) int64 box -> flat",
                         "impala: single, mono, poly, distributed",
                         # MCTS's simulator copies the environment, which NetHack's files
                         # stop, and its learned model predicts one array, not NetHack's dict
                         "mcts: no: MCTS cannot train nle:NetHackScore-v0, as neither of its "
                         "models can search it: model=simulator copies the environment at every "
                         "node, and NetHackScore-v0 cannot be copied",
                         "--resume (single runtime): new episodes (the environment does not "
                         "pickle: TypeError"]),
    ("Blackjack-v1", ["env checker: passed", "0: () int64 discrete (32 values) -> onehot",
                      "action mask: none", "dqn: single, mono, poly, distributed, offline"]),
    ("Taxi-v3", ["env checker: passed", "observation: () int64 discrete (500 values) -> onehot",
                 "action mask: yes, obs['action_mask']",
                 "d4pg: no: d4pg acts in continuous (Box) action spaces",
                 "mcts: single, mono, distributed",
                 "--resume (single runtime): mid-episode (a copy restored from its snapshot "
                 "steps as it does)"]),
    # MCTS's simulator cannot copy ale-py's vector env, but Atari as Gymnasium steps it.
    ("ALE/Breakout-v5", ["(4, 84, 84) uint8 box (256 values) -> image torso",
                         "dqn: single, mono, poly, distributed, offline",
                         "mcts: single, mono, distributed (with --native-vector-env false)"]),
])  # fmt: skip
def test_check_env_prints_the_structure_and_who_trains_it(env, shown):
    out = _check_env(env)
    assert out.returncode == 0, out.stderr
    for line in shown:
        assert line in out.stdout, out.stdout


def test_check_env_strict_fails_on_what_gymnasiums_checker_finds():
    assert _check_env("NetHackScore-v0", "--strict").returncode == 1
    assert _check_env("Taxi-v3", "--strict").returncode == 0


def test_check_env_of_an_unknown_id_is_one_line():
    out = subprocess.run([sys.executable, "-m", "rlherd.cli", "check-env", "Taxi-v9"],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 2 and "Did you mean: Taxi-v3" in out.stderr
    assert "Traceback" not in out.stderr


def test_a_package_id_typed_in_another_case_offers_the_id():
    """``Minigrid-...`` imported no package, so no MiniGrid id was among the close matches: the
    line listed rlherd's families instead. A fresh process, as the command is: one that has
    imported minigrid already would offer the id anyway."""
    pytest.importorskip("minigrid")
    out = subprocess.run([sys.executable, "-m", "rlherd.cli", "check-env", "Minigrid-Empty-5x5-v0"],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 2 and "Did you mean: MiniGrid-Empty-5x5-v0" in out.stderr


@pytest.mark.parametrize("seconds", ["-1", "0", "nan", "inf"])  # inf: timed until killed
def test_check_env_refuses_a_timing_of_no_time(seconds, capsys):
    """A speed timed over no time was reported as if measured."""
    assert main(["check-env", "CartPole-v1", "--seconds", seconds]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--seconds must be > 0" in err, err


class Counter(gym.Env):
    """Observes how many steps its episode has taken, plus a draw from Python's global random
    stream (which a resume restores, as the check does)."""

    observation_space = gym.spaces.Box(0, 1_000, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self):
        self.count = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.count = 0
        return self._obs(), {}

    def step(self, action):
        self.count += 1
        return self._obs(), 0.0, False, False, {}

    def _obs(self) -> np.ndarray:
        return np.array([self.count, random.random()], np.float32)


class TwoDials(Counter):
    """Counter with two dials to turn: MultiDiscrete actions, which ppo alone acts in."""

    action_space = gym.spaces.MultiDiscrete([3, 4])


class Reached(Exception):
    """train() passed every check and would now train."""


@pytest.mark.parametrize("env, agents", [
    (f"{__name__}:Counter", ["bc", "dqfd", "mcts", "ppo"]),  # no scripted expert
    ("bsuite/catch/0", ["dqn", "ppo"]),  # trained on single alone
    (f"{__name__}:TwoDials", ["ddpg", "dqn", "ppo"]),
    ("CartPole-v1", ["dqn", "ppo"]),  # the device runtime has a CartPole of its own
])  # fmt: skip
def test_check_env_lists_the_runtimes_train_accepts(env, agents, tmp_path, monkeypatch):
    """check-env's verdicts are train's own checks: a runtime it lists is one train accepts
    (with the flag it names: --dataset, --demonstrations, whose absence train refuses), and
    one it leaves out train refuses. It listed dqfd without --demonstrations, bsuite ids on
    every runtime, told MultiDiscrete actions to use dqn or impala, which refuse them, and
    never listed the device runtime."""
    from rlherd.commands import train as train_module
    from rlherd.commands.check_env import check
    from rlherd.errors import NeedsInput
    from rlherd.runtime import RUNTIMES

    def reached(*args, **kwargs):
        raise Reached

    report = check(env, seconds=0.1)
    monkeypatch.setattr(train_module, "_run", reached)
    for agent in agents:
        verdict, flags = report["agents"][agent], report["flags"].get(agent, {})
        for runtime in RUNTIMES:
            try:
                rlherd.train(agent, env, runtime=runtime, total_steps=100, progress=False,
                             run_dir=tmp_path / f"{agent}-{runtime}")  # fmt: skip
            except Reached:
                said = "trained"
            except NeedsInput as e:  # a runtime that trains it once given this flag
                said = e.flag
            except ConfigError:
                said = "refused"
            if isinstance(verdict, list) and runtime in verdict:
                assert said == flags.get(runtime, "trained"), (agent, runtime, verdict, flags)
            else:  # refused, whatever train asks first (the offline runtime: --dataset)
                assert said != "trained", (agent, runtime, verdict)
    for agent, verdict in report["agents"].items():  # an agent suggested instead trains it
        suggested = re.search(r"; use ([a-z0-9, ]+)$", verdict if isinstance(verdict, str) else "")
        for other in re.findall(r"[a-z0-9]+", suggested.group(1) if suggested else ""):
            assert other == "or" or isinstance(report["agents"][other], list), (agent, verdict)


class ForgetfulCounter(Counter):
    def __getstate__(self):
        return {"count": 0}  # the episode begins again


class AmnesiacCounter(Counter):
    def __getstate__(self):
        return {}  # not even the count's attribute


@pytest.mark.parametrize("env, says", [
    ("Hopper-v5", "mid-episode (a copy restored"),  # EzPickle, kept attribute by attribute
    (f"{__name__}:Counter", "mid-episode (a copy restored"),
    (f"{__name__}:ForgetfulCounter", "mid-episode, but NOT exactly: a copy restored from its "
                                     "snapshot steps differently"),
    (f"{__name__}:AmnesiacCounter", "mid-episode, but NOT exactly: a copy restored from its "
                                    "snapshot raises AttributeError"),
    # MPE holds a pygame surface and font, which go as plain data
    ("pettingzoo/mpe2.simple_spread_v3", "mid-episode (a copy restored"),
    # ... and Knights-Archers-Zombies draws its image observations on a surface it keeps
    ("pettingzoo/pettingzoo.butterfly.knights_archers_zombies_v11", "mid-episode (a copy "
                                                                    "restored"),
    ("NetHackScore-v0", "new episodes (the environment does not pickle: TypeError: cannot "
                        "pickle '_io.TextIOWrapper'"),
])  # fmt: skip
def test_check_env_says_whether_a_resume_goes_on_mid_episode(env, says):
    """A copy restored from the environments' snapshot is stepped beside them, which catches
    pickling that keeps too little: a run would resume from it without a word."""
    from rlherd.commands.check_env import resumes

    kwargs = {"obs_method": "image"} if "knights" in env else {}
    assert resumes(env, kwargs, seed=0).startswith(says)


def test_a_restored_mpe_game_renders_the_frame_it_would_have():
    """The snapshot's fresh surface and reopened font draw as the originals do (a resumed run's
    videos)."""
    from mpe2 import simple_spread_v3

    game = simple_spread_v3.parallel_env(render_mode="rgb_array")
    game.reset(seed=0)
    for _ in range(5):
        game.step({a: game.action_space(a).sample() for a in game.agents})
    snapshot = rl_envs.pickle_envs(game)
    copy = pickle.loads(snapshot)
    frame = game.render()
    assert frame.shape == (700, 700, 3) and frame.std() > 0
    assert np.array_equal(copy.render(), frame)
    # A resumed run's process has not started FreeType (its font) before it unpickles.
    fresh = subprocess.run([sys.executable, "-c", "import pickle, sys; "
                            "print(pickle.loads(sys.stdin.buffer.read()).render().shape)"],
                           input=snapshot, capture_output=True, timeout=120)  # fmt: skip
    assert fresh.stdout.strip() == b"(700, 700, 3)", fresh.stderr.decode()[-500:]


def test_a_mask_of_the_wrong_length_is_refused_naming_it():
    mask = gym.spaces.MultiBinary(3)
    obs = gym.spaces.Dict({"x": gym.spaces.Box(0, 1, (2,)), "action_mask": mask})
    with pytest.raises(TypeError, match="one entry per action"):
        EnvSpec.from_spaces("x", obs, gym.spaces.Discrete(4))


# ------------------------------------------------------------------------------ learning
# The figures, at their full budgets, are benchmarks/your_env_scores.py's (seed 1: PPO
# DoorKey 0.96 at 300k, DQN Taxi 7.8 greedy at 100k and 200k, IMPALA Empty-5x5 0.93-0.94 at
# 100k on mono, poly and distributed). These check each within the suite's budget, where seed 1
# is past the goal with room to spare.
@pytest.mark.slow
def test_ppo_solves_minigrid_doorkey(tmp_path):
    """Seed 1 passes 0.85 at ~27k steps (0.92 at 50k)."""
    run, reached = learn_to(0.85, "ppo", "MiniGrid-DoorKey-5x5-v0", total_steps=60_000, seed=1,
                            run_dir=tmp_path / "run", progress=False)  # fmt: skip
    assert reached, run.summary


@pytest.mark.slow
def test_dqn_learns_taxi_to_near_its_optimum(tmp_path):
    """Greedy over 100 episodes: seed 1 gets 7.8-8.0 at 75k-100k steps (the optimum is about
    7.9; -68 at 50k), judged every 25k and stopped once past 7."""
    run, reached = learn_to(7.0, "dqn", "Taxi-v3", metric="eval_return_mean", total_steps=100_000,
                            seed=1, run_dir=tmp_path / "run", progress=False, eval_every=25_000,
                            eval_episodes=100)  # fmt: skip
    assert reached, run.summary


@pytest.mark.slow
def test_ppo_learns_taxi(tmp_path):
    """Greedy over 100 episodes: seed 1 gets 7.6 at 200k steps with the toytext preset's
    separate policy and value networks (-200 with one shared between them); judged at 100k on
    the way (on an Intel Xeon: 8.0 there), and stopped once past 7."""
    run, reached = learn_to(7.0, "ppo", "Taxi-v3", metric="eval_return_mean", total_steps=200_000,
                            seed=1, run_dir=tmp_path / "run", progress=False,
                            eval_every=100_000, eval_episodes=100)  # fmt: skip
    assert reached, run.summary


@pytest.mark.slow
@pytest.mark.parametrize("runtime", ["mono", "poly",
                                     pytest.param("distributed", marks=pytest.mark.ray)])
def test_impala_learns_minigrid_with_dict_observations_across_processes(runtime, tmp_path):
    """The issue's budget: seed 1 holds 0.93-0.94 from 40k steps on each runtime when alone on
    the machine, but these runtimes are asynchronous, and beside other work (the suite's other
    worker) their actors lag further behind the learner: at 50k, 0.90 and 0.73 once (mono,
    distributed), 0.94 and 0.95 the next time."""
    run, reached = learn_to(0.9, "impala", "MiniGrid-Empty-5x5-v0", runtime=runtime,
                            total_steps=100_000, seed=1, run_dir=tmp_path / "run",
                            progress=False)  # fmt: skip
    assert reached, run.summary
