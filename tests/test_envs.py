import re
import threading

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.ezpickle import EzPickle

from rlherd import envs
from rlherd.core import EnvSpec
from rlherd.errors import ConfigError, UnsupportedEnv


def test_make_gymnasium_and_spec():
    env = envs.make("CartPole-v1")
    spec = envs.spec_of(env, "CartPole-v1")
    assert spec.obs_shape == (4,) and spec.action_kind == "discrete" and spec.num_actions == 2
    assert spec.max_episode_steps == 500 and not spec.is_image


def test_continuous_spec():
    spec = envs.spec_of(envs.make("Pendulum-v1"))
    assert spec.action_kind == "continuous" and spec.action_shape == (1,)
    assert spec.action_high[0] == 2.0


@pytest.mark.parametrize("module", ["mpe2.simple_spread_v3", "pettingzoo.classic.connect_four_v3"])
def test_a_pettingzoo_games_module_given_as_an_id_is_told_its_prefix(module):
    """A PettingZoo game's module (a parallel game, a turn-based one) given as the id, without
    ``pettingzoo/``, got the list of every family rlherd knows."""
    with pytest.raises(ConfigError, match=rf"it is the module of a PettingZoo game; train it as "
                                          rf"pettingzoo/{re.escape(module)}$"):
        envs.make(module)


def test_unknown_id_lists_close_matches():
    with pytest.raises(ValueError, match="Did you mean: CartPole-v1"):
        envs.make("Cartpole-v1")
    with pytest.raises(ValueError, match="ALE/Pong-v5"):
        envs.make("ALE/Pongg-v5")
    with pytest.raises(ValueError, match="Known families"):
        envs.make("NoSuchThing-zz")


def test_unsupported_spaces_are_named():
    text_only = gym.spaces.Dict({"mission": gym.spaces.Text(10)})
    with pytest.raises(TypeError, match="holds no arrays"):
        EnvSpec.from_spaces("x", text_only, gym.spaces.Discrete(2))
    with pytest.raises(TypeError, match="is not supported"):
        EnvSpec.from_spaces("x", gym.spaces.Text(10), gym.spaces.Discrete(2))
    box = gym.spaces.Box(0, 1, (2,))
    with pytest.raises(TypeError, match=r"MultiBinary\(\(2, 2\)\) is not supported"):
        EnvSpec.from_spaces("x", box, gym.spaces.MultiBinary((2, 2)))  # one dimension only
    assert EnvSpec.from_spaces("x", box, gym.spaces.MultiBinary(3)).action_nvec == (2, 2, 2)
    # Actions the agents would get wrong in silence, or crash on deep inside: a MultiDiscrete
    # from [-1, 5] or a Discrete from 1 (the agents' actions fell outside the space; each
    # refusal names the fix), a Box of shape (2, 2) (shape errors in rollouts and critics) or ().
    with pytest.raises(UnsupportedEnv, match=r"starts at \[-1, 5\]; rlherd expects MultiDiscrete"):
        EnvSpec.from_spaces("x", box, gym.spaces.MultiDiscrete([3, 2], start=[-1, 5]))
    with pytest.raises(UnsupportedEnv, match=r"starts at 1; rlherd expects Discrete\(n\) actions "
                                             r"numbered from 0 \(shift them in an ActionWrapper\)"):
        EnvSpec.from_spaces("x", box, gym.spaces.Discrete(3, start=1))
    for shape in ((2, 2), ()):
        with pytest.raises(UnsupportedEnv, match=rf"has shape {re.escape(str(shape))}; rlherd's "
                           "continuous agents act in a vector"):  # fmt: skip
            EnvSpec.from_spaces("x", box, gym.spaces.Box(-1, 1, shape))
    assert EnvSpec.from_spaces("x", box, gym.spaces.MultiDiscrete([3, 2])).action_nvec == (3, 2)


def test_a_box_of_integer_actions_is_refused_naming_multidiscrete():
    """The continuous agents' actions (floats, clipped to the bounds) went to an environment that
    declared integers, in silence: a float64 [3.72, 0.0] where Box(0, 10, int64) promised
    whole numbers."""
    box = gym.spaces.Box(0, 1, (2,))
    for dtype in (np.int64, np.uint8, np.bool_):
        actions = gym.spaces.Box(0, 1, (2,), dtype)
        with pytest.raises(UnsupportedEnv, match=r"holds integers, and rlherd's continuous agents "
                                                 r"act in real numbers .* MultiDiscrete"):
            EnvSpec.from_spaces("x", box, actions)


def test_vector_env_next_step_autoreset():
    """The step after a terminated one resets: reward 0, flags false, a fresh first observation."""
    v = envs.make_vector("rlherd/Corridor-v0", 2, length=3)
    obs, _ = v.reset(seed=0)
    right = np.ones(2, dtype=np.int64)
    obs, r, term, trunc, _ = v.step(right)
    obs, r, term, trunc, _ = v.step(right)
    assert term.all() and np.allclose(r, 0.99)
    assert obs[:, 2].all()  # the real final observation is returned
    obs, r, term, trunc, _ = v.step(right)  # action ignored: this step only resets
    assert not term.any() and not trunc.any() and np.allclose(r, 0.0)
    assert obs[:, 0].all()
    v.close()


def test_toy_optimal_returns():
    assert envs.make("rlherd/Bandit-v0").unwrapped.optimal_return == 1.0
    assert envs.make("rlherd/Corridor-v0").unwrapped.optimal_return == pytest.approx(0.95)


def test_atari_deepmind_preprocessing():
    pytest.importorskip("ale_py")
    env = envs.make("ALE/Pong-v5")
    obs, _ = env.reset(seed=0)
    assert obs.shape == (4, 84, 84) and obs.dtype == np.uint8
    spec = envs.spec_of(env, "ALE/Pong-v5")
    assert spec.is_image and spec.num_actions == 6
    env.close()
    with pytest.raises(TypeError, match="unknown Atari options"):
        envs.make("ALE/Pong-v5", frame_skipp=3)


@pytest.mark.parametrize("option, value, says", [
    ("stack", 0, "stack must be a whole number >= 1, got 0"),  # Gymnasium's ValueError
    ("screen_size", -1, "screen_size must be a whole number >= 1"),  # its AssertionError
    ("frame_skip", 0, "frame_skip must be a whole number >= 1"),  # its bare AssertionError
    ("noop_max", 1.5, "noop_max must be a whole number >= 0, got 1.5$"),
    ("frame_skip", 4.0, "frame_skip must be a whole number >= 1, got 4.0 \\(write 4\\)"),
    ("repeat_action_probability", 2.0, "repeat_action_probability must be in \\[0, 1\\], got 2"),
    ("episodic_life", 1, "episodic_life must be true or false"),
])  # fmt: skip
def test_a_bad_atari_option_is_one_line_on_either_path(option, value, says):
    """One check for both ways an Atari game is made: Gymnasium's wrappers and ale-py's
    vector env."""
    pytest.importorskip("ale_py")
    with pytest.raises(UnsupportedEnv, match=f"Atari option {says}"):
        envs.make("ALE/Pong-v5", **{option: value})
    with pytest.raises(UnsupportedEnv, match=f"Atari option {says}"):
        envs.make_vector("ALE/Pong-v5", 2, **{option: value})


def test_atari_native_vector_env_autoreset():
    pytest.importorskip("ale_py")
    v = envs.make_vector("ALE/Pong-v5", 2, max_num_frames_per_episode=40)
    obs, _ = v.reset(seed=0)
    assert obs.shape == (2, 4, 84, 84)
    for _ in range(30):
        obs, r, term, trunc, _ = v.step(np.zeros(2, dtype=np.int64))
        if trunc.any():
            break
    assert trunc.all(), "episodes of 40 frames (10 agent steps) must be truncated"
    obs, r, term, trunc, _ = v.step(np.zeros(2, dtype=np.int64))
    assert not term.any() and not trunc.any() and (r == 0).all()
    v.close()


def test_minatar_channels_first():
    pytest.importorskip("minatar")
    env = envs.make("MinAtar/Breakout-v1")
    obs, _ = env.reset(seed=0)
    assert obs.shape == (4, 10, 10) and obs.dtype == np.uint8


def test_a_control_suite_action_repeat_holds_each_action_and_sums_its_rewards():
    """``action_repeat=3``: one step is three of the suite's with the same action, rewarded with
    their sum, and an episode of 1,000 suite steps is 334 steps (the last one cut short)."""
    env_id = "dm_control/cartpole-swingup-v0"
    plain, repeated = envs.make(env_id), envs.make(env_id, action_repeat=3)
    obs, _ = plain.reset(seed=4)
    obs_r, _ = repeated.reset(seed=4)
    np.testing.assert_array_equal(obs, obs_r)
    rng = np.random.default_rng(0)
    steps = 0
    while True:
        action = rng.uniform(-1, 1, size=1).astype(np.float32)
        total = 0.0
        for _ in range(3):
            obs, reward, terminated, truncated, _ = plain.step(action)
            total += reward
            if terminated or truncated:
                break
        obs_r, reward_r, terminated_r, truncated_r, _ = repeated.step(action)
        steps += 1
        np.testing.assert_array_equal(obs, obs_r)
        assert reward_r == pytest.approx(total) and (terminated, truncated) == (terminated_r,
                                                                                 truncated_r)
        if terminated_r or truncated_r:
            break
    assert steps == 334
    with pytest.raises(ConfigError, match="action_repeat must be a whole number >= 1, got 1.5$"):
        envs.make(env_id, action_repeat=1.5)
    with pytest.raises(ConfigError, match="got 2.0 \\(write 2\\)$"):  # --env-kwargs' JSON
        envs.make(env_id, action_repeat=2.0)


def test_a_time_limit_option_that_is_not_a_step_count_is_one_line():
    """``max_episode_steps`` goes to ``gym.make``, which asserts it is positive: an
    AssertionError from inside Gymnasium, not a line naming the option."""
    for steps in (-5, 0, 2.5, "100"):
        with pytest.raises(ConfigError, match="CartPole-v1: max_episode_steps must be a whole"):
            envs.make("CartPole-v1", max_episode_steps=steps)
    env = envs.make("CartPole-v1", max_episode_steps=3)
    env.reset(seed=0)
    assert [env.step(0)[3] for _ in range(3)] == [False, False, True]


def test_a_render_mode_the_environment_does_not_have_is_one_line():
    """Gymnasium fails on a mode that is not a string deep inside ``gym.make`` and only logs an
    unknown one, whose frames are then None; ale-py raises its own error."""
    with pytest.raises(ConfigError, match="CartPole-v1: render_mode must be a name such as "
                                          "'rgb_array', got 3"):  # fmt: skip
        envs.make("CartPole-v1", render_mode=3)
    with pytest.raises(ConfigError, match="CartPole-v1 renders as human, rgb_array; "
                                          "render_mode 'bogus' is not one of them"):  # fmt: skip
        envs.make("CartPole-v1", render_mode="bogus")
    with pytest.raises(ConfigError, match="ALE/Pong-v5: Render mode bogus not supported"):
        envs.make("ALE/Pong-v5", render_mode="bogus")
    env = envs.make("CartPole-v1", render_mode="rgb_array_list")  # Gymnasium's own wrapper's
    env.reset(seed=0)
    assert env.render()[0].shape == (400, 600, 3)


@pytest.mark.parametrize("env_id", ["Hopper-v5", "pettingzoo/pettingzoo.classic.connect_four_v3"])
def test_a_snapshot_goes_on_with_the_episode_of_an_environment_that_ezpickles(env_id):
    """MuJoCo's environments and PettingZoo's games are Gymnasium ``EzPickle`` objects, whose own
    pickling keeps their constructor's arguments and unpickles a new simulator or an empty board.
    A run's snapshot keeps their state: the restored environments step as the originals do."""
    import pickle

    pytest.importorskip("mujoco" if env_id == "Hopper-v5" else "pettingzoo")
    original = envs.make_vector(env_id, 2)
    original.reset(seed=3)
    if env_id == "Hopper-v5":
        original.action_space.seed(0)
        actions = [original.action_space.sample() for _ in range(20)]
    else:  # the learner's columns in turn, against random moves (a game that ends begins again)
        actions = [np.array([i % 7, (i + 3) % 7]) for i in range(10)]
    half = len(actions) // 2
    for action in actions[:half]:
        original.step(action)
    restored = pickle.loads(envs.save_envs(original))
    for action in actions[half:]:
        (obs, reward), (again, reward_again) = original.step(action)[:2], restored.step(action)[:2]
        assert reward_again.tolist() == reward.tolist()
        if isinstance(obs, dict):  # a game's board and action mask
            for key in obs:
                np.testing.assert_array_equal(again[key], obs[key])
        else:
            np.testing.assert_array_equal(again, obs)


class OwnWay(gym.Env, EzPickle):
    """An ``EzPickle`` environment that pickles its own way: its lock is made anew."""

    observation_space = gym.spaces.Box(0, 100, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self):
        EzPickle.__init__(self)
        self.count, self.lock = 0, threading.Lock()

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.count = 0
        return np.array([self.count], np.float32), {}

    def step(self, action):
        self.count += 1
        return np.array([self.count], np.float32), 0.0, False, False, {}

    def __getstate__(self):
        return {"count": self.count}

    def __setstate__(self, state):
        self.__dict__.update(state, lock=threading.Lock())


def test_an_ezpickle_environment_that_pickles_its_own_way_keeps_it():
    """Only EzPickle's own pickling is replaced: a class's ``__getstate__`` and ``__setstate__``
    are its author's, and the snapshot goes through them (a lock, which no pickling takes)."""
    import pickle

    original = gym.vector.SyncVectorEnv([OwnWay])
    original.reset(seed=0)
    original.step(np.array([1]))
    restored = pickle.loads(envs.save_envs(original))
    assert restored.envs[0].count == 1 and restored.envs[0].lock is not original.envs[0].lock
