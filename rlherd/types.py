"""Field names and conventions of rlherd batches. This docstring is the contract.

Batches are plain ``dict[str, torch.Tensor]``.

Trajectories (on-policy agents: IMPALA, PPO, A2C) are time-major ``[T + 1, B, ...]``. Row ``t``:

- ``obs[t]``: the observation.
- ``reset[t]``: true when ``obs[t]`` is the *final* observation of an episode. Vector environments
  use Gymnasium's next-step autoreset, so the step taken from a final observation only resets the
  environment; its action is ignored and the transition at ``t`` is masked out of every loss.
- ``action[t]``, ``policy_logits[t]`` (the behaviour policy's logits), ``baseline[t]``: the
  agent's outputs computed from ``obs[t]``.
- PPO, which also acts in continuous spaces, stores ``behaviour_log_prob[t]`` and
  ``policy_params[t]`` (the behaviour distribution's parameters: logits, or a Gaussian's mean
  then log std) instead of ``policy_logits[t]``.
- ``reward[t]``, ``terminated[t]``, ``truncated[t]``: the outcome of ``action[t]``.
- Row ``T`` is the bootstrap row; its outcome fields are not yet known and are never read.
  Consecutive rollouts of one actor overlap by that row (as in TorchBeast).
- Recurrent agents carry their state for row 0 as ``core_state.0``, ``core_state.1``, ... (each
  ``[layers, B, H]``, so rollouts join along dimension 1 like every other field): the state
  *before* reading ``obs[0]``, already zeroed if ``obs[0]`` starts an episode. Inside the
  rollout the state is zeroed before row ``t + 1`` whenever ``reset[t]``.
- A terminated transition has discount 0; a truncated one bootstraps from ``V(obs[t + 1])``
  (``obs[t + 1]`` is the real final observation, with ``reset[t + 1]`` true).

Episode returns and lengths are counted by the environment loop (one
:class:`rlherd.run.counting.EpisodeTracker`), never stored in rollouts.
"""

OBS = "obs"
RESET = "reset"
ACTION = "action"
POLICY_LOGITS = "policy_logits"
BASELINE = "baseline"
BEHAVIOUR_LOG_PROB = "behaviour_log_prob"
POLICY_PARAMS = "policy_params"
REWARD = "reward"
TERMINATED = "terminated"
TRUNCATED = "truncated"
CORE_STATE = "core_state"
