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
ACTION_MASK = "action_mask"

# ---------------------------------------------------------------------------- observations
# An observation is one array, or a dict of named arrays (nested Gymnasium spaces are flattened
# into one level, their keys joined by "."; see rlherd.core.flatten_space). In a batch, a dict
# observation stored under a name such as ``obs`` becomes one field per array, ``obs.image``,
# ``obs.direction``, ..., as the recurrent state becomes ``core_state.0``, ``core_state.1``: every
# buffer, table, wire format and checkpoint then holds plain fields of arrays, and only the code
# that reads an observation (a network, an adder) sees the dict. An action mask travels as the
# observation's ``action_mask`` array (rlherd.envs moves it there from ``info`` or the env's
# ``action_masks()``). These helpers work on numpy arrays and torch tensors alike.


def obs_fields(name: str, obs):
    """The fields an observation is stored as: ``{name: obs}`` for an array, ``{name.key:
    obs[key]}`` for a dict."""
    if isinstance(obs, dict):
        return {f"{name}.{key}": value for key, value in obs.items()}
    return {name: obs}


def obs_of(batch, name: str = OBS):
    """The observation stored as ``name`` in ``batch`` (the inverse of :func:`obs_fields`)."""
    if name in batch:
        return batch[name]
    prefix = name + "."
    obs = {key[len(prefix) :]: value for key, value in batch.items() if key.startswith(prefix)}
    if not obs:
        raise KeyError(name)
    return obs


def map_obs(fn, obs):
    """``fn`` applied to every array of an observation (an array or a dict of arrays)."""
    if isinstance(obs, dict):
        return {key: fn(value) for key, value in obs.items()}
    return fn(obs)


def batch_of_one(obs):
    """One environment's observation as a batch of one (arrays gain a leading 1)."""
    return map_obs(lambda x: x[None] if hasattr(x, "shape") else [x], obs)


def first_array(obs):
    """An observation's array, or the first array of a dict observation (for its leading
    dimensions, which all its arrays share)."""
    return next(iter(obs.values())) if isinstance(obs, dict) else obs


def obs_len(obs) -> int:
    """The leading dimension of an observation (its batch).

    Its shape, not ``len()``: networks call this, and where they are traced (``rlherd export``)
    a shape stays the batch of whatever comes in, while ``len()`` fixes the traced one's."""
    first = first_array(obs)
    return first.shape[0] if hasattr(first, "shape") else len(first)


def action_mask(obs):
    """The observation's action mask (true: legal), or None where it has none."""
    return obs.get(ACTION_MASK) if isinstance(obs, dict) else None
