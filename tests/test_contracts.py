"""The contracts between agents and the code that reads their checkpoints: what a learner's
checkpointed state must hold for evaluation, dataset collection and the device runtime to act
with a finished run's policy without making its learner, and for a run to resume from it."""

import copy
import dataclasses
import math
from typing import Any

import pytest
import torch

from rlherd import core
from rlherd import envs as rl_envs
from rlherd.agents import BUILDERS

CORRIDOR, REACH = "rlherd/Corridor-v0", "rlherd/Reach-v0"
# A small task each agent's networks take; CQL makes a discrete and a continuous learner.
ENVS = {
    **{a: [CORRIDOR] for a in ("bc", "dqfd", "dqn", "impala", "ppo", "r2d2", "r2d3")},
    **{a: [REACH] for a in ("crr", "d4pg", "ddpg", "dmpo", "mpo", "sac", "td3")},
    "cql": [CORRIDOR, REACH],
    "mcts": ["rlherd/DeepSea-v0"],  # a task it has a simulator of
}


def test_every_agent_is_checked():
    assert set(ENVS) == set(BUILDERS)


def _learner(agent: str, env: str) -> tuple[object, core.EnvSpec, torch.nn.Module, object]:
    """A builder, its task's spec, the networks it made and a learner of them; offline-only
    agents (no replay of their own) get tables for a fixed dataset. Nothing is trained."""
    builder_class = BUILDERS[agent]
    builder = builder_class(builder_class.config_class())
    spec = rl_envs.spec_for(env)
    networks = builder.make_networks(spec)
    tables, dataset = None, iter(())
    if builder.dataflow == "replay":
        offline_only = not hasattr(builder.config, "replay_size")
        tables = builder.make_replay_tables(spec, dataset_size=1_000 if offline_only else None)
        dataset = builder.make_dataset(tables)
    return builder, spec, networks, builder.make_learner(networks, dataset, 1_000, tables)


@pytest.mark.parametrize("agent, env", [(a, e) for a in sorted(ENVS) for e in ENVS[a]])
def test_a_learners_checkpoint_holds_its_policy(agent, env):
    """``core.policy_state`` of a learner's checkpointed state loads, every key and shape, into
    a fresh ``make_networks(spec)``, and is the networks the learner trains (not a copy such as
    a target network): the parameters are changed after the learner is made, and the loaded
    network must have the changed ones."""
    builder, spec, networks, learner = _learner(agent, env)
    assert isinstance(learner, core.Learner)
    with torch.no_grad():  # the networks now differ from any copy the learner made of them
        for p in networks.parameters():
            p.add_(torch.randn_like(p))
    fresh = builder.make_networks(spec)
    fresh.load_state_dict(core.policy_state(learner.state_dict()))  # strict: every key, shape
    expected = networks.state_dict()
    for name, tensor in fresh.state_dict().items():
        torch.testing.assert_close(tensor, expected[name], rtol=0, atol=0, msg=name)
    # The learner says the same of itself, and serves it to actors.
    for name, tensor in learner.policy_state().items():
        torch.testing.assert_close(tensor, expected[name], rtol=0, atol=0, msg=name)


# Each learner's checkpoint, by its keys (a network's or an optimiser's own keys left out): what
# runs' checkpoints hold, so a run resumes only if these stay (and benchmarks/box_unchanged.py,
# which hashes every tensor by its path, compares across commits only if they do).
KEYS = {
    ("bc", CORRIDOR): ["net", "num_steps", "optimizer"],
    ("cql", CORRIDOR): ["log_alpha", "net", "num_steps", "optimizer/alpha", "optimizer/q",
                        "target_net"],
    ("cql", REACH): ["log_alpha", "log_entropy", "net", "num_steps", "optimizer/critic",
                     "optimizer/duals", "optimizer/policy", "target_net"],
    ("crr", REACH): ["net", "num_steps", "optimizer", "target_net"],
    **{(a, REACH): ["critic_optimizer", "net", "num_steps", "policy_optimizer", "support/placed",
                    "support/warned", "target"] for a in ("d4pg", "ddpg")},
    **{(a, REACH): ["critic_optimizer", "dual_optimizer", "duals/alpha_mean",
                    "duals/alpha_stddev", "duals/penalty_temperature", "duals/temperature", "net",
                    "num_steps", "policy_optimizer", "support/placed", "support/warned", "target"]
       for a in ("dmpo", "mpo")},
    **{(a, CORRIDOR): ["net", "num_steps", "optimizer", "target_net"]
       for a in ("dqfd", "dqn", "r2d2", "r2d3")},
    ("impala", CORRIDOR): ["consumed_steps", "net", "num_steps", "optimizer"],
    ("sac", REACH): ["log_entropy", "net", "num_steps", "optimizer/critic", "optimizer/duals",
                     "optimizer/policy", "target_net"],
    ("td3", REACH): ["net", "num_steps", "optimizer/critic", "optimizer/policy", "target_net"],
    ("mcts", "rlherd/DeepSea-v0"): ["net", "num_steps", "optimizer"],
    ("ppo", CORRIDOR): ["beta", "consumed_steps", "net", "num_steps", "optimizer"],
}  # fmt: skip


def _keys(state: dict[str, Any]) -> list[str]:
    """The checkpoint's keys, and the keys within parts that are neither a network's state
    (an OrderedDict) nor an optimiser's."""
    keys = []
    for key, part in state.items():
        own = type(part) is dict and "param_groups" not in part
        keys += [f"{key}/{k}" for k in part] if own else [key]
    return sorted(keys)


def _with_optimiser_state(learner: Any) -> Any:
    """``learner`` after one update of each of its optimisers with random gradients, so that they
    have state (moments, step counts) to checkpoint."""
    attributes = vars(learner).values()
    parts = [*attributes, *(p for v in attributes if isinstance(v, dict) for p in v.values())]
    for optimizer in [p for p in parts if isinstance(p, torch.optim.Optimizer)]:
        for group in optimizer.param_groups:
            for p in group["params"]:
                p.grad = torch.randn_like(p)
        optimizer.step()
    return learner


def _same(a: Any, b: Any) -> bool:
    """Equal checkpoint states: the same keys, and every value equal, tensors bit for bit."""
    if isinstance(b, dict):
        return isinstance(a, dict) and set(a) == set(b) and all(_same(a[k], b[k]) for k in b)
    if isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    return type(a) is type(b) and a == b


def _changed(state: Any) -> Any:
    """``state`` with every number changed: tensors, counters, flags and learning rates. An
    optimiser's parameter ids and other hyperparameters stay (they say which parameters are
    whose, and how it updates)."""
    if isinstance(state, torch.Tensor):
        return ~state if state.dtype == torch.bool else state + 1
    if isinstance(state, bool):
        return not state
    if isinstance(state, int | float):
        return state + 1
    if isinstance(state, dict) and "param_groups" in state:
        return dict(
            state=_changed(state["state"]),
            param_groups=[dict(g, lr=g["lr"] + 1) for g in state["param_groups"]],
        )
    if isinstance(state, dict):
        return type(state)((k, _changed(v)) for k, v in state.items())
    return state


@pytest.mark.parametrize("agent, env", [(a, e) for a in sorted(ENVS) for e in ENVS[a]])
def test_a_learners_checkpoint_keeps_its_keys_and_round_trips(agent, env):
    """A learner's checkpoint has the keys runs' checkpoints have (a renamed one fails), and
    loads into a fresh learner whose own checkpoint is then the same, key for key, bit for bit."""
    learner = _with_optimiser_state(_learner(agent, env)[3])
    state = learner.state_dict()
    assert _keys(state) == KEYS[agent, env]
    fresh = _learner(agent, env)[3]
    fresh.load_state_dict(state)
    restored = fresh.state_dict()
    for key in state:
        assert _same(restored[key], state[key]), key


@pytest.mark.parametrize("agent, env", [(a, e) for a in sorted(ENVS) for e in ENVS[a]])
def test_a_learner_restores_every_part_of_its_checkpoint(agent, env):
    """Every part of a checkpoint is loaded, not only saved: a checkpoint whose every number
    differs from a fresh learner's (PPO's ``beta``, MPO's ``duals``, CQL's ``log_entropy``, the
    support's flags, each optimiser's moments and learning rate) is what that learner's own
    checkpoint says after loading it."""
    state = _changed(_with_optimiser_state(_learner(agent, env)[3]).state_dict())
    fresh = _learner(agent, env)[3]
    before = copy.deepcopy(fresh.state_dict())  # its tensors are the learner's, loaded into
    fresh.load_state_dict(state)
    after = fresh.state_dict()
    for key in state:
        assert not _same(before[key], state[key]), f"{key} is not changed: the test cannot fail"
        assert _same(after[key], state[key]), f"{key} is not restored"


# ------------------------------------------------------------------------ a run's record
def test_a_run_is_described_by_a_frozen_record_that_its_directory_reads_back(tmp_path):
    import dataclasses
    import json

    import rlherd
    from rlherd.run.rundir import RunDir, RunRecord

    run = rlherd.train("dqn", CORRIDOR, total_steps=50, seed=3, run_dir=tmp_path / "run",
                       progress=False, eval_every=25)  # fmt: skip
    assert isinstance(run.config, RunRecord)
    assert RunDir(run.path).read_config() == run.config
    assert (run.config.agent, run.config.seed, run.config.preset) == ("dqn", 3, "toy")
    assert "num_envs" in run.config.settings and "n_step" in run.config.config
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.config.seed = 4  # type: ignore[misc]
    # What config.json holds is the record's fields, no more and no less.
    written = json.loads((run.path / "config.json").read_text())
    assert set(written) == {f.name for f in dataclasses.fields(RunRecord)}
    # A run written before the preset (or the machine) was recorded reads back with none.
    del written["preset"], written["machine"]
    (run.path / "config.json").write_text(json.dumps(written))
    assert RunDir(run.path).read_config() == dataclasses.replace(run.config, preset="",
                                                                 machine={})  # fmt: skip


@pytest.mark.parametrize("agent", sorted(ENVS))
def test_every_learning_rate_is_refused_unless_finite(agent):
    """One optimiser step at an infinite rate leaves NaN in every parameter it moves, which
    shows only later (an error from inside a distribution, or a run that learns nothing): each
    agent's config refuses it by name, for each of its optimisers' rates."""
    config_class = BUILDERS[agent].config_class
    rates = [f.name for f in dataclasses.fields(config_class) if f.name.endswith("learning_rate")]
    assert rates, f"{agent} names no learning rate"
    for name in rates:
        with pytest.raises(ValueError, match=f"{name} must be finite"):
            config_class(**{name: math.inf})
