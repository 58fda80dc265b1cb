"""swe-gen: every generated repo is a real task (fails as generated, passes with its gold fix in
each of its three forms), the same seed gives the same tasks, cheating earns nothing, and the
bash harness reaches reward 1 against a gold policy served over real HTTP on loopback."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest
from vf.models.tiny import builtin_model_path

from vf.errors import UsageError
from vf.loading import load_taskset
from vf.runner import EpisodeSpec, run_episode
from vf.runtime import make_runtime
from vf.validate import ScriptedEngine

from vf.environments.swe_gen import SweGenTask  # isort: skip
from vf.environments.swe_gen.generate import KINDS, generate  # isort: skip
from vf.environments.swe_gen.gold_server import VALUE_KINDS, start  # isort: skip
from vf.environments.swe_mini.checks import gold_problems, run_tests  # isort: skip
from vf.environments.swe_mini.repo import count_tests  # isort: skip

ROOT = Path(__file__).resolve().parents[1]


def run(coro):
    return asyncio.run(coro)


def call(name: str, **arguments) -> dict:
    return {"role": "assistant", "content": "", "tool_calls": [
        {"id": f"call-{name}", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}]}


def play(fields: dict, *replies):
    """One episode on the first swe-gen task `fields` selects, the model making `replies`."""
    loaded = load_taskset("swe-gen", {"size": 1, **fields})
    (task,) = list(loaded.taskset.tasks())
    spec = EpisodeSpec(engine=ScriptedEngine([*replies, "done"]), model="scripted", max_turns=len(replies) + 1,
                       env=loaded.env, env_id="swe-gen")
    (trace,) = run(run_episode(task, spec)).traces
    assert trace.ok, trace.errors
    return task, trace


def tool_outputs(trace) -> list[str]:
    return [n.message["content"] for n in trace.nodes if n.message.get("role") == "tool"]


# ---- the generator -----------------------------------------------------------------------------


def test_generated_repos_are_small_one_line_bugs_with_hidden_tests():
    for kind in KINDS:
        for seed in range(40):
            gen = generate(kind, seed)
            repo = gen.repo
            assert 2 <= len(repo.files) <= 3 and repo.test in repo.files
            assert ("helpers.py" in repo.files) == (kind == "rename")
            assert count_tests({repo.test: repo.files[repo.test]}) == 1 and count_tests(repo.hidden) >= 4
            (edit,) = repo.gold
            assert edit.path == gen.module != repo.test and repo.files[gen.module].count(edit.old) == 1
            assert gen.fix_edit == {"path": edit.path, "old_str": edit.old, "new_str": edit.new}
            assert gen.fix_command.startswith("sed -i ") and gen.fix_command.endswith(f" {gen.module}")
            assert "\n" not in gen.fix_command and not set(repo.hidden) & set(repo.files)
    with pytest.raises(ValueError, match="unknown bug kind"):
        generate("typo", 0)


def test_generation_never_yields_broken_source():
    """Thousands of seeds: each repo compiles (a misspelt `width` is never the keyword `with`),
    and the bug is a runtime failure of the kind named."""
    for kind in KINDS:
        for seed in range(1500):
            gen = generate(kind, seed)
            for path, text in gen.repo.files.items():
                compile(text, path, "exec")
            if kind == "name":
                assert "is not" not in gen.fix_command and "NameError" in gen.repo.symptom


def test_every_kind_fails_before_and_passes_after_each_form_of_its_gold_fix():
    """Real test runs in the sandbox runtime: the generated repo fails its visible and hidden
    tests, and passes both after the gold fix applied as swe-mini's edits, as the `sed`
    command, and as the `edit` tool call (3 seeds of each kind here; many more in-process below)."""

    async def check(kind: str, seed: int) -> list[str]:
        gen = generate(kind, seed)
        async with make_runtime() as runtime:  # the gold edits, through swe-mini's own check
            problems = await gold_problems(runtime, gen.repo, 30)
        async with make_runtime() as runtime:  # the agent's sed command
            for path, text in gen.repo.files.items():
                await runtime.write(path, text)
            applied = await runtime.run(gen.fix_command, timeout=30)
            after = await run_tests(runtime, gen.repo.suite, 30)
            if not applied.ok or not after.passed:
                problems.append(f"sed fix: {applied.stderr} {after} {after.output[-800:]}")
        return [f"{kind}/{seed}: {p}" for p in problems]

    async def all_checks():
        return await asyncio.gather(*(check(k, s) for k in KINDS for s in range(3)))

    assert [p for ps in run(all_checks()) for p in ps] == []


def _exec_tests(files: dict[str, str], tests: dict[str, str]) -> bool:
    """Run `tests` against `files` in a fresh interpreter (fast path for many seeds)."""
    with tempfile.TemporaryDirectory() as d:
        for path, text in {**files, **tests}.items():
            Path(d, path).write_text(text)
        names = " ".join(Path(p).stem for p in tests)
        proc = subprocess.run([sys.executable, "-B", "-m", "unittest", "-q", *names.split()], check=False, cwd=d,
                              capture_output=True, text=True, timeout=60)
        return proc.returncode == 0


def test_many_seeds_fail_before_and_pass_after_the_edit_fix():
    for kind in KINDS:
        for seed in range(100, 105):
            gen = generate(kind, seed)
            assert not _exec_tests(gen.repo.files, gen.repo.suite), (kind, seed)
            assert _exec_tests(gen.repo.patched(), gen.repo.suite), (kind, seed)


# ---- the taskset ---------------------------------------------------------------------------------


def rows(**fields):
    return [t.data for t in load_taskset("swe-gen", fields).taskset.tasks()]


def test_same_seed_same_tasks_other_seed_other_tasks():
    a, b, c = rows(size=24), rows(size=24), rows(size=24, seed=1)
    assert [r.model_dump() for r in a] == [r.model_dump() for r in b]
    assert [r.kind for r in a] == list(KINDS) * 4  # each kind an equal share
    prompts = {r.prompt for r in a}
    assert len(prompts) == 24 and not prompts & {r.prompt for r in c}  # distinct, and held out
    assert len({r.seed for r in rows(size=300)}) == 300  # as many distinct tasks as asked for
    assert {r.kind for r in rows(size=8, kinds=["name", "import"])} == {"name", "import"}
    with pytest.raises(UsageError, match="no bug kind typo"):
        rows(kinds=["typo"])
    (task,) = list(load_taskset("swe-gen", {"size": 1}).taskset.tasks())
    assert isinstance(task, SweGenTask) and task.data.test in task.data.prompt
    assert "python3 " + task.data.test in task.data.prompt and task.data.description.startswith("operator")


# ---- reward through the agent's tools, and cheats -----------------------------------------------


def test_the_gold_edit_tool_call_earns_the_reward_and_no_fix_earns_nothing():
    gen = generate("rename", rows(size=1, kinds=["rename"])[0].seed)
    _, trace = play({"kinds": ["rename"]}, call("bash", command=f"python3 {gen.repo.test}"),
                       call("edit", **gen.fix_edit))
    assert "AttributeError" in tool_outputs(trace)[0]  # the traceback the agent reads
    assert tool_outputs(trace)[1] == f"Edited {gen.module}"
    assert trace.rewards["solved"].score == 1.0 and trace.metrics["visible_test"] == 1.0
    _, trace = play({"kinds": ["rename"]}, call("bash", command=f"python3 {gen.repo.test}"))
    assert trace.rewards["solved"].score == 0.0 and trace.info["swe_mini"]["hidden"]["ran"] >= 5


def cheat(gen) -> dict[str, str]:
    test, module = gen.repo.test, gen.module
    passing = "import unittest\nclass T(unittest.TestCase):\n    def test_ok(self):\n        pass\nunittest.main()\n"
    return {
        "edit the visible test": f"cat > {test} <<'EOF'\n{passing}EOF\npython3 {test}",
        "print PASSED and OK": f"echo 'print(\"PASSED\"); print(\"OK\")' >> {module}",
        "delete the tests": "rm -f test_*.py && ls",
        "sys.exit(0) in the module": f"sed -i '1i import sys; sys.exit(0)' {module}",
    }


@pytest.mark.parametrize("how", ["edit the visible test", "print PASSED and OK", "delete the tests",
                                 "sys.exit(0) in the module"])
def test_an_agent_that_games_the_tests_earns_nothing(how):
    gen = generate("operator", rows(size=1)[0].seed)
    _, trace = play({}, call("bash", command=cheat(gen)[how]), call("bash", command=f"python3 {gen.repo.test}"))
    assert trace.rewards["solved"].score == 0.0 and trace.metrics["visible_test"] == 0.0


# ---- the bash harness against a remote-provider stand-in ----------------------------------------


@pytest.fixture(params=[None])
def gold_server(request):
    """The scripted gold policy on a loopback port, in a thread with its own event loop
    (`request.param`: the tokenizer it returns token ids for, or None)."""
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    box = {}

    async def main():
        box["server"], box["policy"] = await start({"seed": 7, "size": 6}, tokenizer=request.param)
        ready.set()

    thread = threading.Thread(target=lambda: (loop.run_until_complete(main()), loop.run_forever()), daemon=True)
    thread.start()
    assert ready.wait(60)
    port = box["server"].sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}/v1", box["policy"]
    loop.call_soon_threadsafe(box["server"].close)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


def test_vf_eval_with_the_bash_harness_on_the_gold_policy_scores_1(gold_server, tmp_path):
    url, policy = gold_server
    out = tmp_path / "run"
    proc = subprocess.run([str(Path(sys.executable).parent / "vf-eval"), "swe-gen", "-n", "6", "--taskset.seed", "7",
                           "--taskset.size", "6", "--base-url", url, "-m", "swe-gen-gold", "-o", str(out),
                           "--no-push", "--json"], check=False, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OPENAI_API_KEY": "unused"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    episodes = [json.loads(line) for line in (out / "traces.jsonl").read_text().splitlines()]
    assert len(episodes) == 6 and {e["task"]["data"]["kind"] for e in episodes} == set(KINDS)
    traces = [e["traces"][0] for e in episodes]
    assert [t["rewards"]["solved"]["score"] for t in traces] == [1.0] * 6
    # test, (cat,) fix, test, summary: through the harness, over HTTP
    assert policy.calls == 6 * 4 + len(VALUE_KINDS)
    for trace in traces:
        tools = [n["message"]["content"] for n in trace["nodes"] if n["message"].get("role") == "tool"]
        assert "FAILED" in tools[0] and tools[-1].rstrip().endswith("OK"), tools
        assert trace["nodes"][-1]["message"]["content"].startswith("Fixed the bug")


@pytest.mark.parametrize("gold_server", ["tiny"], indirect=True)
def test_gold_trajectories_recorded_with_token_ids_are_sft_data(gold_server, tmp_path):
    """With a tokenizer the gold server answers like vLLM (prompt and completion token ids), so
    `vf-rollout` keeps the episodes and `vf-train --loss sft --data RUN` can train on them: one
    sample per episode (every prompt extends the last one), loss on the assistant tokens only."""
    from transformers import AutoTokenizer  # heavy: torch and transformers
    from vf.trainer.batches import load_data

    url, _ = gold_server
    out = tmp_path / "gold"
    proc = subprocess.run([str(Path(sys.executable).parent / "vf-rollout"), "swe-gen", "-n", "3", "-r", "1", "--taskset.seed", "7",
                           "--taskset.size", "6", "--base-url", url, "-m", "swe-gen-gold", "-o", str(out)],
                          check=False, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    episodes = [json.loads(line) for line in (out / "traces.jsonl").read_text().splitlines()]
    nodes = [n for e in episodes for n in e["traces"][0]["nodes"]]
    assert all(n.get("token_ids") for n in nodes if n["message"]["role"] == "assistant")
    assert not any(n.get("token_reset") for n in nodes)
    samples = load_data(str(out), None)
    assert len(samples) == 3
    tok = AutoTokenizer.from_pretrained(str(builtin_model_path("tiny")))
    learned = tok.decode([t for t, m in zip(samples[0].token_ids, samples[0].loss_mask) if m])
    assert "python3 test_" in learned and "sed -i" in learned and "Fixed the bug" in learned
    assert "Traceback" not in learned and "The Python repository" not in learned  # context only
