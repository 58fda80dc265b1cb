"""Program harnesses side by side with verifiers 0.4.0: the SAME environment and command line
through verifiers' `vf-eval` and vf's, against the scripted stub (tests/openai_stub.py), must give
the same rewards per task and the same conversation on each trace.

    compact   tests/v1_envs/*/compact_harness/: a harness shipped as its own package (one
              `Harness` subclass + its `HarnessConfig`, id `compact`, found on PYTHONPATH) whose
              stdlib program chats with the interception endpoint, runs a bash command, compacts
              its history and writes its answer to a file (the `answer_file` knob says which);
              taskset compact_v1.py, model `bash:cat note.txt`: rewards 1.5, 1.5, 0
    mini_swe  the real mini-swe-agent 2.4.6 (each side's built-in `mini_swe_agent` harness; on
              verifiers through mini_swe_local.py, a subclass with NEEDS_CONTAINER = False that
              its subprocess runtime accepts) on swe_tiny_v1.py: the scripted model's `sed` fixes
              one repo (reward 1) and not the other (reward 0)

verifiers' command lines (run in a scratch dir, PATH=/work/venvs/v04/bin:$PATH for `uv`,
PYTHONPATH=tests/v1_envs/verifiers:tests/v1_envs/verifiers/compact_harness, FAKE_KEY=sk-test):

    vf-eval compact_v1 -m 'bash:cat note.txt' --client.base-url URL --client.api-key-var FAKE_KEY
        --no-push --no-rich --env.agent.runtime.type subprocess --env.agent.harness.id compact
        --env.agent.harness.answer_file final.txt
    vf-eval swe_tiny_v1 -m script ... --env.agent.runtime.type subprocess
        --env.agent.harness.id mini_swe_local          (the stub's script: MINI_SCRIPT)

vf runs the vf copies (tests/v1_envs/vf/, `port()` of the peer copies) with the same arguments on
the subprocess runtime, and on its default bubblewrap sandbox (mini_swe with vf's own id
`mini_swe_agent` there). verifiers' rewards are the constants below; its traces' conversations
are in tests/golden/peer_harnesses_v04.json. With VF_VERIFIERS_PYTHON set, `needs_peer` tests
re-run verifiers and check it still gives them. Re-record (only when the peer changes):
`VF_VERIFIERS_PYTHON=/work/venvs/v04/bin/python python tests/test_peer_harnesses.py`.

mini-swe-agent is installed from PyPI on first use (vf: the agent cache, as in
tests/test_agent_harnesses.py, whose skip-when-offline install this reuses; verifiers: uv).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import openai_stub
import pytest
from openai_stub import bash_call
from test_agent_harnesses import SUBMIT, installed_or_skip, needs_bwrap

from vf.errors import UsageError
from vf.harnesses.mini_swe_agent import MiniSweAgentConfig, MiniSweAgentHarness
from vf.program import build_program_harness, harness_class
from vf.runtime import RuntimeConfig, make_runtime

HERE = Path(__file__).parent
PEER_ENVS = HERE / "v1_envs" / "verifiers"
ENVS = HERE / "v1_envs" / "vf"
GOLDEN = HERE / "golden" / "peer_harnesses_v04.json"
PEER_PYTHON = os.environ.get("VF_VERIFIERS_PYTHON")
needs_peer = pytest.mark.skipif(not PEER_PYTHON, reason="set VF_VERIFIERS_PYTHON to a python with verifiers==0.4.0")

MINI_SCRIPT = [bash_call("sed -i 's/a - b/a + b/' calc.py"), bash_call("python3 test_calc.py"), bash_call(SUBMIT)]

# case → (env module, model, harness id on verifiers, extra flags, the stub's script)
CASES = {
    "compact": ("compact_v1", "bash:cat note.txt", "compact", ["--env.agent.harness.answer_file", "final.txt"], None),
    "mini_swe": ("swe_tiny_v1", "script", "mini_swe_local", [], MINI_SCRIPT),
}
# verifiers 0.4.0's rewards per task idx (sum of score × weight), same stub
PEER_REWARDS = {"compact": {"0": 1.5, "1": 1.5, "2": 0.0}, "mini_swe": {"0": 1.0, "1": 0.0}}


def command(case: str, url: str, runtime: str, harness: str | None = None) -> list[str]:
    """The arguments after the env, identical for both CLIs."""
    _, model, peer_harness, flags, _ = CASES[case]
    return ["-m", model, "--client.base-url", url, "--client.api-key-var", "FAKE_KEY", "--no-push", "--no-rich",
            "--env.agent.runtime.type", runtime, "--env.agent.harness.id", harness or peer_harness, *flags]


def pythonpath(envs: Path) -> str:
    """Where a user's environment and harness packages are importable from."""
    return os.pathsep.join([str(envs), str(envs / "compact_harness")])


def _content(message: dict):
    """A message's text with what depends on the machine taken out: mini-swe-agent's tool results
    are JSON (the return code is kept; the output names host paths) and its prompt holds `uname`."""
    content = message.get("content")
    if message["role"] == "tool" and isinstance(content, str) and content.startswith("{"):
        return {"returncode": json.loads(content).get("returncode")}
    if isinstance(content, str):
        return re.sub(r"<system_information>.*?</system_information>", "<system_information/>", content, flags=re.DOTALL)
    return content


def outcome(traces: Path) -> dict:
    """Per task idx: how it ended, its rewards and its conversation (parent, role, text, tool calls)."""
    out = {}
    for line in traces.read_text().splitlines():
        episode = json.loads(line)
        (trace,) = episode["traces"]
        nodes = [[n.get("parent"), n["message"]["role"], _content(n["message"]),
                  [[c.get("name") or c["function"]["name"], c.get("arguments") or c["function"]["arguments"]]
                   for c in n["message"].get("tool_calls") or []]] for n in trace["nodes"]]
        out[str(episode["task"]["data"]["idx"])] = {
            "ok": episode["ok"], "stop": trace["stop_condition"], "errors": [e["message"] for e in trace["errors"]],
            "rewards": {k: [v["score"], v["weight"]] for k, v in trace["rewards"].items()}, "nodes": nodes}
    return dict(sorted(out.items()))


def total(task: dict) -> float:
    return sum(score * weight for score, weight in task["rewards"].values())


def run_ours(case: str, url: str, tmp: Path, runtime: str, harness: str | None = None) -> dict:
    env = {**os.environ, "PYTHONPATH": pythonpath(ENVS), "FAKE_KEY": "sk-test", "NO_COLOR": "1"}
    proc = subprocess.run([str(Path(sys.executable).parent / "vf-eval"), str(ENVS / f"{CASES[case][0]}.py"),
                           *command(case, url, runtime, harness), "-o", str(tmp / "run")],
                          cwd=tmp, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return outcome(tmp / "run" / "traces.jsonl")


def run_peer(case: str, url: str, tmp: Path) -> dict:
    peer = Path(PEER_PYTHON).parent / "vf-eval"
    env = {**os.environ, "PYTHONPATH": pythonpath(PEER_ENVS), "FAKE_KEY": "sk-test",
           "PATH": f"{peer.parent}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run([str(peer), CASES[case][0], *command(case, url, "subprocess")],
                          cwd=tmp, env=env, capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (traces,) = (tmp / "outputs").glob("*/traces.jsonl")
    return outcome(traces)


@pytest.fixture
def scripted(stub):
    """The stub's `script` model plays the case's script (restored after)."""
    def play(case: str):
        openai_stub.Handler.script = list(CASES[case][4] or [])
    yield play
    openai_stub.Handler.script = []


def recorded(case: str) -> dict:
    return json.loads(GOLDEN.read_text())[case]


def test_recorded_runs_are_the_peers_rewards():
    """The golden agrees with the constants and is not vacuous: every task ran to its end, and
    each case has a task its harness solves and one it does not."""
    for case, rewards in PEER_REWARDS.items():
        runs = recorded(case)
        assert {idx: total(task) for idx, task in runs.items()} == rewards
        assert all(task["ok"] and task["stop"] == "agent_completed" and not task["errors"] for task in runs.values())
    compact = recorded("compact")["2"]["nodes"]
    # the program's compaction: its last call dropped the text reply and asked again (a new branch)
    assert [n[:2] for n in compact] == [[None, "user"], [0, "assistant"], [1, "tool"], [2, "assistant"],
                                        [2, "user"], [4, "assistant"]]
    mini = recorded("mini_swe")
    assert [n[2] for n in mini["0"]["nodes"] if n[1] == "tool"] == [{"returncode": 0}] * 2
    assert [n[2] for n in mini["1"]["nodes"] if n[1] == "tool"] == [{"returncode": 0}, {"returncode": 1}]


@pytest.mark.parametrize("runtime", ["subprocess", pytest.param("sandbox", marks=needs_bwrap)])
def test_harness_package_runs_like_verifiers(runtime, stub, scripted, tmp_path):
    scripted("compact")
    assert run_ours("compact", stub.url, tmp_path, runtime) == recorded("compact")


@pytest.mark.parametrize("runtime, harness", [
    pytest.param("sandbox", "mini_swe_agent", marks=needs_bwrap),  # vf's own id, its default runtime
    pytest.param("subprocess", "mini_swe_local", marks=pytest.mark.agents),  # verifiers' exact command line
])
def test_mini_swe_agent_fixes_what_it_fixes_on_verifiers(runtime, harness, stub, scripted, tmp_path):
    installed_or_skip(MiniSweAgentHarness(MiniSweAgentConfig()))
    scripted("mini_swe")
    assert run_ours("mini_swe", stub.url, tmp_path, runtime, harness) == recorded("mini_swe")


@needs_peer
@pytest.mark.parametrize("case", sorted(CASES))
def test_peer_gives_the_recorded_runs(case, stub, scripted, tmp_path):
    scripted(case)
    assert run_peer(case, stub.url, tmp_path) == recorded(case)


def test_harness_ids_resolve_as_verifiers_resolves_them(monkeypatch, tmp_path):
    """A package on the path is named by its module (`compact`), its config class takes the seat's
    knobs; a module exporting a subclass of a built-in is one harness; two exports are refused."""
    monkeypatch.syspath_prepend(str(ENVS / "compact_harness"))
    monkeypatch.syspath_prepend(str(ENVS))
    compact = harness_class("compact")
    assert compact.__name__ == "CompactHarness" and not compact.NEEDS_CONTAINER
    built = build_program_harness(compact, compact.config_class()(id="compact", answer_file="final.txt"))
    assert (type(built.config).__name__, built.config.answer_file, built.config.max_turns) == (
        "CompactHarnessConfig", "final.txt", 4)
    local = harness_class("mini_swe_local")
    assert issubclass(local, MiniSweAgentHarness) and not local.NEEDS_CONTAINER
    assert local.config_class() is MiniSweAgentConfig
    (tmp_path / "two_harnesses.py").write_text(
        "from compact import CompactHarness\nclass Other(CompactHarness):\n    pass\n"
        "__all__ = ['CompactHarness', 'Other']\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(UsageError, match="exports 2 Harness subclasses"):
        harness_class("two_harnesses")


@pytest.mark.parametrize("flags, says", [
    (["--env.agent.harness.id", "compact", "--env.agent.harness.max_turns", "0"], "max_turns"),
    (["--env.agent.harness.id", "no_such_harness"], "no_such_harness"),
])
def test_a_harness_that_cannot_run_is_refused_before_the_run(flags, says, stub, tmp_path):
    """As verifiers refuses it when it validates the config: exit 2, no run dir, no model call."""
    before = len(stub.requests)
    env = {**os.environ, "PYTHONPATH": pythonpath(ENVS), "FAKE_KEY": "sk-test", "NO_COLOR": "1"}
    proc = subprocess.run([str(Path(sys.executable).parent / "vf-eval"), str(ENVS / "compact_v1.py"),
                           "-m", "bash:cat note.txt", "--base-url", stub.url, "--api-key-var", "FAKE_KEY",
                           "--env.agent.runtime.type", "subprocess", *flags, "-o", str(tmp_path / "run")],
                          env=env, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2 and says in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "run").exists() and len(stub.requests) == before


def test_run_program_has_no_per_command_time_limit():
    """verifiers' `runtime.run_program(argv, env)`, which a harness package's `launch` calls: the
    program outlives the runtime's per-command limit that a plain `run` is held to."""
    import asyncio

    async def go():
        async with make_runtime(RuntimeConfig(type="subprocess", timeout=0.5)) as rt:
            argv = ["sh", "-c", 'sleep 1; echo "$WHO"']
            return await rt.run(argv, {"WHO": "run"}), await rt.run_program(argv, {"WHO": "program"})

    plain, program = asyncio.run(go())
    assert plain.timed_out and not plain.ok
    assert program.ok and program.stdout == "program\n"


def record() -> None:
    """Re-record the golden from verifiers (needs VF_VERIFIERS_PYTHON)."""
    import tempfile

    from openai_stub import StubServer

    runs = {}
    with StubServer() as stub:
        for case in sorted(CASES):
            openai_stub.Handler.script = list(CASES[case][4] or [])
            with tempfile.TemporaryDirectory() as tmp:
                runs[case] = run_peer(case, stub.url, Path(tmp))
    GOLDEN.write_text(json.dumps(runs, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    assert PEER_PYTHON, "set VF_VERIFIERS_PYTHON"
    record()
