"""vf-migrate never crashes on a v0 module Python can parse, always writes code that compiles, is
idempotent, and flags what it cannot translate with TODO(vf-migrate).

Generated v0 environments combine imports, parsers, rubrics (literal and not, JudgeRubric,
RubricGroup, add_reward_func/add_metric, group rewards), env classes (SingleTurnEnv, MultiTurnEnv
and StatefulToolEnv subclasses with setup_state, ToolEnv, EnvGroup, unknown), load_environment
signatures, datasets and odd syntax; hand-written ones cover shapes the generator does not.
`VF_FUZZ_N` sets the number of generated modules (default 80: about 15 s on 2 cores, in 4 tests).
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from vf.migrate import plan

N = int(os.environ.get("VF_FUZZ_N", "80"))
TODO = "TODO(vf-migrate)"
# (JudgeRubric and EnvGroup are migrated: a vf.Judge with v0's judge(), compat.V0Taskset)
UNTRANSLATABLE = ("RubricGroup", "completions")


def _choice(rng, *options):
    return rng.choice(options)


def generate(seed: int) -> str:
    """One random v0 environment module."""
    rng = random.Random(seed)
    alias = _choice(rng, "vf", "verifiers", "v")
    L = []
    if alias == "verifiers":
        L.append("import verifiers")
    elif alias == "v":
        L.append("import verifiers as v")
    else:
        L.append(_choice(rng, "import verifiers as vf", "import os, verifiers as vf", "import verifiers as vf  # v0"))
    if rng.random() < 0.3:
        L.append("from verifiers import Parser, Rubric")
    if rng.random() < 0.2:
        L.append("from verifiers import EnvGroup")
    L += ["import json", "", 'SYSTEM = """Think step by step.\nAnswer in <answer> tags."""', ""]
    if rng.random() < 0.3:
        L += ["CONST = {'a': 1, **{'b': 2}}", "x = y = 3; z = (w := 4)", ""]

    # reward functions
    names = []
    for i in range(rng.randint(0, 4)):
        name = f"reward_{i}"
        kind = _choice(rng, "plain", "async", "kwargs", "group", "parser", "decorated", "info")
        if kind == "plain":
            L += [f"def {name}(completion, answer) -> float:", "    return float(str(answer) in str(completion))"]
        elif kind == "async":
            L += [f"async def {name}(completion, answer, state):", "    return 1.0 if completion else 0.0"]
        elif kind == "kwargs":
            L += [f"def {name}(**kwargs):", "    return len(kwargs) / 10"]
        elif kind == "group":
            L += [f"def {name}(completions, answers, **kwargs) -> list[float]:",
                  "    return [float(a in str(c)) for c, a in zip(completions, answers)]"]
        elif kind == "parser":
            L += [f"def {name}(parser, completion, answer):", "    return float(parser.parse_answer(completion) == answer)"]
        elif kind == "decorated":
            L += ["def deco(f):", "    return f", "", "@deco", f"def {name}(prompt, completion):", "    return 0.5"]
        else:
            L += [f"def {name}(info: dict | None = None, **_):", "    return float(bool(info))"]
        L.append("")
        names.append(name)
    tools = []
    for i in range(rng.randint(0, 2)):
        t = f"tool_{i}"
        sig = _choice(rng, "a: int, b: int = 2", "text: str, *, upper: bool = False", "q, session=None",
                      "x: float, /, y: float", "items: list[str] | None = None")
        L += [f"def {t}({sig}):", f'    """Tool {i}."""', "    return 'ok'", ""]
        tools.append(t)

    env_kind = _choice(rng, "single", "multi", "tool", "stateful", "unknown", "group_env", "single")
    cls = None
    if env_kind == "multi":
        cls = "GameEnv"
        L += [f"class {cls}({alias}.MultiTurnEnv):"]
        if rng.random() < 0.5:
            L += ["    async def setup_state(self, state, **kwargs):", "        state['n'] = 0", "        return state", ""]
        L += ["    def is_completed(self, messages, state, **kwargs):", "        return state.get('n', 0) > 2", "",
              "    def env_response(self, messages, state, **kwargs):", "        state['n'] = state.get('n', 0) + 1",
              "        return [{'role': 'user', 'content': 'again'}], state", ""]
    elif env_kind == "stateful":
        cls = "SessionEnv"
        L += [f"class {cls}({alias}.StatefulToolEnv):", "    def __init__(self, **kwargs):",
              "        super().__init__(**kwargs)"]
        for t in tools:
            L.append(f"        self.add_tool({t}, args_to_skip={_choice(rng, '[]', repr(['session']), repr(['b']))})")
        if rng.random() < 0.3:
            L.append("        self.add_tool(lambda q: q)")
        L += ["", "    async def setup_state(self, state, **kwargs):", "        state['session'] = 's1'",
              "        return state", "",
              "    def update_tool_args(self, tool_name, tool_args, messages, state, **kwargs):",
              "        tool_args['session'] = state['session']", "        return tool_args", ""]

    # load_environment
    params = _choice(rng, "", "num_examples: int = 5", "split='train', n=3, **kwargs", "*args, **kwargs",
                     "judge_model: str = 'gpt-4.1-mini', *, seed: int = 0", "path, limit: int | None = None",
                     "use_think=True, weights=None")
    L.append(f"def load_environment({params}):")
    if rng.random() < 0.3:
        L.append('    """Build the env."""')
    dataset = _choice(rng, "literal", "call", "none", "both")
    if dataset in ("literal", "both"):
        L.append("    rows = [{'question': f'What is {i}+{i}?', 'answer': str(2 * i)} for i in range(3)]")
    if dataset == "call":
        L.append("    rows = json.loads('[{\"question\": \"q\", \"answer\": \"a\"}]')")
    parser = _choice(rng, None, f"{alias}.Parser()", f"{alias}.XMLParser(['think', 'answer'])",
                     f"{alias}.ThinkParser()", f"{alias}.XMLParser(fields=['answer'], answer_field='answer')")
    if parser:
        L.append(f"    parser = {parser}")
    funcs = list(names)
    if parser and rng.random() < 0.5:
        funcs.append("parser.get_format_reward_func()")
    if rng.random() < 0.15:
        funcs.append("lambda completion, **kw: 1.0")
    weights = [str(round(rng.uniform(0, 1), 2)) for _ in funcs]
    rubric_kind = _choice(rng, "kw", "pos", "var_add", "judge", "group", "nonliteral", "none", "kw")
    if rubric_kind == "kw":
        L.append(f"    rubric = {alias}.Rubric(funcs=[{', '.join(funcs)}], weights=[{', '.join(weights)}]"
                 + (", parser=parser" if parser else "") + ")")
    elif rubric_kind == "pos":
        L.append(f"    rubric = {alias}.Rubric([{', '.join(funcs)}], [{', '.join(weights)}])")
    elif rubric_kind == "var_add":
        L.append(f"    rubric = {alias}.Rubric()")
        for f, w in zip(funcs, weights):
            L.append(f"    rubric.{_choice(rng, 'add_reward_func', 'add_metric')}({f}, weight={w})")
    elif rubric_kind == "judge":
        L.append(f"    rubric = {alias}.JudgeRubric(judge_model={_choice(rng, repr('gpt-4.1'), 'judge_model', 'MODEL')})")
        for f in funcs:
            L.append(f"    rubric.add_reward_func({f})")
    elif rubric_kind == "group":
        L.append(f"    rubric = {alias}.RubricGroup(rubrics=[{alias}.Rubric(funcs=[{', '.join(funcs)}])])")
    elif rubric_kind == "nonliteral":
        L.append(f"    fs = [{', '.join(funcs)}]")
        L.append(f"    rubric = {alias}.Rubric(funcs=fs, weights=[1.0] * len(fs))")
    if rng.random() < 0.2:
        L += ["    def helper(x):", "        return x", "    helper(1)"]
    if rng.random() < 0.15:
        L += ["    match params_kind := 1:", "        case 1:", "            pass", "        case _:", "            pass"]
    args = []
    if dataset in ("literal", "call"):
        args.append(f"{_choice(rng, 'dataset', 'eval_dataset')}=rows")
    elif dataset == "both":
        args += ["dataset=rows", "eval_dataset=rows"]
    if rubric_kind != "none":
        args.append("rubric=rubric")
    if parser:
        args.append("parser=parser")
    if rng.random() < 0.5:
        args.append("system_prompt=SYSTEM")
    if env_kind in ("tool",) and tools:
        args.append(f"tools=[{', '.join(tools)}]")
    if env_kind in ("multi", "tool", "stateful") and rng.random() < 0.7:
        args.append(f"max_turns={rng.randint(1, 6)}")
    if rng.random() < 0.15:
        args.append("**kwargs" if "kwargs" in params else "message_type='chat'")
    if rng.random() < 0.1:
        args.insert(0, "rows")  # a positional argument
    ctor = {"single": f"{alias}.SingleTurnEnv", "multi": cls, "stateful": cls, "tool": f"{alias}.ToolEnv",
            "unknown": "make_env", "group_env": f"{alias}.EnvGroup"}[env_kind]
    call = f"{ctor}({', '.join(args)})"
    if env_kind == "group_env":
        call = f"{alias}.EnvGroup(envs=[{alias}.SingleTurnEnv({', '.join(args)})], env_names=['a'])"
    ret = _choice(rng, "direct", "var", "var", "cond")
    if ret == "direct":
        L.append(f"    return {call}")
    elif ret == "var":
        L += [f"    env = {call}", "    return env"]
    else:
        L.append(f"    return {call} if True else None")
    L.append("")
    return "\n".join(L)


HAND_WRITTEN = {
    "no_return": "import verifiers as vf\n\ndef load_environment():\n    vf.SingleTurnEnv(dataset=[])\n",
    "returns_none": "import verifiers as vf\n\ndef load_environment():\n    return None\n",
    "return_attr": "import verifiers as vf\n\ndef load_environment():\n    return vf.envs.thing\n",
    "early_return": ("import verifiers as vf\n\ndef load_environment(x=1):\n    if x:\n        return vf.SingleTurnEnv()\n"
                     "    return vf.ToolEnv(tools=[])\n"),
    "shebang_coding": ("#!/usr/bin/env python\n# -*- coding: utf-8 -*-\nimport verifiers as vf\n\n"
                       "def load_environment():\n    pass\n"),
    "semicolons": ("import verifiers as vf; import os\n\ndef f(completion): return 1.0\n\n"
                   "def load_environment(): r = vf.Rubric(funcs=[f]); return vf.SingleTurnEnv(dataset=[], rubric=r)\n"),
    "star_import": "from verifiers import *\n\ndef load_environment():\n    return SingleTurnEnv(dataset=[])\n",
    "nested_tools": ("import verifiers as vf\n\ndef load_environment():\n    def add(a: int, b: int) -> int:\n"
                     "        return a + b\n    return vf.ToolEnv(dataset=[], tools=[add])\n"),
    "match_and_walrus": ("import verifiers as vf\n\nmatch 1:\n    case 1:\n        MODE = 'a'\n\n"
                         "def load_environment(x=(y := 2)):\n    return vf.SingleTurnEnv(dataset=[{'question': f'{x=}'}])\n"),
    "async_load": "import verifiers as vf\n\nasync def load_environment():\n    return vf.SingleTurnEnv()\n",
    "class_funcs": ("import verifiers as vf\n\nclass R:\n    @staticmethod\n    def f(completion):\n        return 1.0\n\n"
                    "def load_environment():\n    return vf.SingleTurnEnv(dataset=[], rubric=vf.Rubric(funcs=[R.f]))\n"),
    "global_and_del": ("import verifiers as vf\nG = 1\n\ndef load_environment():\n    global G\n    G += 1\n    del G\n"
                       "    return vf.SingleTurnEnv(dataset=[], rubric=vf.Rubric(funcs=[], weights=[]))\n"),
}


def _check(tmp_path: Path, name: str, source: str) -> None:
    compile(source, name, "exec")  # the input is valid Python
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    report = plan([path])  # must not raise
    out = report.changes[0].new if report.changes else source
    try:
        compile(out, str(path), "exec")
    except SyntaxError as e:
        raise AssertionError(f"{name}: migrated output does not compile: {e}\n--- input ---\n{source}\n"
                             f"--- output ---\n{out}") from None
    manual = [e for e in report.entries if e.status == "manual"]
    if manual:
        assert TODO in out or TODO in source, f"{name}: manual entries {manual} but no {TODO} in the output"
    for construct in UNTRANSLATABLE:
        if construct == "RubricGroup" and "compat.V0Taskset" in out:  # built at load time: compat.RubricGroup runs it
            continue
        if construct in source and "def load_environment" in source and "import verifiers" in source:
            assert TODO in out, f"{name}: {construct} not flagged"
    path.write_text(out)
    again = plan([path])
    assert again.changes == [], f"{name}: not idempotent:\n{again.changes[0].diff() if again.changes else ''}"


@pytest.mark.slow
@pytest.mark.parametrize("chunk", range(4))
def test_generated_v0_environments(tmp_path, chunk):
    for seed in range(chunk, N, 4):
        _check(tmp_path, f"gen_{seed}", generate(seed))


@pytest.mark.parametrize("name", sorted(HAND_WRITTEN))
def test_hand_written_v0_environments(tmp_path, name):
    _check(tmp_path, name, HAND_WRITTEN[name])


def test_corpus_inputs(tmp_path):
    for src in sorted((Path(__file__).parent / "migrate_corpus" / "input" / "envs").glob("*.py")):
        _check(tmp_path, src.stem, src.read_text())


def test_unmigratable_module_is_kept_under_a_todo_header(tmp_path):
    path = tmp_path / "weird.py"
    path.write_text(HAND_WRITTEN["no_return"])
    report = plan([path])
    out = report.changes[0].new
    assert out.startswith("# TODO(vf-migrate): vf-migrate could not migrate this module: load_environment() must end")
    assert out.endswith(HAND_WRITTEN["no_return"])
    assert [e.rule for e in report.entries] == ["ENV900"]
