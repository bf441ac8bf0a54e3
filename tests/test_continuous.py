"""DDPG, D4PG, MPO, DMPO, SAC and TD3: their networks, acting, learner pieces, errors, resume,
and Pendulum."""

import dataclasses
import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import learn_to, random_transitions

import rlherd
from rlherd import envs as rl_envs
from rlherd.agents import BUILDERS
from rlherd.agents.d4pg.learning import dpg_loss
from rlherd.agents.learning import SupportPlacer
from rlherd.commands.train import resolve_config
from rlherd.core import EnvSpec, Leaf
from rlherd.errors import ConfigError
from rlherd.networks.continuous import ObsVector
from rlherd.run.rundir import RunDir

CONTINUOUS = ("ddpg", "d4pg", "mpo", "dmpo", "sac", "td3")
CATEGORICAL_CAPABLE = ("ddpg", "d4pg", "mpo", "dmpo")  # with a (categorical) critic's support
REACH = "rlherd/Reach-v0"


def builder_for(agent, env_id="Pendulum-v1", **overrides):
    config, _ = resolve_config(agent, env_id, None, overrides)
    return BUILDERS[agent](config), rl_envs.spec_for(env_id)


def checkpoint(run_dir):
    return RunDir(run_dir).load_checkpoint()


@pytest.mark.parametrize("agent", CONTINUOUS)
def test_actions_stay_in_the_environments_bounds_and_evaluation_is_deterministic(agent):
    torch.manual_seed(0)
    builder, spec = builder_for(agent)
    net = builder.make_networks(spec)
    if agent in ("sac", "td3"):  # past their warm-up (tests/test_sac_td3.py): the policy acts
        net.learning.fill_(True)
    obs, first = torch.randn(64, *spec.obs_shape), torch.zeros(64, dtype=torch.bool)

    def act(evaluation, seed):
        policy = builder.make_policy(net, evaluation=evaluation)
        return policy(obs, first, (), torch.Generator().manual_seed(seed))[0]["action"]

    greedy = act(True, 1)
    torch.testing.assert_close(act(True, 2), greedy)  # the mean action: no draws
    assert not torch.equal(act(False, 1), greedy)  # exploration: noise or samples
    torch.testing.assert_close(act(False, 1), act(False, 1))  # from the given generator
    with torch.no_grad():  # a policy far outside the box: acting clips to it
        for p in net.policy.parameters():
            p.add_(torch.randn_like(p) * 3)
    action = act(False, 0)
    assert action.shape == (64, 1) and action.abs().max() <= 2.0  # Pendulum's torque is +-2
    assert (action.abs() == 2.0).any()
    torch.testing.assert_close(net.from_env(net.to_env(torch.tensor([[-0.5], [0.25]]))),
                               torch.tensor([[-0.5], [0.25]]))  # fmt: skip


@pytest.mark.parametrize("agent", CONTINUOUS)
def test_discrete_or_unbounded_action_spaces_are_clear_errors(agent, tmp_path):
    with pytest.raises(ConfigError, match="continuous"):
        rlherd.train(agent, "CartPole-v1", run_dir=tmp_path / "a", progress=False)
    builder, spec = builder_for(agent)
    unbounded = type(spec)(**{**spec.__dict__, "action_low": np.array([-np.inf])})
    with pytest.raises(ConfigError, match="finite action bounds"):
        builder.make_networks(unbounded)


def test_image_observations_point_to_the_agent_that_reads_them():
    """The refusal said what the continuous-control agents take, not which agent trains an
    environment of images and continuous actions (PPO does)."""
    image = EnvSpec("img", Leaf((16, 16, 3), np.dtype(np.uint8)), "continuous", action_shape=(2,),
                    action_low=-np.ones(2), action_high=np.ones(2))  # fmt: skip
    with pytest.raises(ConfigError, match=r"img has image observations \(the observation\); .*: "
                                          r"train ppo, whose networks read images"):
        ObsVector(image)


class Modes(gym.Env):
    """Continuous actions and a dict observation with codes: a mode (Discrete) and two dials
    (MultiDiscrete) beside numbers."""

    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    observation_space = gym.spaces.Dict({
        "dial": gym.spaces.MultiDiscrete([4, 4]), "mode": gym.spaces.Discrete(3),
        "x": gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
    })  # fmt: skip

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self.observation_space.sample(), {}

    def step(self, action):
        self.t += 1
        return self.observation_space.sample(), float(action[0]), False, self.t >= 20, {}


@pytest.mark.parametrize("agent", CONTINUOUS)
def test_codes_reach_the_networks_one_hot(agent, tmp_path):
    """A Discrete or MultiDiscrete leaf of the observation (a mode, a dial) reaches the policy
    and the critics as one-hots, as every other agent's torso reads codes. It was one float per
    code, which reads code 2 as twice code 1."""
    env_id = f"{__name__}:Modes"
    spec = rl_envs.spec_for(env_id)
    obs = {"dial": torch.tensor([[1, 3], [0, 2]]), "mode": torch.tensor([2, 0]),
           "x": torch.randn(2, 2)}  # fmt: skip
    one_hots = [torch.eye(4)[obs["dial"]].reshape(2, 8), torch.eye(3)[obs["mode"]], obs["x"]]
    networks = builder_for(agent)[0].make_networks(spec)
    readers = [m for m in networks.modules() if isinstance(m, ObsVector)]
    assert readers and {m.out_dim for m in readers} == {8 + 3 + 2}
    torch.testing.assert_close(readers[0](obs, 2), torch.cat(one_hots, -1))
    run = rlherd.train(agent, env_id, total_steps=300, run_dir=tmp_path, progress=False,
                       min_replay_size=100)  # fmt: skip
    assert run.summary["learner_steps"] > 0


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(vmin=-10.0), "set both vmin and vmax"),
        (dict(vmin=5.0, vmax=-5.0), "must be below vmax"),
        (dict(min_replay_size=10, replay_size=5), "exceeds replay_size"),
        (dict(discount=1.5), "discount must be in"),
        (dict(discount=1.0, distributional=True), "a derived support needs discount < 1"),
        (dict(learning_rate=0.0), "learning_rate must be > 0"),
        (dict(critic_learning_rate=float("inf")), "critic_learning_rate must be finite"),
        (dict(grad_norm_clip=-1.0), "grad_norm_clip must be > 0"),
    ],
)
def test_bad_configs_name_the_field(overrides, message):
    for agent in CATEGORICAL_CAPABLE:
        with pytest.raises(ValueError, match=message):
            builder_for(agent, **overrides)


@pytest.mark.parametrize("agent", [*CONTINUOUS, "cql", "crr"])
@pytest.mark.parametrize("field", ["policy_sizes", "critic_sizes"])
def test_networks_without_a_hidden_layer_are_refused_by_name(agent, field, tmp_path):
    """``--set policy_sizes=[]`` is one line naming the field, as ``[0]`` is, not an error
    from inside the torso's constructor once the run has started."""
    with pytest.raises(ConfigError, match=f"{field} must name at least one hidden layer"):
        rlherd.train(agent, "Pendulum-v1", run_dir=tmp_path / "a", progress=False,
                     total_steps=10, **{field: "[]"})  # fmt: skip
    assert not (tmp_path / "a").exists()


def test_an_unlimited_ratio_paces_nothing_and_a_single_process_refuses_it(tmp_path):
    """samples_per_insert=inf is Acme's MinSize: after min_replay_size inserts the learner may
    sample any number of times, and actors never wait for it. One loop that takes turns between
    acting and learning would learn without end, so `single` refuses it in one line."""
    builder, spec = builder_for("d4pg", samples_per_insert=float("inf"), min_replay_size=5)
    (table,) = builder.make_replay_tables(spec, insert_blocking=True)
    limiter = table.limiter
    limiter.inserts = 4
    assert not limiter.can_sample(1)
    limiter.inserts, limiter.samples = 5, 10**9
    assert limiter.can_sample(10**6) and limiter.can_insert(10**6)
    finite, _ = builder_for("d4pg", samples_per_insert=8.0, min_replay_size=5)
    (paced,) = finite.make_replay_tables(spec, insert_blocking=True)
    paced.limiter.inserts, paced.limiter.samples = 5, 10**9
    assert not paced.limiter.can_sample(1)  # the same counts, under a finite ratio
    with pytest.raises(ConfigError, match="--runtime mono, poly or distributed"):
        rlherd.train("d4pg", "Pendulum-v1", runtime="single", total_steps=100, progress=False,
                     run_dir=tmp_path / "single", samples_per_insert="inf")  # fmt: skip
    with pytest.raises(ValueError, match="prioritized=false"):
        resolve_config("dqn", "CartPole-v1", None, dict(samples_per_insert=float("inf")))


@pytest.mark.parametrize("agent", CONTINUOUS)
def test_action_bounds_are_copied_from_a_read_only_spec(agent):
    """A spec that came through Ray's object store holds read-only arrays: the networks copy
    the bounds rather than share them (which torch warns is undefined behaviour)."""
    builder, spec = builder_for(agent)
    low, high = np.array(spec.action_low), np.array(spec.action_high)
    low.setflags(write=False)
    high.setflags(write=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        net = builder.make_networks(dataclasses.replace(spec, action_low=low, action_high=high))
    bounds = [b for name, b in net.named_buffers() if name.endswith("action_low")]
    assert bounds and not any(np.shares_memory(b.numpy(), low) for b in bounds)


def test_dpg_loss_gradient_is_the_clipped_action_gradient():
    g = torch.Generator().manual_seed(0)
    action = torch.randn(5, 3, generator=g, requires_grad=True)
    dqda = torch.randn(5, 3, generator=g) * torch.tensor([[0.1], [3.0], [0.5], [10.0], [1.0]])
    dpg_loss(action, dqda, clip=1.0).backward()
    for i in range(5):
        norm = dqda[i].norm().item()
        expected = dqda[i] * (min(1.0, 1.0 / norm))  # clipped to norm 1
        torch.testing.assert_close(action.grad[i], -expected / 5)
    action.grad = None
    dpg_loss(action, dqda, clip=None).backward()
    torch.testing.assert_close(action.grad, -dqda / 5)


class _Critic:
    def __init__(self):
        self.atoms = torch.linspace(-1, 1, 5)

    def set_support(self, vmin, vmax):
        self.atoms = torch.linspace(vmin, vmax, 5)


def test_support_is_derived_from_the_rewards_and_overflow_warns_once():
    config = BUILDERS["d4pg"].config_class(discount=0.9, n_step=2)
    online, target = _Critic(), _Critic()
    placer = SupportPlacer(config, (online, target), check_period=10)
    # n-step returns from -3.8 = -(2 + 0.9 * 2) to 0.95 = 0.5 + 0.9 * 0.5: per-step rewards of
    # -2 to 0.5, so returns of -20 to 5 (over 1 - 0.9), widened by a tenth of that span.
    placer.place(torch.tensor([-3.8, 0.95, -1.0]))
    assert online.atoms[0].item() == pytest.approx(-22.5)
    assert target.atoms[-1].item() == pytest.approx(7.5)
    placer.place(torch.tensor([-100.0]))  # placed once, at the first batch
    assert online.atoms[-1].item() == pytest.approx(7.5)
    zeros = SupportPlacer(config, (_Critic(),))
    zeros.place(torch.zeros(3))  # no reward seen yet: unit rewards' span, +-10, widened
    assert zeros.critics[0].atoms[-1].item() == pytest.approx(12.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        placer.check(torch.tensor(0.5), step=5)  # not a check step
        placer.check(torch.tensor(0.01), step=10)  # within the support
        assert not caught
        placer.check(torch.tensor(0.5), step=20)
        placer.check(torch.tensor(0.5), step=30)
    assert len(caught) == 1 and "--set vmin=... vmax=..." in str(caught[0].message)
    given = SupportPlacer(BUILDERS["d4pg"].config_class(vmin=-5.0, vmax=5.0), (online,))
    given.place(torch.tensor([-1000.0]))  # a support the user set is kept
    assert online.atoms[-1].item() == pytest.approx(7.5)


@pytest.mark.parametrize("agent", ["d4pg", "mpo"])
def test_learner_steps_on_a_real_batch_move_every_part(agent):
    """One step updates policy, critic and (MPO) the multipliers; the targets follow only at
    the copy period."""
    builder, spec = builder_for(agent, REACH, batch_size=8, target_update_period=2,
                                min_replay_size=8)  # fmt: skip
    tables = random_transitions(builder, REACH, 40)
    net = builder.make_networks(spec)
    learner = builder.make_learner(net, builder.make_dataset(tables), 1000, tables)
    before = {k: v.clone() for k, v in learner.net.state_dict().items()}
    target_before = {k: v.clone() for k, v in learner.target.state_dict().items()}
    metrics = learner.step()
    assert all(torch.isfinite(torch.as_tensor(v)).all() for v in metrics.values())
    after = {k: v.clone() for k, v in learner.net.state_dict().items()}
    for part in ("policy.", "critic."):
        assert any(not torch.equal(before[k], after[k]) for k in before if k.startswith(part))
    assert all(torch.equal(target_before[k], v) for k, v in learner.target.state_dict().items()
               if not k.endswith("atoms"))  # fmt: skip
    learner.step()  # the second step copies the online networks (as they are now) into targets
    now = learner.net.state_dict()
    assert all(torch.equal(now[k], v) for k, v in learner.target.state_dict().items())
    assert not all(torch.equal(after[k], v) for k, v in now.items())
    if agent == "mpo":
        assert learner.state_dict()["duals"]["temperature"].item() != 10.0


@pytest.mark.parametrize("agent", ["d4pg", "mpo", "sac", "td3"])
def test_interrupt_then_resume_continues_exactly(agent, interrupt_at, tmp_path):
    """Replay, adders, the derived support (D4PG), optimisers, multipliers (MPO) and RNGs are
    all in the checkpoint: an interrupted and resumed run ends where an uninterrupted one does.
    (Ctrl-C comes at 400 steps, some 190 learner steps in; the 400 steps after it are a few
    hundred learner steps, with target copies or Polyak updates, and dozens of episodes, which
    any state not restored sends elsewhere.)"""
    kw = dict(total_steps=800, seed=3, progress=False)  # learning from 200 (the toy preset)
    straight = rlherd.train(agent, REACH, run_dir=tmp_path / "a", **kw)
    interrupt_at(400)
    stopped = rlherd.train(agent, REACH, run_dir=tmp_path / "b", **kw)
    assert 300 < stopped.summary["actor_steps"] < kw["total_steps"], "the run went on past Ctrl-C"
    resumed = rlherd.train(resume=tmp_path / "b", progress=False)
    for key in ("actor_steps", "learner_steps", "episodes", "final_return_mean"):
        assert resumed.summary[key] == straight.summary[key], key
    a, b = checkpoint(tmp_path / "a"), checkpoint(tmp_path / "b")
    for name in {"net", "target", "target_net"} & set(a["learner"]):
        for k, v in a["learner"][name].items():
            torch.testing.assert_close(b["learner"][name][k], v, rtol=0, atol=0)


@pytest.mark.parametrize("agent", ["dqn", "impala"])
def test_a_discrete_agent_on_a_control_suite_task_points_to_the_continuous_ones(agent, tmp_path):
    """The Control Suite is a family of its own; agents without a preset for it take their
    ``classic`` one and then say why they cannot act there (once: 'unknown preset control')."""
    with pytest.raises(ConfigError, match="sac, td3, d4pg, ddpg, mpo or dmpo for continuous"):
        rlherd.train(agent, "dm_control/cartpole-swingup-v0", run_dir=tmp_path / "run",
                     progress=False)  # fmt: skip
    assert not (tmp_path / "run").exists()


def test_control_suite_tasks_are_flat_float32_boxes_and_train_in_worker_processes(tmp_path):
    """dm_control ids (Shimmy) come out as one float32 vector, and their actors run in mono's
    worker processes as any other environment does."""
    env_id = "dm_control/cartpole-swingup-v0"
    spec = rl_envs.spec_for(env_id)
    assert spec.obs_shape == (5,) and spec.obs_dtype == np.float32
    assert spec.action_kind == "continuous" and BUILDERS["d4pg"].preset_for(env_id) == "control"
    run = rlherd.train("d4pg", env_id, runtime="mono", total_steps=1_500, seed=0,
                       run_dir=tmp_path / "run", progress=False, min_replay_size=500,
                       num_actors=1)  # fmt: skip
    assert run.summary["actor_steps"] >= 1_500 and run.summary["learner_steps"] > 0
    assert run.summary["episodes"] == 1  # the Control Suite's 1000-step episodes, truncated
    with pytest.raises(ConfigError, match="Did you mean: dm_control/cartpole-swingup-v0"):
        rl_envs.make("dm_control/cartpole-swingupp-v0")


# The most steps each agent's test trains for: where seed 1 is past the bar with room to spare. Seed
# 1's mean-action returns (50 episodes) at 5k / 10k / 15k / 20k steps on an AMD EPYC: D4PG -167 /
# -164 / -160 / -161, DDPG -825 / -827 / -157 / -165, MPO -162 / -163 / -150 / -150, DMPO -161 /
# -147 / -148 / -148; at 30k (README) -143 to -146 over 10 episodes. On an Intel Xeon, over 100
# episodes: D4PG -163.2, MPO -161.3 and DMPO -156.9 at 5k, DDPG -155.4 at 15k. SAC and TD3 are held
# to their own bar, -200 at 20k steps (seed 1, 100 episodes: -149.8 and -152.0), and judged at 10k
# on the way, where they are past it already (SAC on an Intel Xeon: -151.7 at 10k, -148.3 at 20k;
# TD3 on an AMD EPYC: -152.7 at 10k): a run that is there stops.
PENDULUM_STEPS = {"d4pg": 5_000, "ddpg": 15_000, "mpo": 5_000, "dmpo": 5_000, "sac": 20_000,
                  "td3": 20_000}
PENDULUM_EVAL_EVERY = {"sac": 10_000, "td3": 10_000}


@pytest.mark.slow
@pytest.mark.parametrize("agent", CONTINUOUS)
def test_agent_swings_pendulum_up_within_30k_steps(agent, tmp_path):
    """The issue's bar: ``rlherd train AGENT --env Pendulum-v1 --total-steps 30000 --seed 1``
    reaches a mean-action return of -200 or better (RL Zoo's TD3 and SAC reach about -150 at
    20k steps; random actions score about -1,200).

    The test trains at most the first ``PENDULUM_STEPS[agent]`` steps of that run: nothing in these
    agents depends on the run's length, so with the same seed they are the same steps, and the
    whole 30k (the benchmark page's figures, from ``benchmarks/continuous_control.py``) would
    take the suite three times as long. Judged over 100 evaluation episodes, not the default 10: a
    Pendulum episode's return depends on its random start (standard deviation ~85-100 for
    these policies), so ten of them put the mean within about +-40 of the policy's worth."""
    steps = PENDULUM_STEPS[agent]
    run, reached = learn_to(-200, agent, "Pendulum-v1", metric="eval_return_mean",
                            total_steps=steps, seed=1, eval_episodes=100,
                            eval_every=PENDULUM_EVAL_EVERY.get(agent, steps),
                            run_dir=tmp_path / "run", progress=False)  # fmt: skip
    assert reached, run.summary
