"""verifiers v1 environments run on vf with only their import changed.

tests/v1_envs/verifiers/ holds environments written for verifiers 0.4.0 (`import verifiers.v1 as
vf`); tests/v1_envs/vf/ is the same code with the import changed (tests/v1_envs/sync.py). Each
test runs OUR vf-eval path on one of them against the scripted OpenAI-compatible stub and asserts
the mean reward verifiers 0.4.0's own `vf-eval` produced on the same stub:

    vf-eval ENV -n N -m MODEL --client.base-url http://127.0.0.1:PORT/v1 --client.api-key-var KEY
            --no-push --no-rich --env.agent.runtime.type subprocess --env.agent.harness.id null

(run with PYTHONPATH=tests/v1_envs/verifiers[:.../duel_v1]; the multi-seat env takes
`--env.player.*`/`--env.critic.*` instead of `--env.agent.*`). Set VF_VERIFIERS_PYTHON to a python
with verifiers==0.4.0 to re-run the peer side too (`test_peer_agrees`).

What verifiers 0.4.0 itself demands of a portable environment (found running it; vf accepts
these and the looser forms): rewards, metrics, stops and config-plugged functions are `async def`;
a stop names its trace with the annotation `trace: vf.Trace`; `load()` yields Task objects (a task
keeps the config it was built with, so pass `self.config.task` for `--env.taskset.task.*` to
reach it); the module lists its Taskset (and Env) in `__all__`. Metrics run before rewards, and
`trace.has_error` is true while a trace is being scored there (vf: false).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
PEER_ENVS = HERE / "v1_envs" / "verifiers"
ENVS = HERE / "v1_envs" / "vf"

# Mean rewards (and error counts) from verifiers 0.4.0's vf-eval on these envs, same stub.
PEER = {
    "echo": {"mean": 1.25, "errors": 0},
    "counter": {"mean": 1.25, "errors": 0},
    "duel": {"mean": 7 / 6, "errors": 0},
    "vision": {"mean": 1.5, "errors": 0},
    "flaky": {"mean": 0.5, "errors": 1},
    "tools": {"mean": 11 / 12, "errors": 0},
    "tools_offset": {"mean": 1 / 3, "errors": 0},
    "shell": {"mean": 1.0, "errors": 0},
    "echo_select": {"mean": 1.25, "errors": 0},  # rows 0 (2.0) and 1 (0.5)
    "slow": {"mean": 1 / 3, "errors": 0},
    "tools_capped": {"mean": 0.0, "errors": 0},
    "retry": {"mean": 1.0, "errors": 1},  # row 1 recovers on its 2nd attempt, row 2 fails 3 times
    "best_of_n": {"mean": 1.25, "errors": 0},
    "user_sim": {"mean": 0.5, "errors": 0},  # the assistant echoes the user's "yes" three times
}
# verifiers' own task hashes for flaky_v1's three rows (idx 0, 1, 2): rows hash alike in both.
PEER_HASHES = ["9310573f1c65c416", "4a1515fba23fdb2d", "a06af86bd1cbddaa"]

COUNTER_FLAGS = {"rewards": {"bonus": {"fn": f"{ENVS}/bonus.py:bonus", "weight": 0.25},
                             "formatted": {"weight": 0.5}}}
CASES = {
    "echo": ("echo_v1.py", "echo", 4, {}),
    "counter": ("counter_v1.py", "boxed", 6, {"env": {"taskset": {"task": COUNTER_FLAGS}}}),
    "duel": ("duel_v1", "echo", None, {}),
    "vision": ("vision_v1.py", "vision", None, {}),
    "flaky": ("flaky_v1.py", "echo", None, {}),
    "tools": ("tools_v1.py", "calc", None, {}),
    # the task config reaches the per-rollout toolset: add() answers 6, only the third row is right
    "tools_offset": ("tools_v1.py", "calc", None, {"env": {"taskset": {"task": {"offset": 1}}}}),
    # the bash harness: setup writes a file into the rollout's runtime, the model cats it
    "shell": ("shell_v1.py", "bash:cat secret.txt", None, {"env": {"agent": {"harness": {"id": "bash"}}}}),
    # --select views: include by name or idx range, exclude by id
    "echo_select": ("echo_v1.py", "echo", None, {"select": {"include": {"names": ["greeting"], "idx": "1:3"},
                                                            "exclude": {"ids": ["t2"]}}}),
    # stage deadlines: setup (the seat's), agent (the task's own), none
    "slow": ("slow_v1.py", "slow-1", None, {"env": {"agent": {"timeout": {"setup": 4}}}}),
    # a token cap reached by the first reply leaves its tool call unexecuted
    "tools_capped": ("tools_v1.py", "calc", None, {"env": {"agent": {"max_input_tokens": 1}}}),
    "retry": ("retry_v1.py", "echo", None, {"env": {"agent": {"retries": {"max_retries": 2}}}}),
    # built-in envs over any taskset (`--env.id`)
    "best_of_n": ("echo_v1.py", "echo", None, {"env": {"id": "best-of-n", "n": 2}}),
    "user_sim": ("echo_v1.py", "echo", None, {"env": {"id": "user-sim", "user": {"model": "yes", "max_turns": 3}}}),
}


def evaluate(env: str, model: str, url: str, tmp_path: Path, n: int | None = None, extra: dict | None = None,
             resume: bool = False):
    from vf.config import deep_merge
    from vf.evaluate import execute, open_run, resolve_config

    sys.modules.pop(Path(env).stem, None)  # a fresh import: module-level state (retry_v1's counter)
    over = deep_merge({"taskset": {"id": str(ENVS / env)}, "model": model,
                       "engine": {"base_url": url, "api_key_var": "FAKE_KEY"}, "select": {"limit": n}},
                      extra or {})
    out = tmp_path / f"run-{Path(env).stem}"
    if resume:
        config, run, kept, _ = open_run(None, {}, None, str(out))
    else:
        config, run, kept, _ = open_run(resolve_config({"command": "eval"}, over), over, str(out), None)
    return execute(config, run, kept), out


@pytest.fixture(autouse=True)
def keys(stub, monkeypatch):
    monkeypatch.setenv("FAKE_KEY", "sk-test")
    monkeypatch.setenv("JUDGE_KEY", "sk-test")
    monkeypatch.setenv("JUDGE_BASE_URL", stub.url)  # vision_v1's judge reads it


def test_vf_copies_differ_only_in_the_import():
    sys.path.insert(0, str(HERE / "v1_envs"))
    try:
        from sync import port
    finally:
        sys.path.pop(0)
    peer_files = sorted(p.relative_to(PEER_ENVS) for p in PEER_ENVS.rglob("*.py"))
    assert peer_files and peer_files == sorted(p.relative_to(ENVS) for p in ENVS.rglob("*.py"))
    for rel in peer_files:
        assert (ENVS / rel).read_text() == port((PEER_ENVS / rel).read_text()), rel
        assert "verifiers" not in (ENVS / rel).read_text().replace("verifiers 0.4", "")


@pytest.mark.parametrize("case", sorted(CASES))
def test_same_mean_reward_as_verifiers(case, stub, tmp_path):
    env, model, n, extra = CASES[case]
    summary, _ = evaluate(env, model, stub.url, tmp_path, n, extra)
    assert summary["mean_reward"] == pytest.approx(PEER[case]["mean"])
    assert summary["num_errors"] == PEER[case]["errors"]


def test_select_views_pick_the_rows_verifiers_picks(stub, tmp_path):
    from vf.trace import read_episodes

    _, out = evaluate(*CASES["echo_select"][:1], "echo", stub.url, tmp_path, extra=CASES["echo_select"][3])
    assert sorted(e.task.data["idx"] for e in read_episodes(out / "traces.jsonl")) == [0, 1]


@pytest.mark.slow
def test_stage_deadlines_stop_like_verifiers(stub, tmp_path):
    from vf.trace import read_episodes

    env_file, model, _, extra = CASES["slow"]
    _, out = evaluate(env_file, model, stub.url, tmp_path, extra=extra)
    stops = {e.task.data["idx"]: (e.ok, e.traces[0].stop_condition, e.traces[0].is_timeout, e.traces[0].metrics)
             for e in read_episodes(out / "traces.jsonl")}
    assert stops == {0: (True, "setup_timeout", True, {"finalized": 1.0}),
                     1: (True, "agent_timeout", True, {"finalized": 1.0}),
                     2: (True, "agent_completed", False, {"finalized": 1.0})}


def test_retried_rollout_keeps_the_failed_attempts_errors(stub, tmp_path):
    from vf.trace import read_episodes

    env_file, model, _, extra = CASES["retry"]
    _, out = evaluate(env_file, model, stub.url, tmp_path, extra=extra)
    got = {e.task.data["idx"]: (e.ok, [x.message for x in e.traces[0].errors], e.traces[0].metrics.get("attempts"))
           for e in read_episodes(out / "traces.jsonl")}
    assert got == {0: (True, [], 1.0), 1: (True, ["setup failed on attempt 1"], 2.0),
                   2: (False, [f"setup failed on attempt {i}" for i in (1, 2, 3)], None)}


def test_retry_rules_first_match_decides():
    from vf.retries import RetryBudget, RetryConfig
    from vf.trace import ErrorInfo

    config = RetryConfig(max_retries=1, rules=[{"type": "EngineError", "status_code": ["5xx"], "max_retries": 2},
                                               {"type": "EngineError", "max_retries": 0},
                                               {"message": "flaky", "max_retries": 1}])
    budget = RetryBudget(config)
    e503, e400 = ErrorInfo(type="EngineError", status_code=503), ErrorInfo(type="EngineError", status_code=400)
    assert [budget.take([e503]) for _ in range(3)] == [True, True, False]  # its rule's budget is 2
    assert not budget.take([e400])  # the zero rule matches first: never retried
    assert budget.take([ErrorInfo(type="X", message="a flaky disk")]) and not budget.take([ErrorInfo(type="X", message="flaky")])
    assert budget.take([ErrorInfo(type="Other")]) and not budget.take([ErrorInfo(type="Other")])  # the default 1
    assert budget.total == 4


def test_builtin_envs_over_any_taskset(stub, tmp_path):
    from vf.trace import read_episodes

    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    _, out = evaluate(*CASES["best_of_n"][:2], stub.url, tmp_path / "a", extra=CASES["best_of_n"][3])
    for ep in read_episodes(out / "traces.jsonl"):
        assert len(ep.traces) == 2 and all(t.metrics["best"] == 1.0 for t in ep.traces)
        assert {t.metrics["pass_at_n"] for t in ep.traces} == {float(ep.traces[0].reward >= 1.0)}
    _, out = evaluate(*CASES["user_sim"][:2], stub.url, tmp_path / "b", extra=CASES["user_sim"][3])
    for ep in read_episodes(out / "traces.jsonl"):
        assistant, user = ep.traces
        assert (assistant.agent.name, assistant.trainable, user.agent.name, user.trainable) == (
            "assistant", True, "user", False)
        assert user.messages[0].content.startswith("You are role-playing a USER")
        prompt = ep.task.data["prompt"]
        assert not isinstance(prompt, str) or prompt in user.messages[0].content  # the scenario
        assert user.stop_condition == "max_turns" and assistant.metrics["user_turns"] == 3.0


def test_taskset_views_compose_lazily():
    import vf
    from vf.errors import UsageError

    loaded_calls = []

    class Endless(vf.Taskset):
        INFINITE = True

        def load(self):
            i = 0
            while True:
                loaded_calls.append(i)
                yield vf.TaskData(prompt=str(i), id=f"t{i}", name="even" if i % 2 == 0 else None)
                i += 1

    ts = Endless()
    assert not ts.bounded and ts.take(5).bounded
    assert [t.data.idx for t in ts.include(idx="5:8,20").exclude(idx=[6])] == [5, 7, 20]
    assert len(loaded_calls) == 21  # reading stopped past the last closed range
    assert [t.data.id for t in ts.take(10).include(names=["even"]).skip(1).take(2)] == ["t2", "t4"]
    shuffled = [t.data.idx for t in ts.take(10).shuffle(seed=3)]
    assert sorted(shuffled) == list(range(10)) and shuffled != list(range(10))
    assert shuffled == [t.data.idx for t in ts.take(10).shuffle(seed=3)]
    for bad in (lambda: ts.shuffle(), lambda: ts.include(ids=["t1"]), lambda: ts.exclude(idx="3:")):
        with pytest.raises(UsageError):
            bad()


def test_rows_hash_like_verifiers(stub, tmp_path):
    _, out = evaluate("flaky_v1.py", "echo", stub.url, tmp_path)
    from vf.trace import read_episodes

    hashes = {e.task.data["idx"]: e.task.hash[:16] for e in read_episodes(out / "traces.jsonl")}
    assert [hashes[i] for i in range(3)] == PEER_HASHES


def test_failed_env_run_is_recorded_and_resume_redoes_exactly_it(stub, tmp_path):
    from vf.trace import read_episodes

    summary, out = evaluate("flaky_v1.py", "echo", stub.url, tmp_path)
    failed = [e for e in read_episodes(out / "traces.jsonl") if not e.ok]
    assert [(e.task.data["id"], e.errors[0].type, e.errors[0].message) for e in failed] == [
        ("boom", "RuntimeError", "the env broke on purpose")]
    before = len(stub.requests)
    summary, _ = evaluate("flaky_v1.py", "echo", stub.url, tmp_path, resume=True)
    assert summary["num_owed"] == 1 and summary["num_resumed"] == 2
    assert len(stub.requests) == before  # the env raises again before any model call
    assert summary["num_errors"] == 1 and summary["mean_reward"] == pytest.approx(0.5)


def test_multi_seat_episode_line(stub, tmp_path, monkeypatch):
    from vf.trace import read_episodes

    _, out = evaluate("duel_v1", "echo", stub.url, tmp_path)
    episodes = read_episodes(out / "traces.jsonl")
    assert len(episodes) == 3
    for ep in episodes:
        assert [(t.agent.name, t.agent.trainable) for t in ep.traces] == [("player", True), ("critic", False)]
        critic = ep.traces[1]
        # two answered turns, the third hit max_turns=2 and was left unconsumed (as in verifiers)
        assert [n.message["content"] for n in critic.nodes][1:] == [critic.nodes[0].message["content"],
                                                                    "again", "again"]
        assert critic.stop_condition == "max_turns" and critic.info["segments"][2] is True
        assert ep.reward == ep.traces[0].reward  # the critic's zero never dilutes the mean
    # vf-train's batches take samples from trainable seats only
    import vf.trainer.orchestrator as orch

    seen = []
    monkeypatch.setattr(orch, "trace_samples", lambda trace, adv, info: seen.append(trace.agent.name) or [])
    orch.build_batch(0, [episodes], std_norm=False, max_off_policy_steps=8)
    assert seen == ["player"] * 3


def test_judge_calls_recorded_with_usage(stub, tmp_path):
    from vf.trace import read_episodes

    before = len(stub.requests)
    _, out = evaluate("vision_v1.py", "vision", stub.url, tmp_path)
    for ep in read_episodes(out / "traces.jsonl"):
        trace = ep.traces[0]
        (call,) = trace.info["judge_calls"]
        assert call["name"] == "yes" and call["request"]["model"] == "yes"
        assert call["response"]["message"]["content"] == "yes"
        usage = call["response"]["usage"]  # verifiers' Usage: unknown counts are None there, left out of extra_usage
        assert trace.extra_usage == [{k: v for k, v in usage.items() if v is not None}] and usage["completion_tokens"] == 3
    # the image parts reached the provider as given (data URLs), and stay inline in the trace
    sent = [r for r in stub.requests[before:] if r.get("model") == "vision"]
    parts = [p for r in sent for m in r["messages"] if isinstance(m["content"], list) for p in m["content"]]
    assert sum(p["type"] == "image_url" for p in parts) == 3
    assert all(p["image_url"]["url"].startswith("data:image/png;base64,") for p in parts if p["type"] == "image_url")


def test_load_by_path_project_and_id(tmp_path, monkeypatch):
    import vf
    from vf.loading import load_taskset, normalize_id

    assert normalize_id("someone/Echo-V1@0.2.0") == "echo_v1"
    echo = load_taskset(str(ENVS / "echo_v1.py"))  # its sibling `echo_helpers` imports
    assert type(echo.taskset).__name__ == "EchoTaskset" and isinstance(echo.env, vf.SingleAgentEnv)
    duel = load_taskset(str(ENVS / "duel_v1"))  # a project folder: pyproject.toml + package
    assert type(duel.env).__name__ == "DuelEnv" and sorted(duel.env.seats()) == ["critic", "player"]
    monkeypatch.syspath_prepend(str(ENVS))
    by_id = load_taskset("someone/Counter-V1@1.0", {"seed": 3})
    assert type(by_id.taskset).__name__ == "CountTaskset" and by_id.taskset.config.seed == 3


def test_infinite_taskset_needs_n(stub, tmp_path):
    from vf.errors import UsageError

    with pytest.raises(UsageError, match="endless"):
        evaluate("counter_v1.py", "boxed", stub.url, tmp_path)


def test_generics_default_like_verifiers():
    import vf

    class Data(vf.TaskData):
        answer: str = ""

    class MyState(vf.State):
        n: int = 0

    class One(vf.Task[Data]):
        pass

    class Two(vf.Task[Data, MyState]):
        pass

    class Set(vf.Taskset[One]):
        def load(self):
            yield One(Data(prompt="x"))

    assert (One.data_class(), One.state_class(), One.config_class()) == (Data, vf.State, vf.TaskConfig)
    assert Two.state_class() is MyState and Set.config_class() is vf.TasksetConfig and Set.task_class() is One
    row = Data(prompt=[vf.UserMessage(content=[vf.TextContentPart(text="hi"),
                                               vf.ImageUrlContentPart(image_url=vf.ImageUrlSource(url="data:x"))])],
               timeout=vf.TaskTimeout(agent=5), resources=vf.TaskResources(gpu="A100:2"), workdir="/w", image="img")
    assert One(row).messages() == [{"role": "user", "content": [
        {"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": "data:x"}}]}]
    assert vf.types.content_text(row.prompt[0].content) == "hi"


@pytest.mark.slow
def _flags(tree: dict, prefix: str = "") -> list[str]:
    """{"env": {"taskset": {"seed": 1}}} -> ["--env.taskset.seed", "1"] (verifiers' dotted flags)."""
    out: list[str] = []
    for key, value in tree.items():
        if isinstance(value, dict):
            out += _flags(value, f"{prefix}{key}.")
        else:
            value = value[0] if isinstance(value, list) and len(value) == 1 else value
            out += [f"--{prefix}{key}", str(value).replace(str(ENVS), str(PEER_ENVS))]
    return out


def peer_seats(extra: dict) -> dict:
    """The peer's per-seat flags for our defaults: host subprocess runtime, the null harness."""
    user_sim = extra.get("env", {}).get("id") == "user-sim"
    seats = {"assistant": {"harness": {"id": "null"}}, "user": {}} if user_sim else {"agent": {"harness": {"id": "null"}}}
    return {"env": {name: {"runtime": {"type": "subprocess"}, **seat} for name, seat in seats.items()}}


@pytest.mark.skipif(not os.environ.get("VF_VERIFIERS_PYTHON"),
                    reason="set VF_VERIFIERS_PYTHON to a python with verifiers==0.4.0")
@pytest.mark.parametrize("case", ["echo", "counter", "tools", "tools_offset", "flaky", "shell", "echo_select",
                                  "slow", "tools_capped", "retry", "best_of_n", "user_sim"])
def test_peer_agrees(case, stub, tmp_path):
    """verifiers 0.4.0's vf-eval on the original environment gives the mean reward hard-coded above."""
    from vf.config import deep_merge

    env_file, model, n, extra = CASES[case]
    peer = Path(os.environ["VF_VERIFIERS_PYTHON"]).parent / "vf-eval"
    env = {**os.environ, "PYTHONPATH": str(PEER_ENVS), "FAKE_KEY": "sk-test",
           "PATH": f"{peer.parent}:{os.environ['PATH']}"}
    subprocess.run([str(peer), Path(env_file).stem, *(["-n", str(n)] if n else []), "-m", model,
                    "--client.base-url", stub.url, "--client.api-key-var", "FAKE_KEY", "--no-push", "--no-rich",
                    *_flags(deep_merge(peer_seats(extra), extra))],
                   cwd=tmp_path, env=env, check=True, capture_output=True, timeout=600)
    (traces,) = list((tmp_path / "outputs").glob("*/traces.jsonl"))
    episodes = [json.loads(line) for line in traces.read_text().splitlines()]
    rewards = [sum(r["score"] * r["weight"] for r in t["rewards"].values() if r)
               for e in episodes if e["ok"] for t in e["traces"] if t["agent"].get("trainable", True)]
    assert sum(rewards) / len(rewards) == pytest.approx(PEER[case]["mean"])
    assert sum(not e["ok"] for e in episodes) == PEER[case]["errors"]


@pytest.mark.slow
def test_text_only_local_engine_refuses_images(tmp_path):
    """The embedded engine's model reads text only: an image prompt stops vf-eval with exit 2 and
    a message that says why, instead of the image being dropped."""
    from conftest import run_cli

    r = run_cli("vf-eval", str(ENVS / "vision_v1.py"), "-n", "2", "-o", str(tmp_path / "run"), timeout=240)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "reads text only" in r.stderr and "image_url" in r.stderr


def test_image_parts_reach_the_chat_template_never(tmp_path):
    from vf.engines.chat import normalize_messages
    from vf.errors import EngineError

    assert normalize_messages([{"role": "user", "content": [{"type": "text", "text": "a"}]}])[0]["content"] == "a"
    with pytest.raises(EngineError, match="image_url"):
        normalize_messages([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:x"}}]}])


BASH_ENV = '''
import vf


class ShellTask(vf.Task[vf.TaskData]):
    async def setup(self, runtime):
        await runtime.write("seed.txt", "41")

    @vf.reward
    async def wrote(self, trace, runtime) -> float:
        trace.info["workdir"] = str(runtime.workdir)
        result = await runtime.run("cat out.txt")
        return float(result.stdout.strip() == "42")


class ShellTaskset(vf.Taskset[ShellTask]):
    def load(self):
        yield ShellTask(vf.TaskData(prompt="add one to seed.txt into out.txt"))
'''


@pytest.mark.parametrize("command,reward,timed_out", [
    ("echo $(( $(cat seed.txt) + 1 )) > out.txt; cat out.txt", 1.0, False),
    ("sleep 5; echo 42 > out.txt", 0.0, True),
])
def test_bash_harness_runs_in_the_rollout_runtime(stub, tmp_path, command, reward, timed_out):
    from vf.trace import read_episodes

    env = tmp_path / "shell_env.py"
    env.write_text(BASH_ENV)
    summary, out = evaluate(str(env), f"bash:{command}", stub.url, tmp_path, extra={"env": {"agent": {
        "harness": {"id": "bash", "tool_timeout": 1.0}, "runtime": {"type": "subprocess"}}}})
    (ep,) = read_episodes(out / "traces.jsonl")
    trace = ep.traces[0]
    assert ep.ok and trace.reward == reward
    assert [t["function"]["name"] for t in trace.tools] == ["bash", "edit"]
    assert trace.messages[0].content.startswith("You are a coding agent.")  # verifiers' bash harness prompt
    tool = trace.tool_messages[0]
    assert ("timed out" in tool.content) == timed_out and (tool.content == "42\n") != timed_out
    assert (trace.info.get("tool_errors") == [{"tool": "bash", "type": "Timeout"}]) == timed_out
    assert trace.agent.runtime["type"] == "subprocess"
    assert not Path(trace.info["workdir"]).exists()  # the rollout's runtime was closed


JUDGED_ENV = '''
import vf


class QA(vf.TaskData):
    answer: str


class QATask(vf.Task[QA]):
    @vf.reward
    async def exact(self, task, trace) -> float:
        return float(trace.last_reply == task.answer)


class QATaskset(vf.Taskset[QATask]):
    def load(self):
        yield QATask(QA(prompt="hi", answer="hi"), self.config.task)
        yield QATask(QA(prompt="yo", answer="no"), self.config.task)
'''


@pytest.mark.parametrize("judge_model,mean,errors", [("yes", 1.0, 0), ("fail500", None, 2)])
def test_plugged_judge_and_a_judge_that_errors(stub, tmp_path, judge_model, mean, errors):
    """`--env.taskset.task.judges` adds the judge's weighted reward to every task; a judge whose
    endpoint fails is an error on the trace (the run goes on; --resume redoes those episodes)."""
    from vf.trace import read_episodes

    env = tmp_path / "judged_env.py"
    env.write_text(JUDGED_ENV)
    judges = [{"id": "reference", "weight": 0.5, "model": judge_model, "base_url": stub.url,
               "api_key_var": "FAKE_KEY"}]
    summary, out = evaluate(str(env), "echo", stub.url, tmp_path,
                            extra={"env": {"taskset": {"task": {"judges": judges}}}})
    assert summary["num_errors"] == errors
    episodes = read_episodes(out / "traces.jsonl")
    if mean is None:
        assert all(e.traces[0].errors[0].message.startswith("judge 'reference'") for e in episodes)
        assert all(e.traces[0].errors[0].status_code == 500 for e in episodes)
    else:  # exact 1 + 0.5 judge on "hi"; exact 0 + 0.5 judge on "yo"
        assert summary["mean_reward"] == pytest.approx(mean) and summary["rewards"]["reference"] == 1.0
        assert all(len(e.traces[0].info["judge_calls"]) == 1 for e in episodes)


def test_validate_hook_gets_a_runtime_when_it_names_one():
    import asyncio

    import vf
    from vf.validate import validate_task

    class Gold(vf.TaskData):
        answer: str

    class RuntimeCheck(vf.Task[Gold]):
        async def validate(self, runtime) -> bool:
            result = await runtime.run("echo $((40 + 2))")
            return result.stdout.strip() == self.data.answer

    class Plain(vf.Task[Gold]):
        @vf.reward
        async def exact(self, task, trace) -> float:
            return float(trace.last_reply == task.answer)

        def validate(self):
            return self.data.answer

    assert asyncio.run(validate_task(RuntimeCheck(Gold(prompt="p", answer="42"))))[0] is True
    assert asyncio.run(validate_task(RuntimeCheck(Gold(prompt="p", answer="41"))))[0] is False
    assert asyncio.run(validate_task(Plain(Gold(prompt="p", answer="42"))))[:2] == (True, 1.0)


@pytest.mark.parametrize("limit,expected", [(1, 1), (2, 2)])
def test_max_concurrent_agents_bounds_gathered_seats(limit, expected):
    """Seats an env runs with asyncio.gather take turns unless --env.max-concurrent-agents allows
    more; each seat's own model and sampling override the run's."""
    import asyncio

    import vf
    from vf.engines.base import GenerateResult, Sampling
    from vf.runner import EpisodeSpec, run_episode

    class Engine:
        name, supports_tokens = "counting", False

        def __init__(self):
            self.active = self.peak = 0
            self.seen = []

        async def generate(self, request):
            self.active += 1
            self.peak = max(self.peak, self.active)
            self.seen.append((request.model, request.sampling.temperature))
            await asyncio.sleep(0.05)
            self.active -= 1
            return GenerateResult(message={"role": "assistant", "content": "ok"})

    class PairConfig(vf.EnvConfig):
        a: vf.AgentConfig = vf.AgentConfig()
        b: vf.AgentConfig = vf.AgentConfig(model="other", sampling={"temperature": 0.25})

    class PairEnv(vf.Env[PairConfig]):
        async def run(self, task, agents):
            await asyncio.gather(agents.a.run(task), agents.b.run(task))

    engine = Engine()
    env = PairEnv(PairConfig(max_concurrent_agents=limit))
    spec = EpisodeSpec(engine=engine, model="run-model", sampling=Sampling(temperature=1.0), env=env)
    episode = asyncio.run(run_episode(vf.Task(vf.TaskData(prompt="hi", idx=0)), spec))
    assert episode.ok and sorted(t.agent.name for t in episode.traces) == ["a", "b"]
    assert engine.peak == expected
    assert sorted(engine.seen) == [("other", 0.25), ("run-model", 1.0)]


def test_trace_api_views():
    import vf
    from vf.trace import MessageNode

    call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{\"a\": 1}"}}
    msgs = [({"role": "user", "content": "q"}, False), ({"role": "assistant", "content": None, "tool_calls": [call]}, True),
            ({"role": "tool", "tool_call_id": "c1", "content": "2"}, False), ({"role": "assistant", "content": " 2 "}, True)]
    t = vf.Trace(nodes=[MessageNode(parent=i - 1 if i else None, message=m, sampled=s) for i, (m, s) in enumerate(msgs)])
    assert t.num_turns == 2 and t.last_reply == "2" and not t.has_error
    first_call = t.assistant_messages[0].tool_calls[0]
    assert isinstance(first_call, vf.ToolCall) and (first_call.name, first_call.arguments) == ("add", "{\"a\": 1}")
    assert t.assistant_messages[0].wire()["tool_calls"] == [call]  # the wire form round-trips
    assert [type(m).__name__ for m in t.messages] == ["UserMessage", "AssistantMessage", "ToolMessage",
                                                     "AssistantMessage"]
    assert t.tool_messages[0].content == "2" and t.tool_messages[0]["tool_call_id"] == "c1"
    assert isinstance(t.last_message, vf.AssistantMessage)
    t.record_reward("r", 0.5, weight=2.0)
    t.record_metrics({"m1": 1, "m2": 2.5})
    t.state = vf.State()
    dumped = t.model_dump()
    assert t.reward == 1.0 and dumped["metrics"] == {"m1": 1.0, "m2": 2.5} and "state" not in dumped


def test_bash_harness_edit_tool_replies_like_verifiers(tmp_path):
    import asyncio
    from types import SimpleNamespace

    from vf.episode.harnesses import make_harness
    from vf.harness import HarnessConfig
    from vf.runtime import RuntimeConfig, make_runtime

    async def go():
        async with make_runtime(RuntimeConfig(type="subprocess")) as rt:
            await rt.write("a.py", "x = 1\ny = 1\n")
            rollout = SimpleNamespace(runtime=rt, task=None, trace=None)
            edit = make_harness(HarnessConfig(id="bash")).extra_tools(rollout)["edit"][1]
            replies = [await edit({"path": "a.py", "old_str": "x = 1", "new_str": "x = 2"}),
                       await edit({"path": "a.py", "old_str": "= 1", "new_str": "= 3"}),  # occurs once now
                       await edit({"path": "a.py", "old_str": "z", "new_str": "w"}),
                       await edit({"path": "missing.py", "old_str": "a", "new_str": "b"}),
                       await edit({"path": "a.py", "old_str": "", "new_str": "b"})]
            return replies, (await rt.read("a.py")).decode()

    replies, text = asyncio.run(go())
    assert replies == ["Edited a.py", "Edited a.py", "error: old_str must appear exactly once in a.py (found 0)",
                       "error: missing.py not found", "error: 'old_str' must be a non-empty string"]
    assert text == "x = 2\ny = 3\n"
    assert "edit" not in make_harness(HarnessConfig(id="bash", edit=False)).extra_tools(None)
