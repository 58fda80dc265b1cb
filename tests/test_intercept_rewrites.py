"""The trace's record of `@vf.intercept` rewrites (verifiers 0.4.0's `Trace.request_rewrites` /
`response_rewrites`: one `InterceptRecord(handler=<hook name>)` per call a hook changed): filled by
the rollout's one model-call path, readable by the task's rewards, and kept through the trace
being written and read back (by verifiers 0.4.0 too, with VF_VERIFIERS_PYTHON)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess

import pytest

import vf
from vf.engines.base import GenerateRequest, GenerateResult
from vf.runner import EpisodeSpec, run_episode
from vf.trace import Episode

VERIFIERS_PY = os.environ.get("VF_VERIFIERS_PYTHON")


class ScriptedEngine:
    """A model stand-in that replies with a fixed list of texts, in order, and keeps the requests."""

    name = "scripted"
    supports_tokens = False

    def __init__(self, replies: list[str]):
        self.replies = list(replies)
        self.requests: list[GenerateRequest] = []

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        self.requests.append(request)
        return GenerateResult(message={"role": "assistant", "content": self.replies.pop(0)})

    async def close(self) -> None:
        pass


class Rewritten(vf.Task[vf.TaskData, vf.State, vf.TaskConfig]):
    @vf.intercept
    def polite(self, request: vf.Request):
        last = request.messages[-1]
        if last.role == "user" and isinstance(last.content, str) and not last.content.endswith(" please"):
            last.content += " please"
            return request
        return None

    @vf.intercept
    def shout(self, response: vf.Response):
        text = response.message.content
        if isinstance(text, str) and text != text.upper():
            response.message.content = text.upper()
            return response
        return None

    @vf.intercept
    def untouched(self, response: vf.Response):  # runs on every reply and changes nothing: no record
        return None

    @vf.reward
    def hooks_seen(self, trace) -> float:
        """What an environment's reward reads: which hooks rewrote the calls."""
        requests = [r.handler for r in trace.request_rewrites]
        responses = [r.handler for r in trace.response_rewrites]
        return float(requests == ["polite"] and responses == ["shout"])


def run(replies: list[str]) -> tuple[Episode, ScriptedEngine]:
    engine = ScriptedEngine(replies)
    task = Rewritten(vf.TaskData(prompt="say hi"))
    spec = EpisodeSpec(engine=engine, model="m", run={"type": "eval", "id": "rewrites", "name": "rewrites"})
    return asyncio.run(run_episode(task, spec)), engine


def test_rewards_read_which_hooks_rewrote_the_calls():
    episode, engine = run(["hi"])
    (trace,) = episode.traces
    assert not trace.errors, trace.errors
    assert [r.handler for r in trace.request_rewrites] == ["polite"]
    assert [r.handler for r in trace.response_rewrites] == ["shout"]  # not `untouched`: it changed nothing
    assert trace.rewards["hooks_seen"].score == 1.0
    # what the hooks did is what the model and the trace saw
    assert engine.requests[0].messages[-1]["content"] == "say hi please"
    assert [n.message.get("content") for n in trace.nodes if n.message["role"] == "assistant"] == ["HI"]


def test_a_reward_sees_no_rewrites_when_no_hook_changed_anything():
    episode, _ = run(["HI"])  # the prompt is still rewritten, the reply is not
    (trace,) = episode.traces
    assert [r.handler for r in trace.request_rewrites] == ["polite"]
    assert [r.handler for r in trace.response_rewrites] == []
    assert trace.rewards["hooks_seen"].score == 0.0


def test_the_rewrites_survive_writing_and_reading_the_trace(tmp_path):
    episode, _ = run(["hi"])
    path = tmp_path / "traces.jsonl"
    path.write_text(episode.to_json() + "\n")
    line = json.loads(path.read_text())
    assert [r["handler"] for r in line["traces"][0]["request_rewrites"]] == ["polite"]
    (back,) = Episode.model_validate_json(path.read_text()).traces
    assert [r.handler for r in back.request_rewrites] == ["polite"]
    assert [r.handler for r in back.response_rewrites] == ["shout"]


READ = """\
import json, sys
from verifiers.v1 import WireEpisode
ep = WireEpisode.model_validate_json(open(sys.argv[1]).read())
trace = ep.traces[0]
print(json.dumps([[r.handler for r in trace.request_rewrites], [r.handler for r in trace.response_rewrites]]))
"""


@pytest.mark.skipif(not VERIFIERS_PY, reason="set VF_VERIFIERS_PYTHON to a python with verifiers==0.4.0")
def test_verifiers_reads_the_rewrites_vf_wrote(tmp_path):
    episode, _ = run(["hi"])
    path = tmp_path / "traces.jsonl"
    path.write_text(episode.to_json() + "\n")
    proc = subprocess.run([VERIFIERS_PY, "-c", READ, str(path)], capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout) == [["polite"], ["shout"]]
