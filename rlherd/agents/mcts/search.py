"""Monte Carlo tree search over a batch of trees, in numpy: Acme's MCTS (the Acme paper, section
3.5; ``acme/agents/tf/mcts/search.py``) run for every environment of an actor at once, with the
trees stored as arrays (as DeepMind's ``mctx`` stores them, but flat: see :class:`Tree`).

Each tree has room for ``num_simulations + 1`` nodes; its first is its root. A node is a state, and
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
call instead of one call per tree (``benchmarks/mcts_throughput.py`` measures it). A batch of
one tree (a bsuite run, which plays one environment) selects and backs up in plain Python
instead (:func:`select_one`, :func:`backup_one`), with the same arithmetic in the same order, so
its tree is the same to the last bit. Two-player
games use a negative ``discount``: each step's value is negated for the player who moved before
it (negamax), with no other change.
"""

from __future__ import annotations

import math
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


UNTRIED_VALUES = ("zero", "parent")  # an untried action's Q: 0 (Acme's), or its node's value


@dataclass
class SearchSettings:
    """How to search; the agent's config holds the same fields (see ``MCTSConfig``)."""

    num_simulations: int = 50
    discount: float = 0.99  # negative for two-player zero-sum games (values negate each ply)
    puct_c: float = 1.0  # the exploration weight (Acme's ``ucb_scaling``)
    dirichlet_alpha: float = 1.0  # root noise's concentration
    dirichlet_fraction: float = 0.0  # how much noise mixes into the root prior (Acme: none)
    untried_value: str = "zero"  # one of UNTRIED_VALUES (see puct_scores)


class Tree:
    """``B`` trees of up to ``N`` nodes over ``A`` actions, in flat arrays indexed by node id:
    node ``n`` of tree ``b`` is ``b * N + n``, so tree ``b``'s root is ``b * N``
    (:attr:`roots`). One flat index per array keeps each level of a batched descent to one
    index per statistic, with no mask (a batch of one tree descends in plain Python:
    :func:`select_one`).

    ``children[node, a]`` is the node reached by ``a``; an edge never taken leads to
    :attr:`untaken`, one more node that is never visited and has no value and no reward, so an
    untried action's ``Q`` and ``N`` read as 0 with no mask. ``final[node]`` marks nodes where
    the episode ended (never expanded), whose value is ``final_value[node]``; ``states[node]``
    is the model's state of the node. A tree holds ``N`` nodes (:func:`search` makes room for
    every simulation's); :func:`expand` refuses one more, which would be the next tree's root."""

    def __init__(self, batch: int, num_nodes: int, num_actions: int):
        size = batch * num_nodes + 1
        self.nodes_per_tree, self.untaken = num_nodes, size - 1
        self.roots = np.arange(batch, dtype=np.int64) * num_nodes
        self.next_node = self.roots + 1  # the id of each tree's next new node
        self.prior = np.zeros((size, num_actions), np.float64)
        self.legal = np.ones((size, num_actions), bool)
        self.children = np.full((size, num_actions), self.untaken, np.int64)
        self.visits = np.zeros(size, np.int64)
        self.value_sum = np.zeros(size, np.float64)
        self.reward = np.zeros(size, np.float64)
        self.final = np.zeros(size, bool)
        self.final_value = np.zeros(size, np.float64)
        self.states: list[Any] = [None] * (size - 1)

    @property
    def batch(self) -> int:
        return len(self.roots)

    def value(self, nodes: np.ndarray) -> np.ndarray:
        """Mean backed-up return of each node (0 before its first visit)."""
        return self.value_sum[nodes] / np.maximum(self.visits[nodes], 1)


def puct_scores(tree: Tree, nodes: np.ndarray, s: SearchSettings) -> np.ndarray:
    """The PUCT score of every action at ``nodes`` (equation 19 of the Acme paper, as Acme's
    ``puct``): ``Q(s, a) + puct_c * P(s, a) * sqrt(N(s)) / (N(s, a) + 1)``, where ``Q(s, a)`` is
    ``reward + discount * V(child)``, 0 for an action never tried. Illegal actions score -inf.

    With ``untried_value="parent"`` an action never tried is worth what its node is worth so
    far (its mean backed-up return), as Gumbel MuZero completes the Q-values of unvisited
    actions (mctx's ``qtransform_completed_by_mix_value``). At 0, once one action has paid
    anything, an untried one is tried only when its prior term alone outscores it: on bsuite's
    deterministic bandits the search kept to the first good arm it found.

    ``Q`` is in the units of the returns, so ``puct_c`` must be too: where returns reach 100
    (CartPole's), a weight of 1 is swamped and the search follows whichever action it tried
    first. (Scaling ``Q`` to [0, 1] per node as ``mctx`` does, with ``puct_c`` 1.25, reached
    120-145 on CartPole where the raw values with ``puct_c`` 100 reached 500: the scaling
    magnifies differences of a fraction of a step between nearly equal values.)"""
    children = tree.children[nodes]
    q = tree.reward[children] + s.discount * tree.value(children)
    if s.untried_value == "parent":
        q = np.where(children == tree.untaken, tree.value(nodes)[:, None], q)
    n_parent = tree.visits[nodes].astype(np.float64)
    u = s.puct_c * np.sqrt(n_parent)[:, None] * tree.prior[nodes] / (tree.visits[children] + 1.0)
    return np.where(tree.legal[nodes], q + u, -np.inf)


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
    """Where one simulation went in each tree: the nodes from the root (``nodes[b, :depth+1]``,
    node ids), and for trees that reached an edge never taken, the node it leaves and its
    action."""

    nodes: np.ndarray
    depth: np.ndarray
    new_edge: np.ndarray
    action: np.ndarray


def select(tree: Tree, s: SearchSettings, rng: np.random.Generator) -> Paths:
    """Descend every tree by PUCT, one level per pass over the trees still descending."""
    batch = tree.batch
    nodes = np.zeros((batch, tree.nodes_per_tree + 1), np.int64)
    nodes[:, 0] = tree.roots
    depth = np.zeros(batch, np.int64)
    new_edge = np.zeros(batch, bool)
    action = np.zeros(batch, np.int64)
    trees = np.flatnonzero(~tree.final[tree.roots])
    here = tree.roots[trees]
    while len(trees):
        a = random_argmax(puct_scores(tree, here, s), rng)
        child = tree.children[here, a]
        action[trees] = a
        taken = child != tree.untaken
        new_edge[trees[~taken]] = True
        trees, child = trees[taken], child[taken]
        depth[trees] += 1
        nodes[trees, depth[trees]] = child
        going_on = ~tree.final[child]
        trees, here = trees[going_on], child[going_on]
    return Paths(nodes, depth, new_edge, action)


def select_one(tree: Tree, s: SearchSettings, rng: np.random.Generator) -> Paths:
    """:func:`select` for a batch of one tree, in plain Python. Each level of :func:`select`'s
    descent is some forty numpy calls on arrays of a few numbers, whose cost is the calls', not
    the arithmetic's: for one tree (a bsuite run's), :func:`select` and :func:`backup` take over
    half of an agent step. The scores are :func:`puct_scores`' and the ties
    :func:`random_argmax`'s, computed in the same order on the same draws, so the path is the
    same to the last bit (where the network's values are finite: a NaN, from a network that
    diverged, breaks ties differently)."""
    node = int(tree.roots[0])
    path, action, new_edge = [node], 0, False  # the nodes from the root
    while not tree.final[node]:
        scores = _puct_scores_one(tree, node, s)
        best, draws = max(scores), rng.random(len(scores)).tolist()
        action = max(range(len(scores)), key=lambda a: (scores[a] == best) * (draws[a] + 1e-12))
        child = int(tree.children[node, action])
        if child == tree.untaken:
            new_edge = True
            break
        path.append(child)
        node = child
    nodes = np.zeros((1, tree.nodes_per_tree + 1), np.int64)
    nodes[0, : len(path)] = path
    return Paths(nodes, np.array([len(path) - 1]), np.array([new_edge]), np.array([action]))


def _puct_scores_one(tree: Tree, node: int, s: SearchSettings) -> list[float]:
    """:func:`puct_scores` of one node, on Python floats (the same IEEE arithmetic)."""
    visits, value_sum = tree.visits, tree.value_sum
    n = int(visits[node])
    weight = s.puct_c * math.sqrt(n)
    untried = float(value_sum[node]) / max(n, 1) if s.untried_value == "parent" else None
    scores = []
    for child, prior, legal in zip(tree.children[node].tolist(), tree.prior[node].tolist(),
                                   tree.legal[node].tolist(), strict=True):  # fmt: skip
        n_child = int(visits[child])
        q = float(tree.reward[child]) + s.discount * (float(value_sum[child]) / max(n_child, 1))
        if untried is not None and child == tree.untaken:
            q = untried
        scores.append(q + weight * prior / (n_child + 1.0) if legal else -math.inf)
    return scores


def expand(tree: Tree, paths: Paths, model: Model, evaluate: Evaluate) -> np.ndarray:
    """Step the new edges with the model, add their nodes, evaluate them; the value each path
    backs up (a new state's, or the final value of the node it stopped at)."""
    leaf = paths.nodes[np.arange(tree.batch), paths.depth]
    values = tree.final_value[leaf]
    trees = np.flatnonzero(paths.new_edge)
    if len(trees) == 0:
        return values
    new = tree.next_node[trees]
    if (new - tree.roots[trees] >= tree.nodes_per_tree).any():
        raise RuntimeError(f"a tree of {tree.nodes_per_tree} nodes is full: one more would "
                           "overwrite the next tree's root")  # fmt: skip
    parents, actions = leaf[trees], paths.action[trees]
    step = model.step([tree.states[p] for p in parents], actions)
    tree.next_node[trees] += 1
    tree.children[parents, actions] = new
    tree.reward[new] = step.reward
    tree.final[new] = step.terminal | step.truncated
    if step.legal is not None:
        tree.legal[new] = step.legal
    for node, state in zip(new, step.states, strict=True):
        tree.states[node] = state
    logits, value = evaluate(step.obs)
    tree.prior[new] = masked_softmax(logits, step.legal)
    value = np.where(step.terminal, 0.0, value)
    tree.final_value[new] = np.where(tree.final[new], value, 0.0)
    paths.depth[trees] += 1
    paths.nodes[trees, paths.depth[trees]] = new
    values[trees] = value
    return values


def backup(tree: Tree, paths: Paths, values: np.ndarray, discount: float) -> None:
    """Add each path's return to every node on it, from the leaf up: a node gets the return from
    its state, and passes ``reward + discount * return`` to its parent."""
    ret = values.astype(np.float64)
    for d in range(int(paths.depth.max()), -1, -1):
        trees = np.flatnonzero(paths.depth >= d)
        nodes = paths.nodes[trees, d]
        tree.value_sum[nodes] += ret[trees]
        tree.visits[nodes] += 1
        ret[trees] = tree.reward[nodes] + discount * ret[trees]


def backup_one(tree: Tree, paths: Paths, values: np.ndarray, discount: float) -> None:
    """:func:`backup` for a batch of one tree, in plain Python (see :func:`select_one`)."""
    ret = float(values[0])
    for node in reversed(paths.nodes[0, : int(paths.depth[0]) + 1].tolist()):
        tree.value_sum[node] += ret
        tree.visits[node] += 1
        ret = float(tree.reward[node]) + discount * ret


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
    tree.prior[tree.roots] = prior
    if legal is not None:
        tree.legal[tree.roots] = legal
    for root, state in zip(tree.roots, roots, strict=True):
        tree.states[root] = state
    descend, back_up = (select_one, backup_one) if tree.batch == 1 else (select, backup)
    for _ in range(s.num_simulations):
        paths = descend(tree, s, rng)
        back_up(tree, paths, expand(tree, paths, model, evaluate), s.discount)
    return tree


def visit_policy(tree: Tree, temperature: float = 1.0) -> np.ndarray:
    """The root's action distribution, ``N(root, a) ** (1 / temperature)`` normalised; the most
    visited action with ``temperature`` 0. Uniform over legal actions before any visit."""
    visits = tree.visits[tree.children[tree.roots]].astype(np.float64)
    visits = np.where(visits.sum(-1, keepdims=True) > 0, visits, tree.legal[tree.roots])
    if temperature == 0:
        best = visits == visits.max(-1, keepdims=True)
        return best / best.sum(-1, keepdims=True)
    visits = visits ** (1.0 / temperature)
    return visits / visits.sum(-1, keepdims=True)
