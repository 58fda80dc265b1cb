"""vf-migrate on the v0 API of verifiers releases the vendored corpus does not cover (issue 34).

Each module below is written against one release's public API, as read from its wheel on PyPI
(verifiers 0.1.2: a sync `rubric.judge(...)`; 0.1.5: `await rubric.judge(...)` and
`judge_sampling_args`; 0.1.9+: `@vf.stop`, `@vf.cleanup`, `state["trajectory"]`; 0.1.11+:
`vf.UserMessage`). Each migrates with no TODO and runs: the stop methods end the rollout, the
judge calls reach the run's judge, a parameter typed with a verifiers object stays out of the
config, and a reward function that raises is an error on its trace (and vf-validate's probe
finds it) instead of a silent 0.
"""

from __future__ import annotations

import asyncio
import textwrap

import pytest

from vf.migrate import apply, plan
from vf.trace import MessageNode, Trace

INTERVIEW_019 = textwrap.dedent('''
    import verifiers as vf
    from verifiers.types import Messages, State

    FOLLOWUPS = ["Why?", "Are you sure?"]


    class Interview(vf.MultiTurnEnv):
        async def setup_state(self, state: State) -> State:
            state["asked"] = 0
            return state

        @vf.stop
        async def all_asked(self, state: State) -> bool:
            return len(state["trajectory"]) > len(FOLLOWUPS)

        @vf.cleanup
        async def done(self, state: State) -> None:
            state["cleaned"] = True

        async def env_response(self, messages: Messages, state: State, **kwargs) -> Messages:
            question = FOLLOWUPS[len(state["trajectory"]) - 1]  # past the last one: IndexError
            state["asked"] += 1
            return [vf.UserMessage(content=question)]


    def asked_all(state) -> float:
        return float(state["asked"] == len(FOLLOWUPS) and state["cleaned"])


    def turns(state) -> float:
        return float(len(state["trajectory"]))


    def load_environment():
        rows = [{"question": "Is the sky blue?", "answer": "yes"}]
        rubric = vf.Rubric(funcs=[asked_all, turns], weights=[1.0, 0.0])
        return Interview(dataset=rows, rubric=rubric, system_prompt=vf.SystemMessage(content="Be brief.")["content"])
''')

JUDGE_012 = textwrap.dedent('''
    import os

    from openai import OpenAI

    import verifiers as vf


    def load_environment(judge_model: str = "gpt-4.1-nano", judge_base_url: str = "https://api.openai.com/v1",
                         judge_api_key_var: str = "OPENAI_API_KEY"):
        client = OpenAI(base_url=judge_base_url, api_key=os.getenv(judge_api_key_var))
        rubric = vf.JudgeRubric(judge_client=client, judge_model=judge_model, judge_sampling_args={"max_tokens": 7})

        def sync_judged(prompt, completion, answer, state, **kwargs) -> float:  # 0.1.2: judge() is sync
            return 1.0 if "yes" in rubric.judge(prompt, completion, answer, state).lower() else 0.0

        async def async_judged(prompt, completion, answer, state, **kwargs) -> float:  # 0.1.3+: awaited
            reply = await rubric.judge(prompt, completion, answer, state)
            return 1.0 if "yes" in reply.lower() else 0.0

        def token_budget(**kwargs) -> float:
            return float(rubric.judge_sampling_args["max_tokens"])

        rubric.add_reward_func(sync_judged)
        rubric.add_reward_func(async_judged, weight=0.5)
        rubric.add_metric(token_budget)
        rows = [{"question": "2 + 2?", "answer": "4"}]
        return vf.SingleTurnEnv(dataset=rows, rubric=rubric)
''')

TYPED_PARSER = textwrap.dedent('''
    import verifiers as vf
    from verifiers import XMLParser


    def has_answer(completion, parser) -> float:
        return float(parser.parse_answer(completion) is not None)


    def load_environment(parser: XMLParser = XMLParser(["think", "answer"]), rows: int = 1,
                         think: vf.ThinkParser | None = None):
        data = [{"question": f"q{i}", "answer": str(i)} for i in range(rows)]
        rubric = vf.Rubric(funcs=[has_answer], parser=parser)
        return vf.SingleTurnEnv(dataset=data, parser=parser, rubric=rubric)
''')

BROKEN_REWARD = textwrap.dedent('''
    import verifiers as vf


    def load_environment():
        rubric = vf.Rubric()

        def graded(completion, answer) -> float:
            return float(rubric.grader.check(completion, answer))  # no such attribute, in any release

        def exact(completion, answer) -> float:
            return float(completion[-1]["content"] == answer)

        rubric.add_reward_func(graded)
        rubric.add_reward_func(exact)
        return vf.SingleTurnEnv(dataset=[{"question": "Say 4.", "answer": "4"}], rubric=rubric)
''')


def _migrate(tmp_path, name: str, source: str):
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    report = plan([path])
    apply(report)
    new = path.read_text()
    compile(new, name, "exec")
    assert "TODO(vf-migrate)" not in new and "verifiers" not in new, new
    assert not [e for e in report.entries if e.status == "manual"], report.entries
    return path, report


def _load(path, fields=None):
    import vf

    return vf.load_taskset(str(path), fields)


class Scripted:
    name, supports_tokens = "scripted", False

    def __init__(self, replies):
        self.replies = list(replies)

    async def generate(self, request):
        from vf.engines.base import GenerateResult

        return GenerateResult(message={"role": "assistant", "content": self.replies.pop(0)})

    async def close(self):
        pass


def _score(loaded, reply: str) -> Trace:
    from vf.episode.scoring import score

    task = list(loaded.taskset.take(1))[0]
    trace = Trace()
    for m in task.messages():
        trace.nodes.append(MessageNode(parent=len(trace.nodes) - 1 if trace.nodes else None, message=m))
    trace.nodes.append(MessageNode(parent=len(trace.nodes) - 1, message={"role": "assistant", "content": reply},
                                   sampled=True))
    trace.state = task.state_class()()
    asyncio.run(score(task, trace, trace.state))
    return trace


def test_stop_methods_trajectory_and_typed_messages_of_0_1_9(tmp_path):
    """@vf.stop ends the rollout before env_response runs past its last follow-up; @vf.cleanup runs;
    state["trajectory"] holds one step per reply; vf.UserMessage/SystemMessage are messages."""
    from vf.runner import EpisodeSpec, run_episode

    path, _ = _migrate(tmp_path, "interview", INTERVIEW_019)
    loaded = _load(path)
    spec = EpisodeSpec(engine=Scripted(["yes", "it is", "quite", "unused"]), model="m", env=loaded.env, max_turns=8)
    trace = asyncio.run(run_episode(list(loaded.taskset.take(1))[0], spec)).trace
    assert not trace.errors, trace.errors
    assert [m["content"] for m in trace.messages if m["role"] == "user"][1:] == ["Why?", "Are you sure?"]
    assert trace.messages[0] == {"role": "system", "content": "Be brief."}
    assert trace.num_turns == 3 and trace.stop_condition == "env_done"
    assert trace.rewards["asked_all"].score == 1.0 and trace.metrics["turns"] == 3.0


def test_older_judge_apis_reach_the_runs_judge(tmp_path, stub, monkeypatch):
    """`rubric.judge(...)` called plainly (0.1.2) and awaited (0.1.3+), `judge_sampling_args`: each
    reward asks the judge (`--taskset.judge-base-url` / `--taskset.judge-model` reach it)."""
    monkeypatch.setenv("OPENAI_API_KEY", "unused")  # v0's client is built at load, as v0 built it
    path, report = _migrate(tmp_path, "judged_012", JUDGE_012)
    assert any(e.rule == "ENV010" for e in report.entries)
    before = len(stub.requests)
    trace = _score(_load(path, {"judge_base_url": stub.url, "judge_model": "yes"}), "4")
    assert not trace.errors, trace.errors
    assert {k: v.score for k, v in trace.rewards.items()} == {"sync_judged": 1.0, "async_judged": 1.0}
    assert trace.metrics == {"token_budget": 7.0}
    sent = stub.requests[before:]
    assert len(sent) == 1  # the second call's prompt is cached in the v0 state, as 0.1.3+ did
    assert sent[0]["model"] == "yes" and sent[0]["max_tokens"] == 7
    assert "2 + 2?" in sent[0]["messages"][0]["content"]
    assert len(trace.info["judge_calls"]) == 1
    # a task.judge key set for the run wins over the load_environment argument
    over = _load(path, {"judge_base_url": "http://127.0.0.1:9/v1", "task": {"judge": {"base_url": stub.url}}})
    assert list(over.taskset.take(1))[0].config.judge.base_url == stub.url


def test_object_typed_parameter_is_no_config_field(tmp_path):
    path, report = _migrate(tmp_path, "typed", TYPED_PARSER)
    loaded = _load(path, {"rows": 2})  # imports (pydantic builds the config) and loads
    assert len(list(loaded.taskset.take(5))) == 2
    fields = type(loaded.taskset.config).model_fields
    assert "rows" in fields and "parser" not in fields and "think" not in fields
    assert any("parameter parser (XMLParser) is no config field" in e.message for e in report.entries)
    assert _score(loaded, "<think>\nx\n</think>\n<answer>\n1\n</answer>").rewards["has_answer"].score == 1.0


def test_a_raising_reward_is_an_error_and_vf_validate_finds_it(tmp_path, cli):
    from vf.validate import validate_taskset

    path, _ = _migrate(tmp_path, "broken", BROKEN_REWARD)
    trace = _score(_load(path), "4")
    assert not trace.ok and trace.rewards["graded"] is None and trace.rewards["exact"].score == 1.0
    (error,) = trace.errors
    assert error.type == "AttributeError" and "reward 'graded'" in error.message and "grader" in error.message
    report = asyncio.run(validate_taskset(_load(path), 1))  # the probe reply: the row's answer
    (failure,) = report.failures
    assert "probe episode failed: AttributeError: reward 'graded'" in failure.reason
    proc = cli("vf-validate", str(path))
    assert proc.returncode == 3 and "reward 'graded'" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("call", ["judge(p, c, a, s)", "rubric.judge(p, c, a, s)"])
def test_judge_outside_scoring_or_with_extra_arguments_says_what_to_do(call):
    from vf.migrate import compat

    rubric = compat.JudgeRubric()
    judge = compat.JudgeCall(None, None)
    with pytest.raises(TypeError, match="0.1.8 and later take judge"):
        judge("p", [], "a", {}, info={})
    if call.startswith("rubric"):
        with pytest.raises(RuntimeError, match="outside a reward function"):
            rubric.judge("p", [], "a", {})


GAME_HIERARCHY = textwrap.dedent('''
    import verifiers as vf


    class TurnGame(vf.MultiTurnEnv):
        """A base class of the module: the env class below derives from it, not from vf directly."""

        async def env_response(self, messages, state, **kwargs):
            if "quit" in messages[-1]["content"]:
                raise vf.ToolError("the model quit")
            return [vf.UserMessage(content=f"round {len(state['trajectory']) + 1}")]


    class Rounds(TurnGame):
        @vf.stop(priority=1)
        async def two_rounds(self, state) -> bool:
            return len(state["trajectory"]) >= 2


    def rounds(state) -> float:
        return float(len(state["trajectory"]))


    def load_environment():
        vf.ensure_keys([])
        return Rounds(dataset=[{"question": "Play.", "answer": ""}], rubric=vf.Rubric(funcs=[rounds]))
''')


def test_env_class_derived_through_a_module_base_and_v0_errors(tmp_path):
    """An env class whose vf base is one class up is a multi-turn env (it was "unknown environment
    class ...: check it"); `vf.ToolError` raised in env_response is an error on the trace."""
    from vf.runner import EpisodeSpec, run_episode

    path, _ = _migrate(tmp_path, "rounds", GAME_HIERARCHY)
    loaded = _load(path)
    task = list(loaded.taskset.take(1))[0]
    trace = asyncio.run(run_episode(task, EpisodeSpec(engine=Scripted(["a", "b", "c"]), model="m",
                                                      env=loaded.env, max_turns=8))).trace
    assert not trace.errors and trace.num_turns == 2 and trace.rewards["rounds"].score == 2.0
    assert [m["content"] for m in trace.messages if m["role"] == "user"][1:] == ["round 2"]
    quit_ep = asyncio.run(run_episode(task, EpisodeSpec(engine=Scripted(["quit"]), model="m", env=loaded.env)))
    assert [(e.type, e.message) for e in quit_ep.errors] == [("ToolError", "the model quit")]


def test_verifiers_0_3_legacy_spelling(tmp_path):
    """verifiers 0.3.x moved the v0 API to `verifiers.legacy` (`import verifiers.legacy as vf`)."""
    source = INTERVIEW_019.replace("import verifiers as vf", "import verifiers.legacy as vf").replace(
        "from verifiers.types import", "from verifiers.legacy.types import")
    path, _ = _migrate(tmp_path, "interview_03", source)
    assert "import vf\nfrom vf.migrate import compat" in path.read_text()
    assert _load(path).env is not None
