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
    # A run written before the preset was recorded reads back with none.
    del written["preset"]
    (run.path / "config.json").write_text(json.dumps(written))
    assert RunDir(run.path).read_config() == dataclasses.replace(run.config, preset="")
