"""The episode core's two floors, guarded the way the model families are (AST only: no module
under test is imported, so this runs in well under a second).

- The authoring API (`API_FLOOR`: what `import vf` gives an environment author) never imports
  the machinery that runs it (`vf.episode`, or an old import path that re-exports it), not even
  inside a function or under `TYPE_CHECKING`, and never names it to `importlib`.
- The episode core, its API floor and the built-in envs sit in no import circle (function-local
  imports counted, as tests count them: `TYPE_CHECKING` blocks are not imports).
- Seats reach a rollout through its public methods only (one model-call path, `Rollout.call`),
  and the rollout does not dispatch on which seat drives it.
- The trainer's contract with the trace (`token_reset`) and the hook-rewrite records are in the
  published trace schema.

Each checker is also run against a small planted tree, so a checker that silently finds nothing
fails here too.
"""

from __future__ import annotations

import ast
import functools
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

API_FLOOR = [
    "vf.types", "vf.rows", "vf.trace", "vf.imports", "vf.taskset", "vf.toolset", "vf.mcp", "vf.mcp.server",
    "vf.judge", "vf.judges", "vf.judges.decision", "vf.judges.reference", "vf.judges.rubric", "vf.env",
    "vf.harness", "vf.config", "vf.configs", "vf.configs.harness", "vf.configs.judge", "vf.task", "vf.runtimes",
    "vf.clients", "vf.selection",
]
"""The authoring API's modules (vf/__init__.py is the facade over both floors, as verifiers'
`verifiers.v1` is, and is not one of them)."""

MACHINERY = ("vf.episode", "vf.runner", "vf.loading", "vf.program", "vf.intercept", "vf.mcp.client")
"""The episode core, and the old import paths that re-export it."""

CORE = ("vf.episode", "vf.envs", *MACHINERY, *API_FLOOR)
"""Modules no import circle may touch."""


# ---- the import graph (the same mapping tools/circles count with) --------------------------------

def module_files(root: Path) -> dict[str, Path]:
    """Module name → file, for vf/ and the top-level folders installed as vf.* subpackages."""
    mods = {}
    for path in (p for top in ("vf", "trainer", "models", "commands", "environments") for p in (root / top).rglob("*.py")):
        parts = path.relative_to(root).parts
        name = list(parts) if parts[0] == "vf" else ["vf", *parts]
        name[-1] = name[-1][:-3]
        if name[-1] == "__init__":
            name = name[:-1]
        mods[".".join(name)] = path
    return mods


def _resolve(mods: dict[str, Path], current: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:
            pkg = current.split(".")
            if mods[current].name != "__init__.py":
                pkg = pkg[:-1]
            pkg = pkg[:len(pkg) - node.level + 1]
            base = ".".join(pkg + ([base] if base else []))
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
    out = []
    for name in names:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        if name:
            out.append(name)
    return out


def _is_type_checking(node: ast.AST) -> bool:
    test = node.test if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports(mods: dict[str, Path], name: str, type_checking: bool = False) -> set[str]:
    """The modules `name` imports, at any depth (function-local included); `TYPE_CHECKING` blocks
    only when `type_checking`."""
    found = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if _is_type_checking(child) and not type_checking:
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                found.update(m for m in _resolve(mods, name, child) if m != name)
            visit(child)

    visit(_parse(mods[name]))
    return found


@functools.cache
def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def dynamic_imports(path: Path) -> list[str]:
    """Module names passed as constants to `importlib.import_module` / `__import__`."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            fn = ast.unparse(node.func)
            if fn.endswith("import_module") or fn == "__import__":
                out.append(str(node.args[0].value))
    return out


def _within(name: str, prefixes) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def floor_violations(root: Path, floor, machinery) -> list[str]:
    mods = module_files(root)
    bad = []
    for name in floor:
        assert name in mods, f"API floor module {name} not found"
        bad += [f"{name} imports {m}" for m in sorted(imports(mods, name, type_checking=True)) if _within(m, machinery)]
        bad += [f"{name} imports {m} dynamically" for m in dynamic_imports(mods[name]) if _within(m, machinery)]
    return bad


def circles(root: Path, within=("vf",)) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative), among the
    modules reachable from those named by `within` (a circle through one of them lies there)."""
    mods = module_files(root)
    graph: dict[str, set[str]] = {}
    todo = [m for m in mods if _within(m, within)]
    while todo:
        m = todo.pop()
        if m not in graph:
            graph[m] = imports(mods, m)
            todo += graph[m]
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
    for start, targets in graph.items():
        if start in index:
            continue
        work = [(start, iter(sorted(targets)))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on.add(start)
        while work:
            v, edges = work[-1]
            for w in edges:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def private_reaches(path: Path, receiver: str) -> list[str]:
    """`receiver._name` uses (not dunders) in a file: another object's private parts."""
    return [f"{path.name}:{n.lineno} {ast.unparse(n)}" for n in ast.walk(ast.parse(path.read_text()))
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == receiver
            and n.attr.startswith("_") and not n.attr.startswith("__")]


# ---- the guard -----------------------------------------------------------------------------------

def test_the_authoring_api_never_imports_the_episode_core():
    assert floor_violations(ROOT, API_FLOOR, MACHINERY) == []


def test_no_import_circle_touches_the_episode_core():
    touching = [c for c in circles(ROOT, CORE) if any(_within(m, CORE) for m in c)]
    assert touching == []


def test_seats_use_the_rollouts_public_methods_and_the_rollout_knows_no_seat():
    episode = ROOT / "vf" / "episode"
    reaches = [r for p in episode.glob("*.py") if p.name != "rollout.py" for r in private_reaches(p, "rollout")]
    assert reaches == []
    rollout = (episode / "rollout.py").read_text()
    tree = ast.parse(rollout)
    checks = [ast.unparse(n) for n in ast.walk(tree)
              if isinstance(n, ast.Call) and ast.unparse(n.func) == "isinstance"
              and any(s in ast.unparse(n) for s in ("Harness", "Driver", "Loop", "Seat"))]
    assert checks == []
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    assert not names & {"ProgramDriver", "ProgramSeat", "InProcessLoop", "Harness"}
    methods = {n.name for n in ast.walk(tree) if isinstance(n, ast.AsyncFunctionDef)}
    assert "call" in methods and "_generate" in methods and "generate" not in methods  # one way to the model


def test_the_trainers_contract_and_the_hook_records_are_in_the_published_schema():
    schema = json.loads((ROOT / "vf" / "schemas" / "trace-v1.schema.json").read_text())
    node = schema["$defs"]["MessageNode"]["properties"]
    assert node["token_reset"]["default"] is None and "training sample" in node["token_reset"]["description"]
    trace = schema["$defs"]["Trace"]["properties"]
    assert trace["request_rewrites"]["items"] == {"$ref": "#/$defs/InterceptRecord"}
    assert trace["response_rewrites"]["items"] == {"$ref": "#/$defs/InterceptRecord"}


# ---- the checkers catch what they guard against ----------------------------------------------------

@pytest.fixture
def planted(tmp_path: Path) -> Path:
    """A tiny vf tree: an API module that imports the machinery inside a function, one that does so
    under TYPE_CHECKING, one that names it to importlib, and a two-module circle in the core."""
    modules = {  # module name → source (named as modules, not paths: these files exist only here)
        "vf.__init__": "",
        "vf.api": "def f():\n    from vf.episode.run import go\n    return go\n",
        "vf.typed": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from vf.episode import run\n",
        "vf.dyn": "import importlib\nMOD = importlib.import_module('vf.episode.run')\n",
        "vf.clean": "from vf import api\n",
        "vf.episode.__init__": "",
        "vf.episode.run": "from vf.episode.seat import drive\ndef go():\n    return drive\n",
        "vf.episode.seat": "def drive():\n    from vf.episode import run\n    return run\n",
    }
    for name, text in modules.items():
        path = tmp_path.joinpath(*name.split(".")).with_suffix(".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_the_floor_check_catches_local_typed_and_dynamic_imports(planted):
    bad = floor_violations(planted, ["vf.api", "vf.typed", "vf.dyn", "vf.clean"], ("vf.episode",))
    assert bad == ["vf.api imports vf.episode.run", "vf.typed imports vf.episode.run",
                   "vf.dyn imports vf.episode.run dynamically"]


def test_the_circle_check_counts_function_local_imports(planted):
    assert circles(planted) == [["vf.episode.run", "vf.episode.seat"]]


def test_the_private_reach_check_finds_one(tmp_path):
    path = tmp_path / "seat.py"
    path.write_text("async def drive(rollout):\n    rollout.__class__\n    return rollout._cap_reached()\n")
    assert private_reaches(path, "rollout") == ["seat.py:3 rollout._cap_reached"]
