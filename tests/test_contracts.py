"""The contracts between agents and the code that reads their checkpoints: what a learner's
checkpointed state must hold for evaluation, dataset collection and the device runtime to act
with a finished run's policy without making its learner."""

import pytest
import torch

from rlherd import core
from rlherd import envs as rl_envs
from rlherd.agents import BUILDERS

CORRIDOR, REACH = "rlherd/Corridor-v0", "rlherd/Reach-v0"
# A small task each agent's networks take; CQL makes a discrete and a continuous learner.
ENVS = {
    **{a: [CORRIDOR] for a in ("bc", "dqfd", "dqn", "impala", "ppo", "r2d2", "r2d3")},
    **{a: [REACH] for a in ("crr", "d4pg", "ddpg", "dmpo", "mpo")},
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
