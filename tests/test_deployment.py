"""The trainer's deployment (role × engine × rank) is chosen once, in `trainer/deployment.py`: what
each combination gets, that the loop never tests the flags itself, that one function builds the
weight pusher, and that the trainer's modules import each other without a circle (function-local
imports counted)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from vf.trainer import distributed
from vf.trainer.batches import Rollouts, load_tasks
from vf.trainer.config import resolve
from vf.trainer.deployment import Deployment
from vf.trainer.engine import ServerEvalEngine
from vf.trainer.exchange import Remote
from vf.trainer.learner import Learner
from vf.trainer.monitor import Monitor
from vf.trainer.weights import EmbeddedPush, HttpPush

TRAINER = Path(__file__).parent.parent / "trainer"
SERVER = {"engine": {"base_url": "http://127.0.0.1:9/v1"}}  # nothing listens: building must not connect


def config(**extra):
    return resolve({"seed": 0, "warmup": {"steps": 0}, "steps": 2, "trainer": {"seq_len": 64},
                    "eval": {"at_start": False, "at_end": False}, **extra})


@pytest.fixture(scope="module")
def learner():
    return Learner.build(config(), distributed.Dist())


def test_a_rank_other_than_0_gets_receivers_and_no_ops(tmp_path, learner):
    c = config(wandb={"project": "p", "mode": "offline"}, **SERVER)
    dep = Deployment(c, tmp_path, distributed.Dist(rank=1, world_size=2), "both", say=print)
    dep.connect(learner.model.config)
    assert dep.push is None and dep.push_metrics() == {} and dep.summary() == {}
    assert dep.evaluations(learner) is None and dep.files(0) is None
    assert type(dep.monitor()) is Monitor  # W&B opens on rank 0 only
    rollouts = dep.rollouts(learner, None, [], 0, iter(()), {})
    assert isinstance(rollouts, Rollouts) and rollouts.orch is None
    assert dep.say is not print and list(tmp_path.iterdir()) == []  # said nothing, wrote nothing


def test_the_trainer_role_takes_rollouts_from_the_other_process(tmp_path, learner):
    c = config(**SERVER)
    dep = Deployment(c, tmp_path, distributed.Dist(), "trainer")
    dep.connect(learner.model.config)
    assert dep.push is None  # the orchestrator process owns the servers
    rollouts = learner.with_weights(lambda w: dep.rollouts(learner, None, [], 0, w, {}))
    try:
        assert isinstance(rollouts.orch, Remote)
        assert (tmp_path / "exchange" / "trainer.json").exists()
        assert (tmp_path / "broadcasts" / "step_0" / "STABLE").exists()  # the starting policy, as files
    finally:
        rollouts.close()


def test_server_mode_builds_one_pusher_that_rollouts_and_evaluations_share(tmp_path, learner):
    c = config(eval={"at_start": True, "at_end": True}, **SERVER)
    dep = Deployment(c, tmp_path, distributed.Dist(), "both")
    dep.connect(learner.model.config)
    assert isinstance(dep.push, HttpPush) and dep.push.url == "http://127.0.0.1:9/v1/load_weights"
    evals = dep.evaluations(learner)
    assert evals.push is dep.push and isinstance(evals.engine, ServerEvalEngine)
    assert dep.summary() == {"weight_pushes": 0} and "weight_sync_time" in dep.push_metrics()


def test_the_embedded_engine_brings_its_own_pusher(tmp_path, learner):
    c = config()
    dep = Deployment(c, tmp_path, distributed.Dist(), "both")
    dep.connect(learner.model.config)
    assert dep.push is None and dep.summary() == {}
    loaded, tasks = load_tasks(c)
    rollouts = learner.with_weights(lambda w: dep.rollouts(learner, loaded, tasks, 0, w, {}))
    try:
        assert isinstance(rollouts.orch.pusher, EmbeddedPush)
        assert rollouts.orch.pusher.engine.model is not learner.model  # its own copy of the weights
    finally:
        rollouts.close()


def test_the_loop_asks_the_deployment_and_never_tests_the_mode_flags():
    src = (TRAINER / "loop.py").read_text()
    code = src[src.index('"""', 3) + 3:]  # after the module docstring
    for flag in (r"role\s*==", r"resolved_type", r"is_main", r"push is", r"\bremote\b"):
        assert not re.search(flag, code), f"trainer/loop.py tests {flag}: ask trainer/deployment.py"


def test_one_function_builds_the_server_pusher():
    builders = {p.name for p in TRAINER.glob("*.py")
                if re.search(r"\b(HttpPush|VLLMPush|NcclPush)\(", p.read_text()) and p.name != "weights.py"}
    assert builders == {"engine.py"}


def imports(package: Path, prefix: str) -> dict[str, set[str]]:
    """module → the package modules it imports, anywhere in the file (function-local too)."""
    mods = {p.stem for p in package.glob("*.py") if p.stem != "__init__"} | \
        {p.name for p in package.iterdir() if (p / "__init__.py").exists()}
    graph: dict[str, set[str]] = {}
    for p in package.glob("*.py"):
        out = set()
        for node in ast.walk(ast.parse(p.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            for n in names:
                if n.startswith(prefix):
                    head = n[len(prefix):].split(".")[0]
                    if head in mods and head != p.stem:
                        out.add(head)
        graph[p.stem] = out
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The graph's cycles, one per strongly connected component of more than one node."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_circles_finds_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle_in_the_trainer():
    graph = imports(TRAINER, "vf.trainer.")
    assert {"loop", "batches", "exchange", "deployment", "weights", "lora", "distributed"} <= set(graph)
    assert "exchange" in graph["deployment"] and "batches" in graph["exchange"]  # the graph sees the links
    assert circles(graph) == []
