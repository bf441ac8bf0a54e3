"""Monte Carlo tree search over a batch of trees, in numpy: Acme's MCTS (the Acme paper, section
3.5; ``acme/agents/tf/mcts/search.py``) run for every environment of an actor at once, with the
trees stored as arrays the way DeepMind's ``mctx`` stores them.

Each tree has room for ``num_simulations + 1`` nodes; node 0 is the root. A node is a state, and
the edge into it holds the reward of the step that reached it, so the value of taking ``a`` at
``s`` is ``Q(s, a) = reward[child] + discount * V(child)``, with ``V`` the mean of the returns
backed up through the child. One simulation, in every tree at once:

1. **select**: descend from the root by PUCT (:func:`puct_scores`) to an edge never taken, or to
   a node where the episode ended;
2. **expand**: one call of the model steps the new edges of all trees;
3. **evaluate**: one call of the network gives the new states' priors and values (a terminal
   state is worth 0; a truncated one keeps its value and is never expanded);
4. **back up**: the bootstrapped, discounted return goes up each path, one visit per node.

Batching pays where the calls are: the model and the network see every tree's new state in one
call instead of one call per tree (``benchmarks/mcts_throughput.py`` measures it). Two-player
games use a negative ``discount``: each step's value is negated for the player who moved before
it (negamax), with no other change.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import numpy as np


class ModelStep(NamedTuple):
    """What a model returns for ``K`` (state, action) pairs: the ``K`` next states (opaque to the
    search), their observations, the rewards of the steps, whether each ended the episode
    (``terminal``: worth 0 from then on; ``truncated``: the episode was cut, the state keeps its
    value), and the actions legal in each (``None``: all of them)."""

    states: list[Any]
    obs: np.ndarray
    reward: np.ndarray
    terminal: np.ndarray
    truncated: np.ndarray
    legal: np.ndarray | None


class Model(Protocol):
    """Steps copies of states without touching the environments being played."""

    def step(self, states: list[Any], actions: np.ndarray) -> ModelStep: ...


# obs [K, ...] -> (logits [K, A], value [K]): the policy-value network, one call for K states.
Evaluate = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]


@dataclass
class SearchSettings:
    """How to search; the agent's config holds the same fields (see ``MCTSConfig``)."""

    num_simulations: int = 50
    discount: float = 0.99  # negative for two-player zero-sum games (values negate each ply)
    puct_c: float = 1.0  # the exploration weight (Acme's ``ucb_scaling``)
    dirichlet_alpha: float = 1.0  # root noise's concentration
    dirichlet_fraction: float = 0.0  # how much noise mixes into the root prior (Acme: none)


class Tree:
    """``B`` trees of up to ``N`` nodes over ``A`` actions, as arrays indexed ``[tree, node]``.

    ``children[b, n, a]`` is the node reached by ``a`` from ``n`` (-1: never taken);
    ``final[b, n]`` marks nodes where the episode ended (never expanded), whose value is
    ``final_value[b, n]``; ``states[b][n]`` is the model's state of node ``n``."""

    def __init__(self, batch: int, num_nodes: int, num_actions: int):
        shape = (batch, num_nodes)
        self.prior = np.zeros((*shape, num_actions), np.float64)
        self.legal = np.ones((*shape, num_actions), bool)
        self.children = np.full((*shape, num_actions), -1, np.int64)
        self.visits = np.zeros(shape, np.int64)
        self.value_sum = np.zeros(shape, np.float64)
        self.reward = np.zeros(shape, np.float64)
        self.final = np.zeros(shape, bool)
        self.final_value = np.zeros(shape, np.float64)
        self.num_nodes = np.ones(batch, np.int64)
        self.states: list[list[Any]] = [[] for _ in range(batch)]

    @property
    def batch(self) -> int:
        return len(self.num_nodes)

    def value(self, trees: np.ndarray, nodes: np.ndarray) -> np.ndarray:
        """Mean backed-up return of each node (0 before its first visit)."""
        return self.value_sum[trees, nodes] / np.maximum(self.visits[trees, nodes], 1)

    def child_stats(self, trees: np.ndarray, nodes: np.ndarray, discount: float):
        """``Q(node, a)`` and ``N(node, a)`` for every action ``[K, A]``; both 0 for an action
        never taken."""
        children = self.children[trees, nodes]
        taken = children >= 0
        safe = np.where(taken, children, 0)
        rows = trees[:, None]
        visits = np.where(taken, self.visits[rows, safe], 0)
        q = self.reward[rows, safe] + discount * self.value(rows, safe)
        return np.where(taken, q, 0.0), visits


def puct_scores(tree: Tree, trees: np.ndarray, nodes: np.ndarray, s: SearchSettings) -> np.ndarray:
    """The PUCT score of every action at ``nodes`` (equation 19 of the Acme paper, as Acme's
    ``puct``): ``Q(s, a) + puct_c * P(s, a) * sqrt(N(s)) / (N(s, a) + 1)``, where ``Q`` is 0 for
    an action never tried. Illegal actions score -inf.

    ``Q`` is in the units of the returns, so ``puct_c`` must be too: where returns reach 100
    (CartPole's), a weight of 1 is swamped and the search follows whichever action it tried
    first. (Scaling ``Q`` to [0, 1] per node as ``mctx`` does, with ``puct_c`` 1.25, reached
    120-145 on CartPole where the raw values with ``puct_c`` 100 reached 500: the scaling
    magnifies differences of a fraction of a step between nearly equal values.)"""
    q, n_child = tree.child_stats(trees, nodes, s.discount)
    n_parent = tree.visits[trees, nodes].astype(np.float64)
    u = s.puct_c * np.sqrt(n_parent)[:, None] * tree.prior[trees, nodes] / (n_child + 1.0)
    return np.where(tree.legal[trees, nodes], q + u, -np.inf)


def random_argmax(scores: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Argmax over the last axis, ties broken at random (as Acme's ``argmax``)."""
    best = scores == scores.max(-1, keepdims=True)
    return np.argmax(best * (rng.random(scores.shape) + 1e-12), -1)


def masked_softmax(logits: np.ndarray, legal: np.ndarray | None) -> np.ndarray:
    """Softmax over the legal actions (all of them where none is legal: a game's end, whose
    prior is never used)."""
    if legal is not None:
        logits = np.where(legal | ~legal.any(-1, keepdims=True), logits, -np.inf)
    z = np.exp(logits - logits.max(-1, keepdims=True))
    return z / z.sum(-1, keepdims=True)


class Paths(NamedTuple):
    """Where one simulation went in each tree: the nodes from the root (``nodes[b, :depth+1]``),
    and for trees that reached an edge never taken, the node it leaves and its action."""

    nodes: np.ndarray
    depth: np.ndarray
    new_edge: np.ndarray
    action: np.ndarray


def select(tree: Tree, s: SearchSettings, rng: np.random.Generator) -> Paths:
    """Descend every tree by PUCT, one level per pass over the trees still descending."""
    batch = tree.batch
    nodes = np.zeros((batch, tree.visits.shape[1] + 1), np.int64)
    depth = np.zeros(batch, np.int64)
    new_edge = np.zeros(batch, bool)
    action = np.zeros(batch, np.int64)
    descending = ~tree.final[:, 0]
    while descending.any():
        trees = np.flatnonzero(descending)
        here = nodes[trees, depth[trees]]
        a = random_argmax(puct_scores(tree, trees, here, s), rng)
        child = tree.children[trees, here, a]
        action[trees] = a
        stop = child < 0
        new_edge[trees[stop]] = True
        descending[trees[stop]] = False
        down, child = trees[~stop], child[~stop]
        depth[down] += 1
        nodes[down, depth[down]] = child
        descending[down] = ~tree.final[down, child]
    return Paths(nodes, depth, new_edge, action)


def expand(tree: Tree, paths: Paths, model: Model, evaluate: Evaluate) -> np.ndarray:
    """Step the new edges with the model, add their nodes, evaluate them; the value each path
    backs up (a new state's, or the final value of the node it stopped at)."""
    rows = np.arange(tree.batch)
    leaf = paths.nodes[rows, paths.depth]
    values = tree.final_value[rows, leaf]
    trees = np.flatnonzero(paths.new_edge)
    if len(trees) == 0:
        return values
    parents = leaf[trees]
    step = model.step([tree.states[b][p] for b, p in zip(trees, parents, strict=True)],
                      paths.action[trees])  # fmt: skip
    new = tree.num_nodes[trees]
    tree.num_nodes[trees] += 1
    tree.children[trees, parents, paths.action[trees]] = new
    tree.reward[trees, new] = step.reward
    tree.final[trees, new] = step.terminal | step.truncated
    if step.legal is not None:
        tree.legal[trees, new] = step.legal
    for b, state in zip(trees, step.states, strict=True):
        tree.states[b].append(state)
    logits, value = evaluate(step.obs)
    tree.prior[trees, new] = masked_softmax(logits, step.legal)
    value = np.where(step.terminal, 0.0, value)
    tree.final_value[trees, new] = np.where(tree.final[trees, new], value, 0.0)
    paths.depth[trees] += 1
    paths.nodes[trees, paths.depth[trees]] = new
    values[trees] = value
    return values


def backup(tree: Tree, paths: Paths, values: np.ndarray, discount: float) -> None:
    """Add each path's return to every node on it, from the leaf up: a node gets the return from
    its state, and passes ``reward + discount * return`` to its parent."""
    ret = values.astype(np.float64).copy()
    for d in range(int(paths.depth.max()), -1, -1):
        trees = np.flatnonzero(paths.depth >= d)
        nodes = paths.nodes[trees, d]
        tree.value_sum[trees, nodes] += ret[trees]
        tree.visits[trees, nodes] += 1
        ret[trees] = tree.reward[trees, nodes] + discount * ret[trees]


def search(
    roots: list[Any],
    obs: np.ndarray,
    legal: np.ndarray | None,
    model: Model,
    evaluate: Evaluate,
    s: SearchSettings,
    rng: np.random.Generator,
) -> Tree:
    """Search from ``roots`` (the model's states of ``B`` environments, observed as ``obs``)."""
    logits, _ = evaluate(obs)
    tree = Tree(len(roots), s.num_simulations + 1, logits.shape[-1])
    prior = masked_softmax(logits, legal)
    if s.dirichlet_fraction > 0:  # AlphaZero's root noise, kept off illegal actions
        noise = rng.dirichlet(np.full(logits.shape[-1], s.dirichlet_alpha), size=len(roots))
        prior = (1 - s.dirichlet_fraction) * prior + s.dirichlet_fraction * noise
        prior = prior * (True if legal is None else legal)
        prior /= prior.sum(-1, keepdims=True)
    tree.prior[:, 0] = prior
    if legal is not None:
        tree.legal[:, 0] = legal
    for b, state in enumerate(roots):
        tree.states[b].append(state)
    for _ in range(s.num_simulations):
        paths = select(tree, s, rng)
        backup(tree, paths, expand(tree, paths, model, evaluate), s.discount)
    return tree


def visit_policy(tree: Tree, temperature: float = 1.0) -> np.ndarray:
    """The root's action distribution, ``N(root, a) ** (1 / temperature)`` normalised; the most
    visited action with ``temperature`` 0. Uniform over legal actions before any visit."""
    trees = np.arange(tree.batch)
    _, visits = tree.child_stats(trees, np.zeros_like(trees), 1.0)
    visits = visits.astype(np.float64)
    visits = np.where(visits.sum(-1, keepdims=True) > 0, visits, tree.legal[:, 0])
    if temperature == 0:
        best = visits == visits.max(-1, keepdims=True)
        return best / best.sum(-1, keepdims=True)
    visits = visits ** (1.0 / temperature)
    return visits / visits.sum(-1, keepdims=True)
