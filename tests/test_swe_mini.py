"""swe-mini: every shipped repo is a real task (fails as shipped, passes with its gold fix), the
reward is earned only by fixing the code through the agent's own tools, and the hidden tests
stay out of the agent's reach. Episodes run through the real harness and the `sandbox` runtime
with a scripted model (vf.validate.ScriptedEngine) making bash/edit tool calls."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest

from vf.errors import UsageError
from vf.loading import load_taskset
from vf.runner import EpisodeSpec, run_episode
from vf.runtime import make_runtime
from vf.validate import ScriptedEngine, validate_task

from vf.environments.swe_mini import SweMiniEnv, SweTask  # isort: skip
from vf.environments.swe_mini.checks import apply_script, gold_problems, run_tests  # isort: skip
from vf.environments.swe_mini.repo import Edit, all_repos, count_tests, parse  # isort: skip


def run(coro):
    return asyncio.run(coro)


def task_for(name: str, env_fields=None):
    loaded = load_taskset("swe-mini", {"repos": [name]}, env_fields)
    (task,) = list(loaded.taskset.tasks())
    return task, loaded.env


def call(name: str, **arguments) -> dict:
    return {"role": "assistant", "content": "", "tool_calls": [
        {"id": f"call-{name}", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}]}


def play(name: str, *replies, env_fields=None):
    """One episode on repo `name` in which the model makes `replies` (tool calls), then stops."""
    task, env = task_for(name, env_fields)
    spec = EpisodeSpec(engine=ScriptedEngine([*replies, "done"]), model="scripted", max_turns=len(replies) + 1,
                       env=env, env_id="swe-mini")
    episode = run(run_episode(task, spec))
    (trace,) = episode.traces
    assert trace.ok, trace.errors
    return trace


def tool_outputs(trace) -> list[str]:
    return [n.message["content"] for n in trace.nodes if n.message.get("role") == "tool"]


# ---- the repos ----------------------------------------------------------------------------------


def test_the_shipped_repos_are_varied():
    repos = all_repos()
    assert 12 <= len(repos) <= 20
    assert len({r.name for r in repos}) == len(repos)
    assert {r.difficulty for r in repos} == {"easy", "medium", "hard"}
    kinds = {r.kind for r in repos}
    assert {"off-by-one", "wrong-operator", "missing-edge-case", "wrong-default", "string-formatting",
            "two-files"} <= kinds
    two_files = [r for r in repos if r.kind == "two-files"]
    assert two_files and all(len({e.path for e in r.gold}) == 2 for r in two_files)
    for r in repos:  # hidden tests add cases; the gold fix touches code, never a test
        assert count_tests(r.hidden) >= 3 and r.test not in {e.path for e in r.gold}
        assert not set(r.hidden) & set(r.files)


def test_every_task_validates_with_its_gold_fix_and_fails_without():
    loaded = load_taskset("swe-mini")

    async def all_checks():  # concurrently: each is a few sandboxed commands, mostly waiting
        tasks = list(loaded.taskset.tasks())
        return tasks, await asyncio.gather(*(validate_task(t, loaded.env) for t in tasks))

    tasks, checks = run(all_checks())
    assert len(checks) == len(all_repos())
    assert [c[0] for c in checks] == [True] * len(checks), [(t.data.repo, c) for t, c in zip(tasks, checks) if not c[0]]

    async def problems(repo):
        async with make_runtime() as runtime:
            return await gold_problems(runtime, repo, 30)

    # a fix that fixes nothing, and a repo shipped already fixed, are caught
    median = next(r for r in all_repos() if r.name == "median")
    no_fix = dataclasses.replace(median, gold=[Edit("stats.py", "def mean(xs):", "def mean(xs):")])
    assert any("patched repo fails the hidden tests" in p for p in run(problems(no_fix)))
    fixed = dataclasses.replace(median, files=median.patched())
    assert run(problems(fixed))[:2] == ["the unpatched repo passes its visible test",
                                        "the unpatched repo passes the hidden tests"]


def test_repo_format_is_checked():
    good = "name: x\ndifficulty: easy\nkind: k\nsymptom: s\ntest: t.py\n=== file t.py\npass\n"
    with pytest.raises(ValueError, match="hidden tests and a gold fix"):
        parse(good)
    with pytest.raises(ValueError, match="must start with - or +"):
        parse(good + "=== hidden h.py\nx\n=== gold t.py\n-pass\n oops\n")
    with pytest.raises(ValueError, match="bad header"):
        parse("nme: x\n" + good)
    repo = parse(good + "=== hidden h.py\n    def test_a(self):\n=== gold t.py\n-pass\n+x = 1\n@@\n-x\n+y\n")
    assert repo.gold == [Edit("t.py", "pass", "x = 1"), Edit("t.py", "x", "y")]
    assert repo.patched() == {"t.py": "y = 1\n"} and count_tests(repo.hidden) == 1


# ---- reward through the agent's tools ---------------------------------------------------------


@pytest.mark.parametrize("name", ["bank", "median"])
def test_gold_fix_through_the_bash_tool_earns_the_reward(name):
    repo = next(r for r in all_repos() if r.name == name)
    trace = play(name, call("bash", command=f"python3 {repo.test}"), call("bash", command=apply_script(repo)),
                 call("bash", command=f"python3 {repo.test} && echo VISIBLE-OK"))
    first, _, last = tool_outputs(trace)
    assert "FAILED" in first and "VISIBLE-OK" in last  # the agent itself sees the test go green
    assert trace.rewards["solved"].score == 1.0 and trace.metrics["visible_test"] == 1.0
    hidden = trace.info["swe_mini"]["hidden"]
    assert hidden["passed"] and hidden["ran"] == hidden["expected"] == count_tests(repo.suite)


def test_gold_fix_through_the_edit_tool_earns_the_reward():
    (edit,) = next(r for r in all_repos() if r.name == "intervals").gold
    trace = play("intervals", call("edit", path=edit.path, old_str=edit.old, new_str=edit.new))
    assert tool_outputs(trace) == [f"Edited {edit.path}"]
    assert trace.rewards["solved"].score == 1.0


def test_no_fix_earns_nothing():
    trace = play("median", call("bash", command="python3 test_stats.py"))
    assert trace.rewards["solved"].score == 0.0 and trace.metrics["visible_test"] == 0.0
    assert trace.info["swe_mini"]["hidden"]["ran"] == 6  # the tests ran, and failed
    trace = play("bank", call("bash", command="sed -i 's/min(MIN_FEE/max(MIN_FEE/' bank/fees.py"))
    assert trace.rewards["solved"].score == 0.0  # half of a two-file fix


PASSING_TEST = "import unittest\nclass T(unittest.TestCase):\n    def test_ok(self):\n        pass\nunittest.main()\n"
FORGE = ("import sys\nnonce = sys.stdin.readline().strip()\n"  # a well-informed cheat: it knows the count
         "print(f'SWE-MINI {nonce} ran=6 failures=0 errors=0 skipped=0', flush=True)\nsys.exit(0)\n")
CHEATS = {
    "edit the visible test": f"cat > test_stats.py <<'EOF'\n{PASSING_TEST}EOF\npython3 test_stats.py",
    "delete the tests": "rm -f test_*.py && ls",
    "shadow unittest": f"cat > unittest.py <<'EOF'\n{FORGE}EOF",
    "forge from site hooks": f"cat > sitecustomize.py <<'EOF'\n{FORGE}EOF\ncp sitecustomize.py usercustomize.py",
    "skip the tests": "sed -i 's/^    if not xs:$/    import unittest; raise unittest.SkipTest(\"no\")\\n    if not xs:/' stats.py",
    "forge a verdict": "echo 'import os; print(\"SWE-MINI x ran=6 failures=0 errors=0 skipped=0\", flush=True); os._exit(0)' >> stats.py",
}


@pytest.mark.parametrize("how", list(CHEATS))
def test_an_agent_that_games_the_tests_earns_nothing(how):
    trace = play("median", call("bash", command=CHEATS[how]))
    assert trace.rewards["solved"].score == 0.0
    assert trace.metrics["visible_test"] == 0.0


def test_hidden_tests_are_not_in_the_work_dir_while_the_agent_runs():
    trace = play("median", call("bash", command="ls -laR; grep -rl 'Hidden' . ; cat test_*.py"))
    (seen,) = tool_outputs(trace)
    assert "test_stats.py" in seen and "TestStats" in seen  # the command did look
    assert "hidden" not in seen.lower() and ".swe-mini-check" not in seen
    assert trace.info["swe_mini"]["hidden"]["ran"] == 6  # ...and they existed only when scoring
    assert "TestMedianHidden" not in json.dumps(trace.nodes[1].message)  # nor in the prompt


def test_checks_run_isolated_from_files_the_agent_left():
    """The runner appends the repo to sys.path: a module the agent left that shadows the standard
    library is not imported; the nonce line and the test count must match."""

    async def go():
        async with make_runtime() as runtime:
            await runtime.write("fractions.py", "raise SystemExit(0)\n")  # would end the run "passed"
            await runtime.write("mod.py", "VALUE = 1\n")
            good = ("import fractions\nimport unittest\nfrom mod import VALUE\n"
                    "class T(unittest.TestCase):\n    def test_a(self):\n"
                    "        self.assertEqual(fractions.Fraction(VALUE, 2), 0.5)\n")
            skip = good + "    def test_b(self):\n        self.skipTest('no')\n"
            listed = await runtime.run("ls -a")
            runs = [await run_tests(runtime, {"t.py": text}, 30) for text in (good, skip)]
            # a stale .pyc: compiled from VALUE = 1, then the source becomes VALUE = 2 with the
            # same size and mtime, so plain python3 would still run VALUE = 1
            await runtime.run("python3 -c 'import mod' && cp -p mod.py ref")
            await runtime.write("mod.py", "VALUE = 2\n")
            stale = await runtime.run("touch -r ref mod.py && python3 -c 'import mod; print(mod.VALUE)'")
            runs.append(await run_tests(runtime, {"t.py": good.replace("VALUE, 2", "VALUE, 4")}, 30))
            return listed.stdout, stale.stdout, runs

    listed, stale, (good, skipped, fresh) = run(go())
    assert (good.passed, good.ran, good.expected) == (True, 1, 1), good.output
    assert (skipped.passed, skipped.ran, skipped.expected) == (False, 2, 2)
    assert "swe-mini-check" not in listed
    assert stale.strip() == "1" and fresh.passed, fresh.output  # the checks compile the source afresh


def test_rescoring_without_a_runtime_leaves_the_signals_empty():
    task, _ = task_for("median")

    trace = dataclasses.make_dataclass("Trace", [("info", dict)])({})
    assert run(task.solved(task.data, trace, None)) is None
    assert run(task.visible_test(task.data, trace, None)) is None
    assert trace.info == {}  # nothing ran


# ---- taskset and env config --------------------------------------------------------------------


def test_taskset_selection_and_order():
    def names(**fields):
        return [t.data.repo for t in load_taskset("swe-mini", fields).taskset.tasks()]

    everything = names()
    assert sorted(everything) == sorted(r.name for r in all_repos())
    assert names() == everything and names(seed=1) != everything
    assert names(repos=["roman", "lru"]) in (["roman", "lru"], ["lru", "roman"])
    assert set(names(difficulty=["hard"])) == {r.name for r in all_repos() if r.difficulty == "hard"}
    ids = [t.data.id for t in load_taskset("swe-mini", {"size": 40}).taskset.tasks()]
    assert len(ids) == 40 and len(set(ids)) == 40  # dealt again past the repo count, ids unique
    with pytest.raises(UsageError, match="no repo nope"):
        names(repos=["nope"])
    task = load_taskset("swe-mini", {"repos": ["money"]}).taskset.take(1)
    (task,) = list(task)
    assert isinstance(task, SweTask) and "python3 test_money.py" in task.data.prompt
    assert "$12.05" in task.data.prompt and "money.py" in task.data.prompt


def test_the_agent_gets_the_bash_harness_unless_told_otherwise():
    def harness(env_fields):
        loaded = load_taskset("swe-mini", {}, env_fields)
        assert isinstance(loaded.env, SweMiniEnv)
        return loaded.env.config.agent.harness

    assert harness(None).id == "bash"
    assert harness({"agent": {"max_turns": 30}}).id == "bash"  # another agent flag keeps it
    assert harness({"agent": {"harness": {"tool_timeout": 5}}}).model_dump()["tool_timeout"] == 5
    assert harness({"agent": {"harness": {"id": "null"}}}).id == "null"


def test_vf_train_loads_swe_mini_with_its_env_and_refuses_the_gold_warmup():
    from vf.trainer.batches import load_tasks
    from vf.trainer.config import resolve
    from vf.trainer.evaluation import eval_config

    config = resolve({"taskset": "swe-mini", "env": {"agent": {"harness": {"id": "null"}}}})
    (member,), tasks = load_tasks(config)  # a mixture of one taskset
    assert member.loaded.env.config.agent.harness.id == "null" and len(tasks) == len(all_repos())
    assert eval_config(config, "m").env == {"agent": {"harness": {"id": "null"}}}
    from vf.trainer.batches import gold_samples

    with pytest.raises(UsageError, match="no gold reply") as caught:  # the SFT warm-up has no reply to learn
        gold_samples(tasks, tokenizer=None)
    assert "--warmup.steps 0" in caught.value.hint
