"""One agent, every runtime: every registered agent on every runtime either learns a small task
to its known score with a fixed seed, or fails at once with a ConfigError that says why and
where the agent runs. The Builder is the only seam: runtimes import no agent, and every builder
follows the protocol of its dataflow."""

import ast
import inspect
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import learn_to

import rlherd
from rlherd import core
from rlherd.agents import BUILDERS
from rlherd.errors import ConfigError
from rlherd.runtime import RUNTIMES, settings

ROOT = Path(__file__).resolve().parents[1]
CORRIDOR = "rlherd/Corridor-v0"  # optimal return 0.95; a random walk gets about 0.7
# The same corridor observed as a dict of arrays (Discrete, MultiBinary) with an action mask,
# whose illegal action is an error: dict observations and masks crossing every runtime.
DICT_CORRIDOR = "rlherd/DictCorridor-v0"
REACH = "rlherd/Reach-v0"  # continuous actions: optimal return about 0.88; random about -10.9
DEEP_SEA = "rlherd/DeepSea-v0"  # optimal return 0.99; random actions find it once in 1,024 tries

# (env, most steps, score to reach) for every pair that must learn; an online run stops on
# reaching it (an offline one is judged at its end).
# The device runtime has no Corridor, so its pairs learn CartPole to 195 (CartPole-v0's "solved"
# threshold; random: ~22).
HOSTS = ("single", "mono", "poly", "distributed")
LEARNS = {
    **{("dqn", r): (DICT_CORRIDOR, 10_000, 0.9) for r in HOSTS},
    **{("impala", r): (CORRIDOR, 20_000, 0.9) for r in HOSTS},
    **{("ppo", r): (DICT_CORRIDOR, 20_000, 0.9) for r in HOSTS},
    # With their exploration on, the continuous agents' training returns end at 0.3-0.8 (seeds
    # 0-4 on single), and once at 0.24 (mpo on poly); a policy that does not read the goal gets
    # about -10.9, and one that reaches it at all, slowly, about 0.
    **{(a, r): (REACH, 4_000, 0.0) for a in ("d4pg", "mpo", "sac", "td3") for r in HOSTS},
    # D4PG on distributed (not deterministic) reached 0 by 709-1,641 actor steps in 38 runs of
    # 38, alone and four at a time, but ended one run of the whole suite at -2.56 at 4,000 with
    # 3,400 updates, three times the most that 32 logged passing runs needed (1,124): 8,000 is a
    # margin, not a measured cure.
    ("d4pg", "distributed"): (REACH, 8_000, 0.0),
    # Searching with a simulator of DeepSea, MCTS goes right to the treasure once its value has
    # learned the way (seed 0 on single: 0.99 from episode ~120); a random policy gets ~0. With
    # several actors a run is not deterministic, and 3 of 13 distributed runs never found the
    # treasure in 2,000 steps (passing ones within 4 episodes): there, Corridor (0.93-0.95, 3 of 3).
    ("mcts", "single"): (DEEP_SEA, 2_000, 0.5),
    **{("mcts", r): (CORRIDOR, 2_000, 0.9) for r in ("mono", "distributed")},
    # R2D2 starts learning once 200 sequences are in (about 4,000 Corridor steps); with its toy
    # preset, seed 0 on mono held 0.95 from 6,000 steps on in 4 of 4 runs. On distributed, seed
    # 0 reached 0.93-0.94 at about 10,000 steps (88-99 learner steps) in 4 of 4 runs beside a
    # busy core. (While the learner node did not take the run's seed, each run started from a
    # network of its own: 2 runs of 10 failed in 20,000 steps, one never leaving the first cell.)
    # R2D3 and DQfD mix in Corridor's scripted expert (always right):
    # DQfD, half of each batch, learns it on every host runtime (seed 0: 0.95 at 3,000 steps on
    # mono; on distributed 0.88 at 3,000, 0.95 at 5,000 in 8 of 8 runs here, 0.42 at 5,000 in
    # one run of the whole suite, hence 8,000), and so covers each runtime's
    # mixing; R2D3 (a quarter of each batch, sequences) learns on single and runs R2D2's code
    # elsewhere (it failed its 8,000 and 6,000 steps on mono and distributed in one of two runs
    # of the suite, with the classic preset R2D2 then had on Corridor).
    ("r2d2", "single"): (CORRIDOR, 6_000, 0.9),
    **{("r2d2", r): (CORRIDOR, 10_000, 0.9) for r in ("mono", "poly")},
    ("r2d2", "distributed"): (CORRIDOR, 20_000, 0.9),
    ("r2d3", "single"): (CORRIDOR, 6_000, 0.9),
    **{("dqfd", r): (CORRIDOR, 3_000, 0.9) for r in ("single", "mono", "poly")},
    ("dqfd", "distributed"): (CORRIDOR, 8_000, 0.9),
    ("ddpg", "single"): (REACH, 4_000, 0.0),
    ("dmpo", "single"): (REACH, 4_000, 0.0),
    # 150k steps was on the edge: seed 0 ended at 240 or 151 with Adam's plain or fused kernel
    # (seeds 1 and 2 at ~175 and 203); 300k gives 500, 488 and 407 on seeds 0-2.
    ("impala", "device"): ("CartPole-v1", 300_000, 195.0),
    ("ppo", "device"): ("CartPole-v1", 30_000, 195.0),
    # Offline, from the scripted experts' datasets in conftest.py (30% random actions; their
    # returns are 0.93 and 0.63), learner steps, greedy evaluation. Seed 0 reached 0.95 (dqn,
    # bc) from 1,200 and 200 steps, and 0.81 (d4pg, mpo) from 1,200 and 2,000.
    ("dqn", "offline"): (CORRIDOR, 2_000, 0.9),
    ("bc", "offline"): (CORRIDOR, 1_000, 0.9),
    ("d4pg", "offline"): (REACH, 2_000, 0.7),
    ("mpo", "offline"): (REACH, 2_000, 0.7),
    ("crr", "offline"): (REACH, 2_000, 0.7),  # seed 0: 0.78 (BC on the same dataset: 0.65)
    # SAC and TD3 offline, with no penalty, seed 0: 0.90 and 0.93 on this dataset.
    **{(a, "offline"): (REACH, 2_000, 0.7) for a in ("sac", "td3")},
    # Discrete CQL; the continuous one takes ~0.1 s a step at its preset's sizes, and learns
    # Reach with small networks in tests/test_offline.py.
    ("cql", "offline"): (CORRIDOR, 2_000, 0.9),
    ("r2d2", "offline"): (CORRIDOR, 600, 0.9),  # seed 0: 0.95 from 200 steps, as sequences
}
# pair -> what the error must say
REFUSED = {
    **{(a, "device"): "replay" for a in ("dqn", "d4pg", "ddpg", "mpo", "dmpo", "mcts", "bc",
                                         "crr", "cql", "r2d2", "sac", "td3")},
    **{(a, "device"): "replay" for a in ("dqfd", "r2d3")},
    **{(a, "offline"): "mixes demonstrations" for a in ("dqfd", "r2d3")},
    ("mcts", "poly"): "its actors search",
    ("mcts", "offline"): "no offline dataset holds",
    **{(a, "offline"): "fixed dataset of transitions" for a in ("impala", "ppo")},
    **{(a, r): "fixed dataset only" for a in ("bc", "crr", "cql") for r in HOSTS},
}
# Builders that differ from another only in name and presets (a scalar or categorical critic):
# every method a runtime calls is the other's, so on the runtimes the other learns on, they run
# the same code; they learn on `single` themselves (LEARNS).
# DQfD and R2D3 are DQN and R2D2 with demonstrations, which the runtimes mix in (each runtime's
# mixing learns in one of their LEARNS pairs).
VARIANTS = {"ddpg": "d4pg", "dmpo": "mpo", "dqfd": "dqn", "r2d3": "r2d2"}
COVERED = {(v, r): (base, r) for v, base in VARIANTS.items() for r in (*HOSTS, "offline")
           if (v, r) not in LEARNS and (v, r) not in REFUSED}  # fmt: skip


def test_the_matrix_covers_every_agent_and_runtime():
    """A new agent or runtime must be placed in this matrix (and the README's table)."""
    placed = set(LEARNS) | set(REFUSED) | set(COVERED)
    assert placed == {(a, r) for a in BUILDERS for r in RUNTIMES}
    assert not set(LEARNS) & set(REFUSED) and not set(COVERED) & (set(LEARNS) | set(REFUSED))
    assert all(base in LEARNS for base in COVERED.values())


@pytest.mark.parametrize("variant, base", sorted(VARIANTS.items()))
def test_variants_share_everything_a_runtime_calls(variant, base):
    """What makes COVERED honest: the variant subclasses its base and overrides no method."""
    variant_class, base_class = BUILDERS[variant], BUILDERS[base]
    assert issubclass(variant_class, base_class)
    own = {k for k, v in vars(variant_class).items() if callable(v) and not k.startswith("__")}
    assert not own, f"{variant} overrides {own}: give it its own rows in LEARNS"
    assert variant_class.dataflow == base_class.dataflow


@pytest.mark.slow
@pytest.mark.parametrize(
    "agent, runtime",
    [pytest.param(a, r, marks=[pytest.mark.ray] if r == "distributed" else []) for a, r in
     sorted(LEARNS)],
)  # fmt: skip
def test_agent_learns_on_runtime(agent, runtime, tmp_path, request):
    env, steps, score = LEARNS[agent, runtime]
    offline = runtime == "offline"
    if offline:  # no training episodes: the greedy policy's evaluations say it
        dataset = request.getfixturevalue("offline_datasets")[env]
        run = rlherd.train(agent, env, runtime=runtime, total_steps=steps, seed=0,
                           run_dir=tmp_path / "run", progress=False, dataset=dataset)  # fmt: skip
        reached = run.summary["eval_return_mean"] >= score
    else:
        run, reached = learn_to(score, agent, env, runtime=runtime, total_steps=steps, seed=0,
                                run_dir=tmp_path / "run", progress=False)  # fmt: skip
    seen = ("final_return_mean", "eval_return_mean", "learner_steps", "actor_steps", "episodes",
            "actor_restarts", "stopped_by")  # fmt: skip
    assert reached, {k: run.summary.get(k) for k in seen}


@pytest.mark.parametrize("agent, runtime", sorted(REFUSED))
def test_agent_on_a_runtime_it_cannot_use_is_a_clear_error(agent, runtime, tmp_path):
    with pytest.raises(ConfigError, match=REFUSED[agent, runtime]) as error:
        rlherd.train(agent, "CartPole-v1", runtime=runtime, run_dir=tmp_path / "run",
                     progress=False)  # fmt: skip
    works = [r for r in RUNTIMES if (agent, r) in LEARNS or (agent, r) in COVERED]
    assert f"runs on: {', '.join(works)}" in str(error.value)
    assert not (tmp_path / "run").exists()


def test_readme_table_matches_the_matrix():
    lines = (ROOT / "README.md").read_text().splitlines()
    start = lines.index(
        "| agent | `single` | `mono` | `poly` | `distributed` | `device` | `offline` |"
    )
    runtimes = ["single", "mono", "poly", "distributed", "device", "offline"]
    table = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        agent, *cells = [cell.strip() for cell in line.strip("|").split("|")]
        for runtime, cell in zip(runtimes, cells, strict=True):
            table[agent.strip("`"), runtime] = cell.startswith("yes")
    assert set(table) == set(LEARNS) | set(REFUSED) | set(COVERED)
    assert {pair for pair, works in table.items() if works} == set(LEARNS) | set(COVERED)


# ------------------------------------------------------------------------------ the seam
def _imports(path: Path) -> set[str]:
    """Every module a file imports, wherever the import statement is (functions included)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_no_runtime_imports_an_agent():
    for path in (ROOT / "rlherd" / "runtime").glob("*.py"):
        agents = {m for m in _imports(path) if m.startswith("rlherd.agents")}
        assert not agents, f"{path.name} imports {agents}: runtimes reach agents via builders"
    # Nor through anything they import.
    modules = ", ".join(r.module for r in RUNTIMES.values())
    code = f"import sys, {modules}; print([m for m in sys.modules if 'rlherd.agents' in m])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def _protocol_methods(protocol: type) -> dict[str, inspect.Signature]:
    return {name: inspect.signature(member) for cls in protocol.__mro__
            if cls.__module__ == core.__name__ for name, member in vars(cls).items()
            if inspect.isfunction(member) and not name.startswith("_")}  # fmt: skip


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_builders_follow_their_dataflows_protocol(name):
    builder_class = BUILDERS[name]
    builder = builder_class(builder_class.config_class())
    protocol = {"replay": core.ReplayBuilder, "rollout": core.RolloutBuilder}[builder.dataflow]
    assert isinstance(builder, protocol)
    for method, expected in _protocol_methods(protocol).items():
        got = inspect.signature(getattr(builder_class, method))
        assert list(got.parameters) == list(expected.parameters), f"{name}.{method}{got}"
    # What runtimes read besides the methods.
    assert builder.name == name and builder.dataflow in ("replay", "rollout")
    for preset, suggested in builder.runtime_defaults.items():
        assert preset in builder.presets
        unknown = set(suggested) - set(settings.all_fields())
        assert not unknown, f"{name}'s {preset} suggests unknown runtime settings {unknown}"


def test_every_runtime_declares_settings_that_check_themselves_and_a_run():
    for name, runtime in RUNTIMES.items():
        assert runtime.name == name and runtime.dataflows, name
        assert callable(runtime.hook("run")), name
        with pytest.raises(ConfigError, match="torch_threads must be >= 1"):
            runtime.settings(torch_threads=0).check()


def test_a_setting_the_runtime_does_not_use_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="num_actors is a setting of the mono, poly"):
        rlherd.train("ppo", "CartPole-v1", runtime="single", num_actors=4,
                     run_dir=tmp_path / "run", progress=False)  # fmt: skip
    with pytest.raises(ConfigError, match="did you mean num_envs"):  # a typo of either kind
        rlherd.train("ppo", "CartPole-v1", runtime="device", num_env=4,
                     run_dir=tmp_path / "run", progress=False)  # fmt: skip
    # A setting of the runtime that this agent's dataflow would ignore.
    with pytest.raises(ConfigError, match="num_buffers only applies to rollout agents"):
        rlherd.train("dqn", "CartPole-v1", runtime="mono", num_buffers=8,
                     run_dir=tmp_path / "run", progress=False)  # fmt: skip
    assert not (tmp_path / "run").exists()
