"""vf-migrate: golden outputs, v0-equal rewards of migrated envs, --check/--write/idempotence, run dirs.

Expected rewards are computed by hand from the v0 semantics (verifiers' XMLParser/ThinkParser and
Rubric: total = Σ weight × score) and written here as numbers.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from vf.migrate import plan
from vf.trace import MessageNode, Trace

CORPUS = Path(__file__).parent / "migrate_corpus"
INPUT, EXPECTED = CORPUS / "input", CORPUS / "expected"
PY = sys.executable
VF_EVAL = str(Path(sys.executable).parent / "vf-eval")
ENV = {**os.environ, "NO_COLOR": "1"}


def migrate_cli(*args, cwd=None):
    return subprocess.run([PY, "-m", "vf.commands.migrate", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env=ENV, timeout=120)


@pytest.fixture
def corpus(tmp_path):
    dst = tmp_path / "input"
    shutil.copytree(INPUT, dst)
    return dst


def _changes(root: Path):
    report = plan([root])
    return report, {str(c.path.relative_to(root)): c for c in report.changes}


def test_golden_outputs(corpus):
    report, changes = _changes(corpus)
    listing = sorted(f"{c.action} {rel}" for rel, c in changes.items())
    if os.environ.get("VF_UPDATE_GOLDEN"):
        shutil.rmtree(EXPECTED, ignore_errors=True)
        for rel, c in changes.items():
            if c.new is not None:
                (EXPECTED / rel).parent.mkdir(parents=True, exist_ok=True)
                (EXPECTED / rel).write_text(c.new)
        (EXPECTED / "CHANGES.txt").write_text("\n".join(listing) + "\n")
    assert listing == (EXPECTED / "CHANGES.txt").read_text().splitlines()
    for rel, c in changes.items():
        if c.new is not None:
            assert c.new == (EXPECTED / rel).read_text(), rel
    rules = {e.rule for e in report.entries}
    for rule in ("ENV001", "ENV002", "ENV003", "ENV005", "ENV006", "ENV007", "ENV008", "ENV009", "ENV010", "ENV011",
                 "ENV012", "ENV900", "SCR001", "SCR002",
                 "SCR003", "SCR004", "SCR005", "SCR900", "CFG001", "CFG002", "CFG003", "CFG004", "RUN001", "RUN002"):
        assert rule in rules, rule
    # v1 names: JudgeRubric → vf.Judge, StatefulToolEnv → typed-state Toolset,
    # setup_state → Task.setup, group rewards → Env.finalize (flagged)
    judged = changes["envs/judged.py"].new
    assert "class JudgedJudge(vf.Judge):" in judged and "class JudgedJudgeConfig(vf.JudgeConfig):" in judged
    assert 'model: str = "gpt-4.1-mini"' in judged and "compat.judge_arguments(model='judge_model')" in judged
    assert "TODO(vf-migrate)" not in judged and "JudgeRubric(judge_model=judge_model)" in judged
    assert any(e.rule == "ENV010" and e.status == "migrated" and e.file.endswith("judged.py") for e in report.entries)
    stateful = changes["envs/stateful_tools.py"].new
    assert "class StatefulToolsTools(vf.Toolset[vf.ToolsetConfig, StatefulToolsState]):" in stateful
    assert "def lookup(self, key: str) -> str:" in stateful and "async def setup(self, trace, state):" in stateful
    assert "async def finalize(self, task, episode):" in changes["envs/group_reward.py"].new
    # untranslatable code is kept and flagged, never dropped
    assert "TODO(vf-migrate)" in changes["envs/unmigratable.py"].new
    assert any(e.rule == "ENV900" and e.status == "manual" and e.file.endswith("unmigratable.py")
               for e in report.entries)
    # trainer config states the loss, and the report says the default changed
    assert "name: ipo" in changes["configs/train.yaml"].new
    assert any("IPO" in e.message or "ipo (eps 0.3)" in e.message for e in report.entries if e.rule == "CFG004")
    # a TOML that is no vf config is left alone
    assert "configs/ruff.toml" not in changes


# ---- migrated environments give the v0 numbers ----------------------------------------------------


def _load(tmp_path, name):
    import vf

    path = tmp_path / f"{name}.py"
    path.write_text((EXPECTED / "envs" / f"{name}.py").read_text())
    return vf.load_taskset(str(path))


def _score(loaded, idx, replies):
    from vf.episode.scoring import score

    task = list(loaded.taskset.take(idx + 1))[idx]
    trace = Trace()
    for m in task.messages():
        trace.nodes.append(MessageNode(parent=len(trace.nodes) - 1 if trace.nodes else None, message=m))
    for m in replies:
        m = {"role": "assistant", "content": m} if isinstance(m, str) else m
        trace.nodes.append(MessageNode(parent=len(trace.nodes) - 1, message=m, sampled=m["role"] == "assistant"))
    state = task.state_class()()
    asyncio.run(score(task, trace, state))
    assert not trace.errors, trace.errors
    return trace


@pytest.mark.parametrize("reply, correct, fmt, total", [
    # both fields, starts with <think>, ends with </answer>: format 0.4 + 0.2 + 0.2 + 0.2
    ("<think>\nsmall\n</think>\n<answer>\n1\n</answer>", 1.0, 1.0, 1.2),
    # only <answer> (1 of 2 field sets) and wrong: 0.4*0.5 + spacing 0.2 + ends 0.2
    ("<answer>4</answer>", 0.0, 0.6, 0.12),
    # no tags at all: v0 still gives the 0.2 "spacing" credit
    ("The answer is 1", 0.0, 0.2, 0.04),
])
def test_xml_math_rewards_match_v0(tmp_path, reply, correct, fmt, total):
    loaded = _load(tmp_path, "xml_math")
    trace = _score(loaded, 0, [reply])
    assert trace.rewards["correct_answer"].score == pytest.approx(correct)
    assert trace.rewards["format_reward_func"].score == pytest.approx(fmt)
    assert trace.rewards["format_reward_func"].weight == pytest.approx(0.2)
    assert trace.reward == pytest.approx(total)
    data = list(loaded.taskset.take(3))
    assert [t.data.answer for t in data] == ["1", "3", "5"]
    assert data[0].data.system_prompt.startswith("Think inside")


def test_think_info_rewards_match_v0(tmp_path):
    loaded = _load(tmp_path, "think_info")
    t = _score(loaded, 0, ["<think>fruit</think>An apple."])  # info (JSON string) keyword "apple"
    assert {k: v.score for k, v in t.rewards.items()} == {"keyword_hit": 1.0, "format_reward_func": 1.0}
    assert t.metrics == {"long_enough": 1.0}
    assert t.reward == pytest.approx(1.5)
    t = _score(loaded, 1, ["red"])  # no </think>: ThinkParser parses '' → no keyword; 1 word < 2
    assert t.reward == pytest.approx(0.0) and t.metrics == {"long_enough": 0.0}


def test_calc_tools_toolset_and_rewards(tmp_path):
    from vf.episode.tools import ToolRunner

    loaded = _load(tmp_path, "calc_tools")
    task = list(loaded.taskset.take(1))[0]
    runner = ToolRunner([cls() for cls in task.toolsets])
    assert sorted(runner.functions) == ["add", "multiply"]
    assert asyncio.run(runner.call("add", '{"a": 2, "b": 3}', {})) == "5"
    assert asyncio.run(runner.call("multiply", {"a": 5, "b": 4}, {})) == "20"
    schema = {s["function"]["name"]: s["function"] for s in runner.schemas}
    assert schema["add"]["description"] == "Add two integers."
    assert schema["add"]["parameters"]["properties"]["a"] == {"type": "integer"}
    call = lambda i, n, a: {"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": a}}
    t = _score(loaded, 0, [
        {"role": "assistant", "content": None, "tool_calls": [call(1, "add", '{"a": 2, "b": 3}')]},
        {"role": "tool", "tool_call_id": "c1", "content": "5"},
        {"role": "assistant", "content": None, "tool_calls": [call(2, "multiply", '{"a": 5, "b": 4}')]},
        {"role": "tool", "tool_call_id": "c2", "content": "20"},
        {"role": "assistant", "content": "20"},
    ])
    # exact 1.0 × 1.0 + used_tools 2 tool messages × 0.1
    assert t.rewards["exact"].score == 1.0 and t.rewards["used_tools"].score == 2.0
    assert t.reward == pytest.approx(1.2)


class ScriptedEngine:
    name, supports_tokens = "scripted", False

    def __init__(self, replies):
        self.replies = list(replies)
        self.seen = []

    async def generate(self, request):
        from vf.engines.base import GenerateResult

        self.seen.append([m.get("content") for m in request.messages])
        reply = self.replies.pop(0)
        return GenerateResult(message=reply if isinstance(reply, dict) else {"role": "assistant", "content": reply})

    async def close(self):
        pass


def test_guess_game_multiturn_runs_env_response(tmp_path):
    from vf.runner import EpisodeSpec, run_episode

    loaded = _load(tmp_path, "guess_game")
    assert loaded.env is not None
    engine = ScriptedEngine(["5", "8", "7", "unused"])
    spec = EpisodeSpec(engine=engine, model="m", env=loaded.env, max_turns=8)
    ep = asyncio.run(run_episode(list(loaded.taskset.take(1))[0], spec))
    trace = ep.trace
    assert not trace.errors, trace.errors
    users = [m["content"] for m in trace.messages if m["role"] == "user"][1:]
    assert users == ["higher", "lower", "correct"]
    assert trace.num_turns == 3 and trace.stop_condition == "env_done"
    # solved 1.0 × 1.0 + efficiency 1/3 guesses × 0.5
    assert trace.rewards["solved"].score == 1.0
    assert trace.reward == pytest.approx(1.0 + 0.5 / 3)


def test_stateful_tools_get_state_from_setup_state(tmp_path):
    """v0 StatefulToolEnv: setup_state fills the state, update_tool_args passes it to the tool;
    the model sees only `key`."""
    from vf.runner import EpisodeSpec, run_episode

    loaded = _load(tmp_path, "stateful_tools")
    call = {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": '{"key": "gold"}'}}
    engine = ScriptedEngine([{"role": "assistant", "content": None, "tool_calls": [call]}, "It is 42."])
    ep = asyncio.run(run_episode(list(loaded.taskset.take(1))[0], EpisodeSpec(engine=engine, model="m")))
    t = ep.trace
    assert not t.errors, t.errors
    assert [m["content"] for m in t.messages if m["role"] == "tool"] == ["42"]
    assert t.tools[0]["function"]["parameters"]["required"] == ["key"]
    assert t.rewards["found"].score == 1.0


def test_group_reward_scores_the_episode_traces(tmp_path):
    from vf.migrate import compat
    from vf.trace import Episode

    loaded = _load(tmp_path, "group_reward")
    task = list(loaded.taskset.take(1))[0]
    traces = [_score(loaded, 0, [reply]) for reply in ("yes", "yes indeed")]
    episode = Episode(traces=traces)
    asyncio.run(loaded.env.finalize(task, episode))
    assert [t.rewards["shortest_wins"].score for t in traces] == [1.0, 0.0]
    assert traces[0].rewards["shortest_wins"].weight == 0.5
    assert isinstance(loaded.env, compat.Env)


# ---- CLI: --check, --write, idempotence, dirty git ------------------------------------------------


def test_check_write_idempotent(corpus):
    r = migrate_cli(corpus, "--check")
    assert r.returncode == 1, r.stderr
    r = migrate_cli(corpus, "--json")
    assert r.returncode == 0
    rep = json.loads(r.stdout)
    assert rep["summary"]["files_changed"] == len(rep["changes"]) > 10
    assert {"file", "line", "rule", "status", "message"} <= set(rep["entries"][0])
    assert not (corpus / "configs" / "train.yaml").exists()  # dry run writes nothing
    r = migrate_cli(corpus, "--write")
    assert r.returncode == 0, r.stderr
    assert (corpus / "envs" / "xml_math.py.bak").read_text() == (INPUT / "envs" / "xml_math.py").read_text()
    assert not (corpus / "configs" / "train.toml").exists() and (corpus / "configs" / "train.toml.bak").exists()
    assert (corpus / "configs" / "train.yaml").exists()
    r = migrate_cli(corpus, "--check")  # second run: nothing left to change, but manual steps are open
    assert r.returncode == 1 and "0 file(s) to change" in r.stderr + r.stdout, r.stdout + r.stderr
    again = plan([corpus])
    assert again.changes == []
    left = {(Path(e.file).name, e.rule) for e in again.entries if e.status == "manual"}
    assert ("unmigratable.py", "TODO") in left and ("judged.py", "TODO") not in left  # a judge has nothing to finish
    assert migrate_cli(corpus / "configs", "--check").returncode == 0  # no TODO left there
    (corpus / "envs" / "unmigratable.py").write_text("import vf\n")  # a person finished the TODOs
    (corpus / "envs" / "judged.py").write_text("import vf\n")
    left = {Path(e.file).name for e in plan([corpus / "envs"]).entries if e.status == "manual"}
    assert "unmigratable.py" not in left and "judged.py" not in left


def test_bad_usage_exit_2(tmp_path):
    assert migrate_cli(tmp_path / "missing").returncode == 2
    r = migrate_cli()
    assert r.returncode == 2 and "missing PATH" in r.stderr and "Traceback" not in r.stderr


def test_hostile_files_are_refused_and_the_run_goes_on(tmp_path):
    """2000 nested parentheses in 8 KB crashed libcst (SIGSEGV: the whole run died with no output);
    a 5.5 MB module took minutes and gigabytes. Each is refused naming the limit, every other file
    is still migrated and written, and the command exits 2 (issue 34)."""
    import time

    root = tmp_path / "repo"
    root.mkdir()
    deep = "(" * 2000 + "1" + ")" * 2000
    (root / "deep.py").write_text(f"import verifiers as vf\n\ndef load_environment():\n    x = {deep}\n"
                                  "    return vf.SingleTurnEnv(dataset=[])\n")
    (root / "chain.py").write_text("import subprocess\nsubprocess.run(['vf-eval', 'x'])\nx = " + "+".join(["1"] * 20000))
    (root / "huge.py").write_text("import verifiers as vf\n" + "X = [1, 2, 3]\n" * 400_000
                                  + "def load_environment():\n    return vf.SingleTurnEnv(dataset=[])\n")
    (root / "run.sh").write_text("vf-eval my-env -s -b http://x/v1\n")
    start = time.time()
    r = migrate_cli(root, "--write", "--force")
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert time.time() - start < 60 and "Traceback" not in r.stderr
    out = r.stderr + r.stdout
    assert "deep.py:1: [SRC900] refused" in out and "too many nested parentheses" in out
    assert "chain.py:1: [SRC900] refused" in out and "huge.py:1: [SRC900] refused" in out
    assert "up to 256 KB" in out and "3 file(s) not read or parsed" in r.stderr
    assert (root / "run.sh").read_text() == "vf-eval my-env --base-url http://x/v1\n"  # the rest was written
    assert not (root / "deep.py.bak").exists() and (root / "deep.py").read_text().startswith("import verifiers")
    check = migrate_cli(root, "--check")  # --check reports them too, and finishes
    assert check.returncode == 2 and "3 file(s) not read or parsed" in check.stderr


def test_write_refuses_dirty_git(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    git = lambda *a: subprocess.run(["git", "-C", str(repo), *a], check=True, capture_output=True)
    git("init", "-q")
    (repo / "run.sh").write_text("vf-eval my-env -s -b http://x/v1\n")
    (repo / "notes.txt").write_text("a\n")
    git("add", ".")
    git("-c", "user.email=a@b", "-c", "user.name=a", "commit", "-qm", "init")
    (repo / "notes.txt").write_text("b\n")  # uncommitted change to a tracked file
    r = migrate_cli(repo, "--write")
    assert r.returncode == 2 and "uncommitted" in r.stderr
    assert (repo / "run.sh").read_text() == "vf-eval my-env -s -b http://x/v1\n"
    r = migrate_cli(repo, "--write", "--force")
    assert r.returncode == 0, r.stderr
    assert (repo / "run.sh").read_text() == "vf-eval my-env --base-url http://x/v1\n"
    assert (repo / "run.sh.bak").read_text() == "vf-eval my-env -s -b http://x/v1\n"


# ---- run dirs re-score after conversion ------------------------------------------------------------


def _rescore(*args):
    r = subprocess.run([VF_EVAL, *map(str, args), "--json"], capture_output=True, text=True, env=ENV, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_rundirs_convert_and_rescore(corpus, tmp_path):
    from difflib import SequenceMatcher

    assert migrate_cli(corpus / "rundirs", "--write").returncode == 0
    # v0: the migrated env re-scores each function; the totals are the v0 rewards (1.2, 0.12)
    env = tmp_path / "xml_math.py"
    env.write_text((EXPECTED / "envs" / "xml_math.py").read_text())
    s = _rescore(env, "--score", corpus / "rundirs" / "v0_xml_math")
    # converted task data hashes like the migrated env's load() rows, so --resume matches them
    import vf
    from vf.trace import read_episodes

    loaded = vf.load_taskset(str(env))
    saved = read_episodes(corpus / "rundirs" / "v0_xml_math" / "traces.jsonl")
    assert [e.task.hash for e in saved] == [t.data.hash for t in loaded.taskset.take(2)]
    assert s["num_episodes"] == 2 and s["mean_reward"] == pytest.approx((1.2 + 0.12) / 2)
    # v1 generations A–E on reverse-text: replies "tac", "noom" (for "noom nus"), "der"
    want = (1.0 + SequenceMatcher(None, "noom", "noom nus").ratio() + 1.0) / 3
    for gen in "abcde":
        s = _rescore("--score", corpus / "rundirs" / f"gen_{gen}")
        assert s["num_episodes"] == 3, gen
        assert s["mean_reward"] == pytest.approx(want), gen


def test_migration_guide_documents_every_rule():
    from vf.migrate.rules import RULES

    guide = (Path(__file__).parent.parent / "MIGRATION.md").read_text()
    for rule in RULES:
        assert f"#### {rule.id}: {rule.title}" in guide, rule.id
        assert rule.before.splitlines()[0] in guide and rule.after.splitlines()[0] in guide, rule.id
