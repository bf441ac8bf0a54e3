"""How runtimes assemble MPO and DMPO: networks, the replay table, dataset, adders, policy, actor,
learner. DMPO is MPO with a categorical critic: the same builder under another name and presets."""

from __future__ import annotations

from rlherd.agents.acting import GaussianSamplingPolicy
from rlherd.agents.continuous import ContinuousBuilder
from rlherd.agents.mpo.config import PRESETS, MPOConfig
from rlherd.agents.mpo.learning import MPOLearner
from rlherd.agents.mpo.networks import make_networks
from rlherd.core import EnvSpec
from rlherd.networks.continuous import ActorCritic


class MPOBuilder(ContinuousBuilder):
    name = "mpo"
    config_class = MPOConfig
    presets = PRESETS

    def make_networks(self, spec: EnvSpec, device: str = "cpu") -> ActorCritic:
        return make_networks(spec, self.config, self.name).to(device)

    def make_policy(
        self, networks: ActorCritic, evaluation: bool = False
    ) -> GaussianSamplingPolicy:
        return GaussianSamplingPolicy(networks, greedy=evaluation)

    def make_learner(self, networks: ActorCritic, dataset, total_steps: int, tables=None):
        return MPOLearner(networks, self.config, dataset)


# DMPO's supports where Acme sets one: +-150 on the Control Suite, +-1600 on Gymnasium's tasks
# (examples/baselines/rl_continuous/run_dmpo.py); derived from the rewards elsewhere.
DMPO_SUPPORTS = {"control": 150.0, "mujoco": 1600.0}


class DMPOBuilder(MPOBuilder):
    """DMPO (Abdolmaleki et al. 2020; Hoffman et al. 2020, Acme): MPO with D4PG's categorical
    critic."""

    name = "dmpo"
    presets = {
        name: {**fields, "distributional": True,
               **({"vmin": -DMPO_SUPPORTS[name], "vmax": DMPO_SUPPORTS[name]}
                  if name in DMPO_SUPPORTS else {})}
        for name, fields in PRESETS.items()
    }  # fmt: skip


__all__ = ["MPOBuilder", "DMPOBuilder"]
