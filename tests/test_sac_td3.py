"""SAC and TD3: their losses against naive references, TD3's smoothing and delay, and what
each learner step moves."""

import copy
import math
import warnings

import pytest
import torch
from conftest import random_transitions

import rlherd
from rlherd import envs as rl_envs
from rlherd import types as F
from rlherd.agents import BUILDERS
from rlherd.commands.train import BudgetNotice, resolve_config
from rlherd.errors import ConfigError
from rlherd.losses.actor_critic import (
    sac_policy_loss,
    smoothed_target_action,
    soft_td_target,
    temperature_loss,
    twin_critic_loss,
)
from rlherd.networks.continuous import tanh_gaussian_sample

REACH = "rlherd/Reach-v0"


def test_soft_td_target_and_twin_critic_loss_against_naive_references():
    g = torch.Generator().manual_seed(0)
    r, d, q1n, q2n, logp, q1, q2 = (torch.randn(7, generator=g) for _ in range(7))
    d = (d > 0).float() * 0.99
    alpha = 0.3
    y = soft_td_target(r, d, q1n, q2n, logp, alpha)
    for b in range(7):
        smaller = min(q1n[b].item(), q2n[b].item())
        naive = r[b].item() + d[b].item() * (smaller - alpha * logp[b].item())
        assert y[b].item() == pytest.approx(naive, abs=1e-6)
    naive = sum(0.5 * (q1[b] - y[b]) ** 2 + 0.5 * (q2[b] - y[b]) ** 2 for b in range(7)) / 7
    assert twin_critic_loss(q1, q2, y).item() == pytest.approx(naive.item(), rel=1e-6)
    summed = sum((q1[b] - y[b]) ** 2 + (q2[b] - y[b]) ** 2 for b in range(7)) / 7  # TD3's
    assert twin_critic_loss(q1, q2, y, 1.0).item() == pytest.approx(summed.item(), rel=1e-6)


def test_sac_policy_loss_with_the_tanh_log_density_correction_against_a_naive_reference():
    """A reparameterised tanh-Gaussian sample's log-density is the Gaussian's less
    ``log(1 - tanh(u)^2)`` per dimension; the policy loss is ``alpha log pi - Q`` averaged."""
    mean, log_std = torch.randn(5, 3), torch.randn(5, 3).clamp(-2, 1)
    torch.manual_seed(1)
    action, log_pi = tanh_gaussian_sample(mean, log_std)
    torch.manual_seed(1)
    u = mean + log_std.exp() * torch.randn(5, 3)
    value, alpha = torch.randn(5), 0.2
    naive_loss = 0.0
    for b in range(5):
        naive = 0.0
        for k in range(3):
            m, s, x = mean[b, k].item(), math.exp(log_std[b, k].item()), u[b, k].item()
            gaussian = -0.5 * ((x - m) / s) ** 2 - math.log(s) - 0.5 * math.log(2 * math.pi)
            naive += gaussian - math.log(1 - math.tanh(x) ** 2)
            assert action[b, k].item() == pytest.approx(math.tanh(x), abs=1e-6)
        assert log_pi[b].item() == pytest.approx(naive, rel=1e-4, abs=1e-4)
        naive_loss += (alpha * naive - value[b].item()) / 5
    assert sac_policy_loss(value, log_pi, alpha).item() == pytest.approx(naive_loss, rel=1e-4)


def test_the_temperature_falls_while_the_entropy_is_above_its_target_and_rises_below():
    log_pi = torch.tensor([-2.0, -4.0])  # entropy estimate 3
    for target, direction in ((1.0, -1), (5.0, 1)):
        log_alpha = torch.tensor(0.3, requires_grad=True)
        loss = temperature_loss(log_alpha, log_pi, target)
        naive = -0.3 * sum(lp + target for lp in (-2.0, -4.0)) / 2
        assert loss.item() == pytest.approx(naive)
        loss.backward()
        assert math.copysign(1, -log_alpha.grad.item()) == direction  # a descent step's sign


def test_td3_smoothing_clips_the_noise_then_the_action():
    action = torch.tensor([[0.9, -0.2, 0.0]])
    noise = torch.tensor([[0.3, -0.8, 0.45]])
    out = smoothed_target_action(action, noise, noise_clip=0.5)
    naive = [min(1.0, max(-1.0, a + min(0.5, max(-0.5, n))))
             for a, n in zip(action[0].tolist(), noise[0].tolist(), strict=True)]  # fmt: skip
    torch.testing.assert_close(out[0], torch.tensor(naive))
    assert out[0].tolist() == pytest.approx([1.0, -0.7, 0.45])


def _learner(agent: str, **overrides):
    """A learner on a replay table of 64 random Reach transitions."""
    config, _ = resolve_config(agent, REACH, None, dict(batch_size=16, min_replay_size=16,
                                                        **overrides))  # fmt: skip
    builder, spec = BUILDERS[agent](config), rl_envs.spec_for(REACH)
    tables = random_transitions(builder, REACH, 64)
    torch.manual_seed(0)
    net = builder.make_networks(spec)
    return builder.make_learner(net, builder.make_dataset(tables), 1_000, tables)


def _state(module: torch.nn.Module, prefix: str) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in module.state_dict().items() if k.startswith(prefix)}


def _same(a: dict, b: dict) -> bool:
    return all(torch.equal(a[k], b[k]) for k in a)


def test_td3_updates_the_policy_and_targets_every_policy_delay_critic_updates():
    learner = _learner("td3", policy_delay=3, tau=0.1)
    for step in range(1, 7):
        policy, critics = _state(learner.net, "policy."), _state(learner.net, "q1.")
        target = _state(learner.target_net, "")
        learner.step()
        assert not _same(critics, _state(learner.net, "q1."))  # every step
        updated = step % 3 == 0
        assert _same(policy, _state(learner.net, "policy.")) != updated, step
        assert _same(target, _state(learner.target_net, "")) != updated, step
        if updated:  # Polyak: tau of the way toward the networks as they are now
            now = learner.net.state_dict()
            for k, v in learner.target_net.named_parameters():
                torch.testing.assert_close(v, 0.9 * target[k] + 0.1 * now[k])


@pytest.mark.parametrize("agent", ["sac", "td3"])
@pytest.mark.parametrize("tolerance", [0.1, 0.0])
def test_the_learner_runs_ahead_of_one_update_per_step_by_what_the_tolerance_allows(
    agent, tolerance
):
    """In one process the learner steps whenever its limiter lets it. The reference codes
    (Stable-Baselines3's SAC, TD3's authors' ``main.py``) take one update per environment step
    once ``min_replay_size`` transitions are in; Acme's tolerance lets the learner run
    ``min_replay_size * tolerance`` updates ahead of that (1,000 for SAC's MuJoCo preset, 2,500
    for TD3's), all taken as learning starts, and a tolerance of 0 keeps it within 2."""
    config, _ = resolve_config(agent, "Hopper-v5", None,
                               dict(samples_per_insert_tolerance=tolerance))  # fmt: skip
    limiter = BUILDERS[agent](config).rate_limiter().without_insert_blocking()
    start, batch = config.min_replay_size, config.batch_size
    ahead = []  # after each insert from the start on: updates taken less the references'
    for inserts in range(1, start + 2_000):
        limiter.inserts += 1  # as the table counts an insert
        while limiter.can_sample(batch):
            limiter.samples += batch  # as the table counts a sampled batch
        if inserts >= start:
            ahead.append(limiter.samples // batch - (inserts - start))
    lead = round(start * tolerance) if tolerance else 2
    assert ahead == [lead] * len(ahead)


def _mlp(layers: list[torch.nn.Linear], final: torch.nn.Module | None = None) -> torch.nn.Module:
    """A plain ``Linear -> ReLU -> ... -> Linear`` with copies of ``layers``' weights."""
    modules: list[torch.nn.Module] = []
    for layer in layers:
        modules += [copy.deepcopy(layer), torch.nn.ReLU()]
    return torch.nn.Sequential(*modules[:-1], *([final] if final else []))


def _linears(module: torch.nn.Module) -> list[torch.nn.Linear]:
    return [m for m in module.modules() if isinstance(m, torch.nn.Linear)]


def test_td3s_update_is_the_authors_update():
    """From the same weights, on the same batches and target-noise draws, the learner moves
    every network and target as the TD3 authors' ``train`` (``sfujim/TD3``, ``TD3.py``),
    written out here: both critics' squared errors summed, toward the smaller target critic at
    the smoothed target action; every second update, the policy up Q1 and every target
    ``tau`` toward its network."""
    learner = _learner("td3", tau=0.1)
    c, net = learner.config, learner.net
    actor = _mlp(_linears(net.policy), torch.nn.Tanh())
    q1, q2 = _mlp(_linears(net.q1)), _mlp(_linears(net.q2))
    targets = [copy.deepcopy(m) for m in (actor, q1, q2)]
    actor_opt = torch.optim.Adam(actor.parameters(), lr=c.learning_rate)
    critic_opt = torch.optim.Adam([*q1.parameters(), *q2.parameters()], lr=c.critic_learning_rate)
    for it in range(1, 7):
        sample = next(learner.dataset)
        torch.manual_seed(it)
        metrics = learner.learn(sample)
        d = sample.data
        o, o2, a = d["obs"].float(), d["next_obs"].float(), net.from_env(d["action"])
        torch.manual_seed(it)
        with torch.no_grad():
            target_actor, target_q1, target_q2 = targets
            noise = (torch.randn_like(a) * c.policy_noise).clamp(-c.noise_clip, c.noise_clip)
            a2 = (target_actor(o2) + noise).clamp(-1, 1)
            next_q = torch.min(target_q1(torch.cat([o2, a2], 1)), target_q2(torch.cat([o2, a2], 1)))
            y = d["reward"][:, None] + d["discount"][:, None] * next_q
        sa = torch.cat([o, a], 1)
        critic_loss = ((q1(sa) - y) ** 2).mean() + ((q2(sa) - y) ** 2).mean()
        assert metrics["critic_loss"].item() == pytest.approx(critic_loss.item(), rel=1e-5)
        critic_opt.zero_grad()
        critic_loss.backward()
        critic_opt.step()
        if it % c.policy_delay == 0:
            actor_loss = -q1(torch.cat([o, actor(o)], 1)).mean()
            actor_opt.zero_grad()
            actor_loss.backward()
            actor_opt.step()
            for model, target in zip((actor, q1, q2), targets, strict=True):
                for p, tp in zip(model.parameters(), target.parameters(), strict=True):
                    tp.data.copy_(c.tau * p.data + (1 - c.tau) * tp.data)
        pairs = [(net.policy, actor), (net.q1, q1), (net.q2, q2),
                 (learner.target_net.policy, targets[0]), (learner.target_net.q1, targets[1]),
                 (learner.target_net.q2, targets[2])]  # fmt: skip
        for ours, theirs in pairs:
            for x, y_ in zip(_linears(ours), _linears(theirs), strict=True):
                torch.testing.assert_close(x.weight, y_.weight, rtol=0, atol=1e-6)
                torch.testing.assert_close(x.bias, y_.bias, rtol=0, atol=1e-6)


@pytest.mark.parametrize("agent", ["sac", "td3"])
@pytest.mark.parametrize("near_zero", [False, True])
def test_output_layers_start_near_zero_or_as_pytorch_starts_them(agent, near_zero):
    """TD3's default is PyTorch's initialisation (its authors' code), SAC's Acme's near-zero
    heads; ``near_zero_heads`` picks either for both. PyTorch draws a layer's weights and biases
    uniformly within ``1 / sqrt(fan_in)`` (standard deviation ``0.58 / sqrt(fan_in)``); a
    near-zero layer's weights have ``0.01 / sqrt(fan_in)`` and its biases are zero."""
    assert resolve_config(agent, REACH, None, {})[0].near_zero_heads == (agent == "sac")
    config, _ = resolve_config(agent, REACH, None, dict(near_zero_heads=near_zero))
    torch.manual_seed(0)
    net = BUILDERS[agent](config).make_networks(rl_envs.spec_for(REACH))
    heads = [net.q1.head, net.q2.head]
    heads += [net.policy.mean, net.policy.log_std] if agent == "sac" else [net.policy.head]
    for head in heads:
        fan_in = head.in_features
        std = head.weight.std().item() * math.sqrt(fan_in)
        if near_zero:
            assert std < 0.02 and not head.bias.any()
        else:
            assert 0.4 < std < 0.8 and head.bias.abs().max() <= 1 / math.sqrt(fan_in)
            assert head.bias.abs().max() > 0.1 / math.sqrt(fan_in)


def test_sacs_critics_learn_from_their_own_loss_alone_and_the_targets_follow_by_tau():
    """The policy's loss runs through the critics; their gradients must be the critic loss's
    alone (recomputed here from the same draws), or the policy would pull the critics up."""
    learner = _learner("sac", tau=0.1)
    learner.step()  # past the first step's lazily made state
    net, target = copy.deepcopy(learner.net), copy.deepcopy(learner.target_net)
    alpha, log_entropy = learner.entropy_coefficient(), learner.log_entropy.item()
    sample = next(learner.dataset)
    torch.manual_seed(7)
    learner.learn(sample)
    torch.manual_seed(7)
    d = sample.data
    obs, next_obs = F.obs_of(d, "obs"), F.obs_of(d, "next_obs")
    with torch.no_grad():
        next_action, next_log_pi = tanh_gaussian_sample(*net.policy(next_obs))
        y = soft_td_target(d["reward"], d["discount"], target.q1(next_obs, next_action),
                           target.q2(next_obs, next_action), next_log_pi, alpha)  # fmt: skip
    action = net.from_env(d["action"])
    twin_critic_loss(net.q1(obs, action), net.q2(obs, action), y).backward()
    for (name, p), q in zip(learner.net.named_parameters(), net.parameters(), strict=True):
        if name.startswith("q"):
            torch.testing.assert_close(p.grad, q.grad, msg=name)
        else:
            assert q.grad is None and p.grad is not None, name
    assert learner.log_entropy.item() != log_entropy
    now, old = learner.net.state_dict(), target.state_dict()
    for k, v in learner.target_net.state_dict().items():
        if k.startswith("q"):
            torch.testing.assert_close(v, 0.9 * old[k] + 0.1 * now[k])


def test_a_fixed_temperature_stays_fixed():
    learner = _learner("sac", entropy_coefficient=0.05)
    log_entropy = learner.log_entropy.item()
    for _ in range(3):
        metrics = learner.step()
    assert learner.log_entropy.item() == log_entropy  # not tuned
    assert metrics["entropy_coefficient"].item() == pytest.approx(0.05)


@pytest.mark.parametrize("agent", ["sac", "td3"])
def test_policies_act_at_random_until_the_learners_first_step_and_evaluation_never(agent):
    """Uniform actions over the whole box, without running the policy network, until the
    learner has stepped; the flag saying so is part of the networks' state, so actors that
    fetch parameters (or a run resumed from a checkpoint) stop warming up with the learner."""
    learner = _learner(agent)
    builder, net = BUILDERS[agent](learner.config), learner.net
    calls = []
    net.policy.register_forward_hook(lambda *_: calls.append(1))
    acting, greedy = builder.make_policy(net), builder.make_policy(net, evaluation=True)
    spec = rl_envs.spec_for(REACH)
    obs, first = torch.zeros(64, *spec.obs_shape), torch.zeros(64, dtype=torch.bool)
    generator = torch.Generator().manual_seed(0)
    warm = acting(obs, first, (), generator)[0]["action"]
    assert not calls and warm.shape == (64, *spec.action_shape)
    low, high = net.action_low, net.action_high
    assert (warm >= low).all() and (warm <= high).all()
    assert (warm.min(0).values < low + 0.1 * (high - low)).all()  # the whole box, both ends
    assert (warm.max(0).values > high - 0.1 * (high - low)).all()
    greedy(obs, first, (), generator)
    assert calls == [1]  # evaluation acts with the network from the start
    # An actor with a network of its own, fetching from the learner, and one that only acts.
    own = builder.make_networks(spec)
    own_calls = []
    own.policy.register_forward_hook(lambda *_: own_calls.append(1))
    adder = builder.make_adder([learner.dataset.table], 1)
    actor = builder.make_actor(0, builder.make_policy(own), spec, adder, learner)
    sampling = builder.make_actor(0, builder.make_policy(own), spec, None, None)
    sampling.select_action(obs.numpy())
    assert own_calls == [1]  # only acting (rlherd eval --sample): never warms up
    actor.select_action(obs.numpy())
    assert own_calls == [1]
    learner.step()
    fresh = builder.make_networks(spec)
    fresh.load_state_dict(learner.policy_state())
    assert bool(fresh.learning) and bool(net.learning)
    calls.clear()
    acting(obs, first, (), generator)
    assert calls == [1]
    actor.update(wait=True)
    actor.select_action(obs.numpy())
    assert own_calls == [1, 1] and bool(own.learning)


def test_networks_saved_before_the_warm_up_flag_load_as_learning():
    """CQL's continuous networks are SAC's, and its runs from before the flag have none."""
    config, _ = resolve_config("cql", REACH, None, {})
    builder, spec = BUILDERS["cql"](config), rl_envs.spec_for(REACH)
    old = {k: v for k, v in builder.make_networks(spec).state_dict().items() if k != "learning"}
    net = builder.make_networks(spec)
    net.load_state_dict(old)  # strict
    assert bool(net.learning)


@pytest.mark.parametrize(
    "agent, overrides, message",
    [
        ("sac", dict(tau=1.5), "tau must be in"),
        ("sac", dict(entropy_coefficient=-0.1), "entropy_coefficient must be >= 0"),
        ("sac", dict(policy_learning_rate=0.0), "policy_learning_rate must be > 0"),
        ("sac", dict(critic_learning_rate=math.inf), "critic_learning_rate must be finite"),
        ("td3", dict(learning_rate=math.inf), "learning_rate must be finite"),
        ("td3", dict(critic_learning_rate="inf"), "critic_learning_rate must be finite"),
        ("cql", dict(policy_learning_rate=math.inf), "policy_learning_rate must be finite"),
        ("sac", dict(entropy_coefficient=math.inf), "entropy_coefficient must be >= 0 and finite"),
        ("sac", dict(target_entropy="-inf"), "target_entropy must be finite"),
        ("cql", dict(entropy_coefficient=-1.0), "entropy_coefficient must be >= 0"),
        ("cql", dict(target_entropy=math.inf), "target_entropy must be finite"),
        ("td3", dict(noise_clip=-0.5), "noise_clip must be >= 0"),
        ("td3", dict(policy_delay=0), "policy_delay must be >= 1"),
        ("td3", dict(discount=1.5), "discount must be in"),
        ("td3", dict(samples_per_insert_tolerance=-0.1), "tolerance must be >= 0"),
    ],
)
def test_bad_configs_name_the_field(agent, overrides, message):
    with pytest.raises(ValueError, match=message):
        resolve_config(agent, REACH, None, overrides)


def test_the_policy_loss_reaches_the_value_and_the_critic_target_stays_fixed():
    """SAC's policy climbs the critics' value: its loss's gradient on ``value`` is -1/B per
    sample (a detached value leaves the policy only maximising entropy, with gradients still
    flowing through ``log_pi``). The critics regress toward a fixed target."""
    value = torch.randn(5, requires_grad=True)
    sac_policy_loss(value, torch.randn(5), 0.2).backward()
    torch.testing.assert_close(value.grad, torch.full((5,), -1 / 5))
    q1, q2 = torch.randn(5, requires_grad=True), torch.randn(5, requires_grad=True)
    target = torch.randn(5, requires_grad=True)
    twin_critic_loss(q1, q2, target).backward()
    assert target.grad is None and q1.grad is not None


def test_a_run_too_short_for_its_learner_to_step_says_so(tmp_path):
    """TD3's 25,000 random steps before learning, on a 20,000-step run: the run would act at
    random throughout and report the result as a trained policy's. It says so before it
    starts (a notice: a run that only fills replay may be meant), and a run one step longer,
    whose learner steps, says nothing."""
    short = dict(total_steps=300, min_replay_size=300, progress=False)
    with pytest.warns(BudgetNotice, match="raise --total-steps above 300 or lower it"):
        run = rlherd.train("td3", "Pendulum-v1", run_dir=tmp_path / "a", **short)
    assert run.summary["learner_steps"] == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error", BudgetNotice)
        run = rlherd.train("td3", "Pendulum-v1", run_dir=tmp_path / "b",
                           **{**short, "total_steps": 301})  # fmt: skip
    assert run.summary["learner_steps"] > 0
    # Of a run refused anyway (TD3 on Discrete actions), the refusal alone is said.
    with warnings.catch_warnings():
        warnings.simplefilter("error", BudgetNotice)
        with pytest.raises(ConfigError, match="acts in continuous"):
            rlherd.train("td3", "CartPole-v1", run_dir=tmp_path / "c", **short)
