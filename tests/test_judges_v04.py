"""Built-in judges (`reference`, `rubric`, `decision`) plugged by config, side by side with verifiers 0.4.0.

tests/v1_envs/verifiers/judged_v1.py is a taskset with one reward of its own; each case below
plugs judges into it the way verifiers users write them (an `@ eval.toml` with
`[[env.taskset.task.judges]]` tables, or a JSON list on `--env.taskset.task.judges`) and runs
the SAME command line through vf's `vf-eval` and verifiers 0.4.0's, against the scripted
policy + judge server (tests/openai_stub.py: the policy `echo`s, the judge model `grader`
grades, a body with `questions` is a decision-API call). Per row, both must record the same
rewards (names, order, scores, weights), metrics, judge calls (the exact request the judge
model got, its reply, parsed verdict and usage), extra usage and error count.

verifiers' results are recorded in tests/golden/judges_v04_runs.json (runs) and
tests/golden/judges_v04_cases.json (judge prompts on edge inputs and `parse_judge_choice` on
messy replies, from tests/judge_parity_cases.py), so CI without verifiers still checks vf
against them. With VF_VERIFIERS_PYTHON set to a python with verifiers==0.4.0, the peer half
re-runs verifiers and checks it still gives the recorded values. Re-record (only when the peer
changes): `VF_VERIFIERS_PYTHON=/work/venvs/v04/bin/python python tests/test_judges_v04.py`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

HERE = Path(__file__).parent
PEER_ENVS = HERE / "v1_envs" / "verifiers"
ENVS = HERE / "v1_envs" / "vf"
RUNS_GOLDEN = HERE / "golden" / "judges_v04_runs.json"
CASES_GOLDEN = HERE / "golden" / "judges_v04_cases.json"
PEER_PYTHON = os.environ.get("VF_VERIFIERS_PYTHON")
needs_peer = pytest.mark.skipif(not PEER_PYTHON, reason="set VF_VERIFIERS_PYTHON to a python with verifiers==0.4.0")

CUSTOM_RUBRIC_PROMPT = ("Grade the reply {response_missing} against each criterion.\nTask: {question}\n{reference}\n"
                        "Response:\n````\n{response}\n````\n\nCriteria:\n{criteria}\n")


def judge_entries(case: str, url: str, envs: Path, tmp: Path) -> list[dict]:
    """The judges a case plugs (the endpoint is the stub; paths point into `envs`)."""
    client = {"base_url": url, "api_key_var": "FAKE_KEY"}
    if case == "toml":
        return [{"id": "reference", "model": "grader", **client},
                {"id": "rubric", "model": "grader", "path": str(envs / "judged_rubric.toml"), **client},
                {"id": "decision", **client, "base_url": f"{url}/evaluations", "answer_field": "answer",
                 "levels": ["bad", "ok", "good"], "weight": 0.25}]
    if case == "cli":
        (tmp / "custom_rubric.txt").write_text(CUSTOM_RUBRIC_PROMPT)
        return [{"id": "reference", "name": "ref_ab", "choices": ["A", "B"], "question_field": "question",
                 "view": "full_trace", "weight": 2, "model": "grader", **client},
                {"id": "rubric", "name": "rubric1", "path": str(envs / "judged_rubric.toml"), "answer_field": "answer",
                 "max_criteria": 1, "weights": {"counts": 3}, "prompt": str(tmp / "custom_rubric.txt"),
                 "model": "grader", "sampling": {"temperature": 0, "max_completion_tokens": 300}, **client}]
    if case == "error":  # the judge's endpoint fails: recorded on the trace, the run goes on
        return [{"id": "reference", "model": "fail500", **client}]
    if case == "tools":  # full-trace judges read a transcript with tool calls and tool results
        return [{"id": "rubric", "model": "grader", "path": str(envs / "judged_rubric.toml"), **client},
                {"id": "reference", "model": "grader", "view": "full_trace", **client}]
    raise KeyError(case)


# case → (env, policy model, rows); the env is tests/v1_envs/{verifiers,vf}/ENV.py
RUNS = {"toml": ("judged_v1", "echo", None), "cli": ("judged_v1", "echo", None),
        "error": ("judged_v1", "echo", 2), "tools": ("tools_v1", "calc", None)}


def toml_file(entries: list[dict], path: Path) -> Path:
    """verifiers' eval.toml spelling: one `[[env.taskset.task.judges]]` table per judge."""
    def value(v):
        if isinstance(v, dict):
            return "{ " + ", ".join(f"{k} = {value(x)}" for k, x in v.items()) + " }"
        return json.dumps(v)

    path.write_text("".join("[[env.taskset.task.judges]]\n" + "".join(f"{k} = {value(v)}\n" for k, v in e.items()) + "\n"
                            for e in entries))
    return path


def command(case: str, url: str, envs: Path, tmp: Path) -> list[str]:
    """The arguments after the env id, identical for both CLIs."""
    entries = judge_entries(case, url, envs, tmp)
    judges = (["@", str(toml_file(entries, tmp / "judges.toml"))] if case == "toml"
              else ["--env.taskset.task.judges", json.dumps(entries)])
    _, model, rows = RUNS[case]
    return [*judges, *(["-n", str(rows)] if rows else []), "-m", model, "--client.base-url", url,
            "--client.api-key-var", "FAKE_KEY", "--no-push", "--no-rich",
            "--env.agent.runtime.type", "subprocess", "--env.agent.harness.id", "null"]


def outcome(traces: Path) -> dict:
    """Per task idx, what the comparison covers (judge calls and usage sorted: judges run concurrently)."""
    out = {}
    for line in traces.read_text().splitlines():
        episode = json.loads(line)
        (trace,) = episode["traces"]
        calls = sorted(trace["info"].get("judge_calls", []), key=lambda c: json.dumps(c, sort_keys=True))
        out[str(episode["task"]["data"]["idx"])] = {
            "ok": episode["ok"], "errors": len(trace["errors"]),
            "rewards": [[k, None if v is None else [v["score"], v["weight"]]] for k, v in trace["rewards"].items()],
            "metrics": trace["metrics"], "judge_calls": calls,
            "extra_usage": sorted(trace["extra_usage"], key=lambda u: json.dumps(u, sort_keys=True))}
    return dict(sorted(out.items()))


def run_ours(case: str, url: str, tmp: Path) -> dict:
    env = {**os.environ, "FAKE_KEY": "sk-test", "NO_COLOR": "1"}
    proc = subprocess.run([str(Path(sys.executable).parent / "vf-eval"), str(ENVS / f"{RUNS[case][0]}.py"),
                           *command(case, url, ENVS, tmp), "-o", str(tmp / "run")],
                          cwd=tmp, env=env, capture_output=True, text=True, timeout=120, check=False)
    # vf-eval exits 1 when every episode failed (verifiers' exits 0); the traces are what is compared
    assert proc.returncode == (1 if case == "error" else 0), proc.stderr[-3000:]
    return outcome(tmp / "run" / "traces.jsonl")


def run_peer(case: str, url: str, tmp: Path) -> dict:
    peer = Path(PEER_PYTHON).parent / "vf-eval"
    env = {**os.environ, "PYTHONPATH": str(PEER_ENVS), "FAKE_KEY": "sk-test",
           "PATH": f"{peer.parent}:{os.environ['PATH']}"}
    proc = subprocess.run([str(peer), RUNS[case][0], *command(case, url, PEER_ENVS, tmp)],
                          cwd=tmp, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (traces,) = (tmp / "outputs").glob("*/traces.jsonl")
    return outcome(traces)


RUN_CASES = list(RUNS)


@pytest.mark.parametrize("case", RUN_CASES)
def test_same_rewards_and_judge_calls_as_verifiers(case, stub, tmp_path):
    assert run_ours(case, stub.url, tmp_path) == json.loads(RUNS_GOLDEN.read_text())[case]


@needs_peer
@pytest.mark.parametrize("case", RUN_CASES)
def test_peer_gives_the_recorded_runs(case, stub, tmp_path):
    assert run_peer(case, stub.url, tmp_path) == json.loads(RUNS_GOLDEN.read_text())[case]


def test_recorded_runs_cover_each_judge():
    """The golden is not vacuous: every judge scored, verdicts vary, the error case errs."""
    runs = json.loads(RUNS_GOLDEN.read_text())
    toml = runs["toml"]
    assert [name for name, _ in toml["0"]["rewards"]] == ["exact", "reference", "rubric", "decision"]
    assert sorted({tuple(dict(r["rewards"])["reference"]) for r in toml.values()}) == [(0.0, 1.0), (1.0, 1.0)]
    assert {dict(r["rewards"])["decision"][0] for r in toml.values()} == {0.5, 1.0}
    assert len(runs["cli"]["0"]["judge_calls"]) == 4  # one reference call + one rubric call per criterion
    assert all(r["errors"] == 1 and not r["ok"] and dict(r["rewards"])["reference"] is None
               for r in runs["error"].values())


# ---- prompts and verdict parsing on edge inputs ---------------------------------------------------


def cases(python: str, side: str) -> dict:
    proc = subprocess.run([python, str(HERE / "judge_parity_cases.py"), side], capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_prompts_byte_for_byte_and_messy_verdicts_like_verifiers():
    ours, golden = cases(sys.executable, "vf"), json.loads(CASES_GOLDEN.read_text())
    assert ours["prompts"] == golden["prompts"]
    assert ours["choices"] == golden["choices"]


@needs_peer
def test_peer_gives_the_recorded_cases():
    assert cases(PEER_PYTHON, "verifiers") == json.loads(CASES_GOLDEN.read_text())


def test_parse_judge_choice_on_hostile_replies():
    import vf

    assert vf.parse_judge_choice("<think>A is right") is None  # unfinished reasoning is no verdict
    assert vf.parse_judge_choice("<think>A</think>B") == "B"
    assert vf.parse_judge_choice("Final verdict: c\n...\nFinal verdict: a") == "A"  # the last final line
    assert vf.parse_judge_choice("Verdict: D, so A") == "A"  # first label after the keyword
    assert vf.parse_judge_choice("Verdict: D") is None
    assert vf.parse_judge_choice("Not yes but yesterday", ("yes", "no")) == "yes"  # whole words only
    assert vf.parse_judge_choice("(a|b) A+", ("A+", "(a|b)")) == "A+"  # labels are literal, not regexes
    assert vf.parse_judge_choice("x" * 200_000 + " B", ("A", "B")) == "B"
    assert vf.parse_judge_choice("{" * 100_000, ("A", "B")) is None


# ---- behaviour around the calls ------------------------------------------------------------------


def scored(task_config, reply: str, answer="Paris"):
    """Score one task (reward `exact`, then the plugged judges) over a trace whose reply is `reply`."""
    import asyncio

    import vf
    from vf.episode.scoring import score

    class Data(vf.TaskData):
        answer: str | list[str]

    class T(vf.Task[Data]):
        @vf.reward(weight=0.5)
        async def exact(self, task, trace) -> float:
            return float(trace.last_reply == task.answer)

    trace = vf.Trace(nodes=[vf.MessageNode(message={"role": "user", "content": "Capital?"}),
                            vf.MessageNode(parent=0, sampled=True, message={"role": "assistant", "content": reply})])
    asyncio.run(score(T(Data(prompt="Capital?", answer=answer), task_config), trace))
    return trace


def test_judges_plugged_in_code_add_rewards_after_the_tasks(stub, monkeypatch):
    import vf

    monkeypatch.setenv("FAKE_KEY", "sk-test")
    config = vf.TaskConfig(judges=[vf.ReferenceJudgeConfig(model="grader", base_url=stub.url, api_key_var="FAKE_KEY",
                                                           weight=0.25),
                                   {"id": "decision", "base_url": f"{stub.url}/evaluations", "api_key_var": "FAKE_KEY",
                                    "answer_field": "answer", "name": "grade"}])
    trace = scored(config, "Paris")
    assert list(trace.rewards) == ["exact", "reference", "grade"]
    assert [(r.score, r.weight) for r in trace.rewards.values()] == [(1.0, 0.5), (1.0, 0.25), (1.0, 1.0)]
    assert trace.reward == pytest.approx(0.5 + 0.25 + 1.0)
    calls = {c["name"]: c for c in trace.info["judge_calls"]}
    assert calls["reference"]["request"]["model"] == "grader" and calls["reference"]["response"]["parsed"] == 1.0
    assert calls["grade"]["request"]["state"] == {"question": "Capital?", "response": "Paris", "answer": "Paris"}
    assert sorted(u["prompt_tokens"] for u in trace.extra_usage) == sorted(
        c["response"]["usage"]["prompt_tokens"] for c in calls.values())
    assert next(u for u in trace.extra_usage if "cost" in u)["cost"] == 0.001


def test_empty_reply_scores_zero_without_a_call(stub, monkeypatch):
    import vf

    monkeypatch.setenv("FAKE_KEY", "sk-test")
    before = len(stub.requests)
    trace = scored(vf.TaskConfig(judges=[{"id": "reference", "model": "grader", "base_url": stub.url},
                                         {"id": "decision", "base_url": stub.url}]), "  ")
    assert (trace.rewards["reference"].score, trace.rewards["decision"].score) == (0.0, 0.0)
    assert len(stub.requests) == before and "judge_calls" not in trace.info


def test_reply_without_a_verdict_is_a_judge_error_not_a_zero(stub, monkeypatch):
    import vf

    monkeypatch.setenv("FAKE_KEY", "sk-test")
    trace = scored(vf.TaskConfig(judges=[{"id": "reference", "model": "vision", "base_url": stub.url}]), "Paris")
    assert trace.rewards["reference"] is None and trace.rewards["exact"].score == 1.0 and not trace.ok
    assert "no yes/no verdict: 'images: 0'" in trace.errors[0].message
    assert trace.info["judge_calls"][0]["response"]["message"]["content"] == "images: 0"  # billed, so recorded


@contextmanager
def serve(status: int, body: bytes):
    """A hostile judge endpoint: every POST gets `status` and `body`."""
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(("judge", "status", "body", "error_type", "message"), [
    ("reference", 200, b"not json", "ProviderError", "malformed response"),
    ("reference", 200, b'{"choices": []}', "ProviderError", "no choices[0].message"),
    ("reference", 200, b'{"choices": [{"message": {"content": {"a": 1}}}]}', "ProviderError", "no choices[0].message"),
    ("reference", 200, b"[" * 100_000 + b"]" * 100_000, "ProviderError", "malformed response"),
    ("reference", 401, b'{"error": "bad key"}', "ProviderError", "HTTP 401"),
    ("decision", 200, b'{"answers": {"grade": {"score": 7}}}', "ValueError", "outside [0, 1]"),
    ("decision", 200, b'{"result": "nope"}', "TypeError", "string indices"),
    ("decision", 200, b'{"answers": {"grade": {"score": 1}}, "usage": {"inputTokens": null}}', "ValueError", "usage"),
])
def test_hostile_judge_endpoint_errors_the_trace_only(judge, status, body, error_type, message):
    import vf

    with serve(status, body) as url:
        trace = scored(vf.TaskConfig(judges=[{"id": judge, "model": "m", "base_url": url}]), "Paris")
    assert trace.rewards[judge] is None and trace.rewards["exact"].score == 1.0 and not trace.ok
    (error,) = trace.errors
    assert error.type == error_type and error.message.startswith(f"judge {judge!r}: ") and message in error.message
    # a decision reply was billed even when unreadable, so it is on the trace; a chat reply with no message is not
    assert len(trace.info.get("judge_calls", [])) == (1 if judge == "decision" else 0)


def test_failing_judge_endpoint_run_goes_on(stub, tmp_path, monkeypatch):
    """In a whole run: every episode records the judge's error and keeps the task's own reward."""
    from test_v1_envs import evaluate

    monkeypatch.setenv("FAKE_KEY", "sk-test")
    summary, out = evaluate("judged_v1.py", "echo", stub.url, tmp_path,
                            extra={"env": {"taskset": {"task": {"judges": judge_entries("error", stub.url, ENVS, tmp_path)}}}})
    assert summary["num_errors"] == 3
    got = outcome(out / "traces.jsonl")
    assert [dict(r["rewards"])["exact"] for r in got.values()] == [[1.0, 0.5], [0.0, 0.5], [0.0, 0.5]]
    assert all("HTTP 500" in e["message"] for line in (out / "traces.jsonl").read_text().splitlines()
               for e in json.loads(line)["traces"][0]["errors"])


def test_judges_from_a_yaml_config_file(stub, tmp_path):
    """vf's own `--config FILE.yaml` spelling plugs judges too (verifiers' `env.taskset` section)."""
    import yaml
    from conftest import run_cli

    (tmp_path / "eval.yaml").write_text(yaml.safe_dump({"env": {"taskset": {"task": {"judges": [
        {"id": "reference", "model": "grader", "base_url": stub.url, "api_key_var": "FAKE_KEY", "weight": 0.5}]}}}}))
    r = run_cli("vf-eval", str(ENVS / "judged_v1.py"), "--config", str(tmp_path / "eval.yaml"), "-m", "echo",
                "--client.base-url", stub.url, "--client.api-key-var", "FAKE_KEY", "-o", str(tmp_path / "run"),
                env={"FAKE_KEY": "sk-test"})
    assert r.returncode == 0, r.stderr[-2000:]
    got = outcome(tmp_path / "run" / "traces.jsonl")
    assert [r["rewards"] for r in got.values()] == [
        [["exact", [1.0, 0.5]], ["reference", [1.0, 0.5]]], [["exact", [0.0, 0.5]], ["reference", [0.0, 0.5]]],
        [["exact", [0.0, 0.5]], ["reference", [1.0, 0.5]]]]


@pytest.mark.parametrize(("entries", "message"), [
    ([{"id": "rubrik"}], "judge 'rubrik' not found"),
    ([{"model": "m"}], "needs an `id`"),
    ([{"id": "rubric"}], "judges[0] (rubric): path: Field required"),
    ([{"id": "rubric", "path": "missing.toml"}], "rubric file 'missing.toml' does not exist"),
    ([{"id": "reference", "choices": ["Yes", "yes"]}], "two distinct"),
    ([{"id": "reference", "temperature": 0}], "temperature: Extra inputs are not permitted"),
    ([{"id": "reference"}, {"id": "reference", "model": "other"}], "share a reward key ['reference']"),
    ([{"id": "reference", "prompt": "nope.txt"}], "prompt file 'nope.txt' does not exist"),
    ([{"id": "os:getcwd"}], "not a vf.Judge subclass"),
    (["reference"], "is a mapping"),
])
def test_bad_judge_config_is_refused_when_the_config_loads(entries, message):
    from pydantic import ValidationError

    import vf

    with pytest.raises(ValidationError) as e:
        vf.TaskConfig(judges=entries)
    assert message in str(e.value)


def test_bad_judge_config_fails_vf_eval_before_any_rollout(stub, tmp_path):
    from conftest import run_cli

    before = len(stub.requests)
    r = run_cli("vf-eval", str(ENVS / "judged_v1.py"), "-m", "echo", "--client.base-url", stub.url,
                "--env.taskset.task.judges", '[{"id": "rubric", "path": "missing.toml"}]', "-o", str(tmp_path / "run"))
    assert r.returncode == 2, r.stderr[-2000:]
    assert "taskset.task.judges" in r.stderr and "rubric file 'missing.toml' does not exist" in r.stderr
    assert len(stub.requests) == before


USER_JUDGE = '''
import vf

__all__ = ["ShoutConfig", "ShoutJudge"]


class ShoutConfig(vf.JudgeConfig):
    word: str = "PARIS"


class ShoutJudge(vf.Judge[float, ShoutConfig]):
    prompt = "Does {reply} say {word}? yes or no"

    async def score(self, task, trace):
        result = await self.evaluate(trace=trace, reply=trace.last_reply, word=self.config.word)
        return {"shout": float(vf.parse_judge_choice(result.text, ("yes", "no")) == "yes"), "length": 0.0}
'''


@pytest.mark.parametrize("form", ["path", "module", "package"])
def test_user_judge_by_path_or_module(form, stub, tmp_path, monkeypatch):
    import vf

    (tmp_path / "shout_judge.py").write_text(USER_JUDGE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("FAKE_KEY", "sk-test")
    # a file, a module attribute, or (verifiers' plugin form) a package exporting one Judge in __all__
    judge_id = {"path": f"{tmp_path / 'shout_judge.py'}:ShoutJudge", "module": "shout_judge:ShoutJudge",
                "package": "someone/Shout-Judge@1.0"}[form]
    config = vf.TaskConfig(judges=[{"id": judge_id, "model": "yes", "base_url": stub.url, "word": "LOUD",
                                    "weight": 3}])
    assert type(config.judges[0]).__name__ == "ShoutConfig" and config.judges[0].word == "LOUD"
    trace = scored(config, "Paris")
    assert list(trace.rewards) == ["exact", "shout", "length"]  # a mapping replaces the judge's own key
    assert (trace.rewards["shout"].score, trace.rewards["shout"].weight) == (1.0, 3.0)
    (call,) = trace.info["judge_calls"]
    # the judge's own key (its calls' name): from the class for code refs, the id for a package (as verifiers)
    assert call["name"] == ("shout" if form != "package" else judge_id)
    assert call["request"]["messages"][0]["content"] == "Does Paris say LOUD? yes or no"


def test_judge_request_sends_only_what_is_set(stub, monkeypatch):
    """Like verifiers: no sampling defaults of ours reach the judge (a judge model keeps its own);
    set keys (and provider extras) go through; headers and the key reach the endpoint."""
    import vf

    monkeypatch.setenv("JUDGE_KEY", "sk-judge")
    monkeypatch.setenv("TEAM", "t-1")
    before = len(stub.requests)
    scored(vf.TaskConfig(judges=[{"id": "reference", "model": "grader", "base_url": stub.url, "api_key_var": "JUDGE_KEY",
                                  "headers_from_env": {"X-Team": "TEAM"},
                                  "sampling": {"temperature": 0, "extra_body": {"top_k": 5}}}]), "Paris")
    (body,) = stub.requests[before:]
    assert sorted(body) == ["messages", "model", "temperature", "top_k"] and body["top_k"] == 5
    from openai_stub import Handler

    assert Handler.auth[-1] == "Bearer sk-judge" and Handler.headers_seen[-1]["X-Team"] == "t-1"


def record() -> None:
    """Re-record both goldens from verifiers (needs VF_VERIFIERS_PYTHON)."""
    import tempfile

    from openai_stub import StubServer

    runs = {}
    with StubServer() as stub:
        for case in RUN_CASES:
            with tempfile.TemporaryDirectory() as tmp:
                runs[case] = run_peer(case, stub.url, Path(tmp))
    RUNS_GOLDEN.write_text(json.dumps(runs, indent=1, sort_keys=True) + "\n")
    CASES_GOLDEN.write_text(json.dumps(cases(PEER_PYTHON, "verifiers"), indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    assert PEER_PYTHON, "set VF_VERIFIERS_PYTHON"
    record()


def test_rubric_structured_output_asks_for_the_schema(tmp_path):
    """`structured_output`: the request carries OpenAI's json_schema response format for the verdicts
    (as the openai SDK builds it for verifiers), and the reply's JSON is the verdict."""
    import vf

    (tmp_path / "r.json").write_text(json.dumps({"criteria": [{"name": "ok", "text": "fine?"}]}))
    content = json.dumps({"verdicts": [{"name": "ok", "reason": "it is", "verdict": "yes"}]})
    reply = json.dumps({"choices": [{"message": {"role": "assistant", "content": content}}],
                        "usage": {"prompt_tokens": 9, "completion_tokens": 4,
                                  "prompt_tokens_details": {"cached_tokens": 5}}}).encode()
    seen = []

    class Spy(BaseHTTPRequestHandler):
        def do_POST(self):
            seen.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Spy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        trace = scored(vf.TaskConfig(judges=[{"id": "rubric", "path": str(tmp_path / "r.json"), "structured_output": True,
                                              "base_url": f"http://127.0.0.1:{server.server_address[1]}/v1"}]), "Paris")
    finally:
        server.shutdown()
        server.server_close()
    assert trace.rewards["rubric"].score == 1.0 and trace.metrics == {"rubric/ok": 1.0}
    fmt = seen[0]["response_format"]
    assert fmt["type"] == "json_schema" and fmt["json_schema"]["name"] == "RubricVerdicts" and fmt["json_schema"]["strict"]
    assert fmt["json_schema"]["schema"]["properties"]["verdicts"]["type"] == "array"
    assert not seen[0]["messages"][0]["content"].endswith("after that criterion.")  # no JSON instructions appended
    (call,) = trace.info["judge_calls"]
    assert call["response"]["parsed"] == json.loads(content)
    assert trace.extra_usage == [{"prompt_tokens": 4, "completion_tokens": 4, "cached_input_tokens": 5}]


def test_task_config_may_pre_plug_judges_as_defaults(stub, monkeypatch):
    """verifiers' pattern: a TaskConfig subclass lists judges as its default (a CLI list replaces it)."""
    import vf

    monkeypatch.setenv("FAKE_KEY", "sk-test")

    class GradedConfig(vf.TaskConfig):
        judges: vf.Judges = [vf.ReferenceJudgeConfig(model="grader", base_url=stub.url, api_key_var="FAKE_KEY",
                                                     weight=0.3, timeout={"connect": 5, "read": 30})]

    trace = scored(GradedConfig(), "I think Paris")
    assert (trace.rewards["reference"].score, trace.rewards["reference"].weight) == (1.0, 0.3)
    replaced = GradedConfig(judges=[{"id": "decision", "base_url": stub.url, "name": "d"}])
    assert [type(j).__name__ for j in replaced.judges] == ["DecisionJudgeConfig"]
