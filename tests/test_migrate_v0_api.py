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
from pathlib import Path

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
    # one request per release's cache: 0.1.2's plain call keeps its reply as state["judge_response"] (a
    # string), 0.1.3+'s awaited call caches per prompt (a dict there); this module mixes the two
    assert len(sent) == 2
    assert all(r["model"] == "yes" and r["max_tokens"] == 7 for r in sent)
    assert "2 + 2?" in sent[0]["messages"][0]["content"]
    assert len(trace.info["judge_calls"]) == 2
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
def test_judge_outside_scoring_says_what_to_do_and_extra_arguments_are_ignored(call):
    """0.1.3-0.1.7 took judge(prompt, completion, answer, state, **kwargs) and ignored the extras
    (0.1.8+ refused them): code that passes them was written for those releases, so compat asks the
    judge as its author saw, never a TypeError scored as a failed reward."""
    from types import SimpleNamespace

    from vf.migrate import compat

    asked = []

    class Judge:  # a vf.Judge's two methods JudgeCall uses
        def build_messages(self, question, answer, response):
            return f"{question}|{answer}|{response}"

        async def complete(self, messages, trace=None, **sampling):
            asked.append(messages)
            return SimpleNamespace(text=f"verdict on {messages}")

    judge = compat.JudgeCall(Judge(), None)
    completion, state = [{"role": "assistant", "content": "r"}], {}

    async def awaited(**extra):  # 0.1.3+ awaited it
        return await judge([{"role": "user", "content": "q"}], completion, "a", state, **extra)

    assert asyncio.run(awaited(info={}, task="t")) == asyncio.run(awaited()) == "verdict on q|a|r"
    assert asked == ["q|a|r"]  # the second call is state's cached reply, as v0 kept it
    if call.startswith("rubric"):
        with pytest.raises(RuntimeError, match="outside a reward function"):
            compat.JudgeRubric().judge("p", [], "a", {})


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


# ---- shapes the 30-environment corpus revealed (tests/migrate_corpus/v0) ----------------------------

JUDGE_012_TEMPLATE = textwrap.dedent(r'''
    from openai import OpenAI

    import verifiers as vf


    def load_environment(judge_base_url: str | None = None):
        TEMPLATE = """Grade it.\nQuestion: {question}\nGold: {answer}\nPredicted: {response}\nReply A or B.\n""".strip()
        rubric = vf.JudgeRubric(judge_client=OpenAI(base_url=judge_base_url), judge_model="echo", judge_prompt=TEMPLATE)

        def graded(prompt, completion, answer, state, **kwargs) -> float:  # 0.1.2: a plain call, **kwargs passed on
            reply = rubric.judge(prompt, completion, answer, state, **kwargs)
            return 1.0 if "Gold: 4" in reply and reply.endswith("Reply A or B.") else 0.0

        def cached(prompt, completion, answer, state, **kwargs) -> float:  # 0.1.2 kept one reply per rollout
            return float(state["judge_response"] == rubric.judge(prompt, completion, answer, state, **kwargs))

        rubric.add_reward_func(graded)
        rubric.add_reward_func(cached)
        return vf.SingleTurnEnv(eval_dataset=[{"question": "2 + 2?", "answer": "4"}], rubric=rubric)
''')


def test_0_1_2_judge_template_extra_arguments_and_cache(tmp_path, stub, monkeypatch):
    """simpleqa / toxicity_explanation (0.1.2): the judge prompt is a local `'''...'''.strip()` (it was
    replaced by v0's default prompt in silence), the plain `rubric.judge(..., **kwargs)` call ignores
    the extra arguments as 0.1.2 did (it raised 0.1.8+'s error), and the reply is kept whole in
    state["judge_response"] for the rollout (0.1.2's cache): one request."""
    monkeypatch.setenv("OPENAI_API_KEY", "unused")
    path, _ = _migrate(tmp_path, "simple_012", JUDGE_012_TEMPLATE)
    before = len(stub.requests)
    trace = _score(_load(path, {"task": {"judge": {"base_url": stub.url}}}), "four")
    assert not trace.errors, trace.errors
    assert {k: v.score for k, v in trace.rewards.items()} == {"graded": 1.0, "cached": 1.0}
    assert len(stub.requests) - before == 1


def test_a_judge_prompt_computed_at_load_is_a_todo_not_the_default(tmp_path):
    source = JUDGE_012_TEMPLATE.replace('""".strip()', '""".format(x=1)')
    path = tmp_path / "computed.py"
    path.write_text(source)
    report = plan([path])
    assert any(e.status == "manual" and "judge_prompt= is computed in load_environment" in e.message
               for e in report.entries), report.entries


NESTED_ENV_CLASS = textwrap.dedent('''
    import verifiers as vf


    def load_environment(turns: int = 2):
        class Countdown(vf.MultiTurnEnv):
            async def is_completed(self, messages, state, **kwargs) -> bool:
                return sum(m["role"] == "assistant" for m in messages) >= turns

            async def env_response(self, messages, state, **kwargs):
                return [{"role": "user", "content": "again"}], state

        def make_reward(word):
            def said_word(completion, **kwargs) -> float:
                return float(all(word in m["content"] for m in completion if m["role"] == "assistant"))

            return said_word

        rubric = vf.Rubric(funcs=[make_reward("go")], weights=[1.0])
        return Countdown(dataset=[{"question": "Say go.", "answer": ""}], rubric=rubric, max_turns=5)
''')


def test_env_class_defined_inside_load_environment_and_a_reward_factory(tmp_path):
    """alphabet_sort (0.3.x): its SortingEnv is a class of load_environment, not of the module (it was
    "unknown environment class ...: check it" and "a multi-turn env without a subclass"), and its
    reward is `create_weighted_rewards()`: v0 named it after the function the factory returns."""
    from vf.runner import EpisodeSpec, run_episode

    path, report = _migrate(tmp_path, "countdown", NESTED_ENV_CLASS)
    assert any(e.rule == "ENV003" and "said_word" in e.message for e in report.entries)
    loaded = _load(path)
    spec = EpisodeSpec(engine=Scripted(["go", "go go", "never asked"]), model="m", env=loaded.env, max_turns=8)
    trace = asyncio.run(run_episode(list(loaded.taskset.take(1))[0], spec)).trace
    assert not trace.errors, trace.errors
    assert trace.num_turns == 2 and [m["content"] for m in trace.messages if m["role"] == "user"][1:] == ["again"]
    assert trace.rewards["said_word"].score == 1.0


OWN_JUDGE_CLIENT = textwrap.dedent('''
    from openai import AsyncOpenAI, OpenAI

    import verifiers as vf


    class CriteriaRubric(vf.Rubric):
        """A judge rubric of the env's own (misguided_attention): it calls its client directly."""

        def __init__(self, judge_client=None, judge_model="gpt-4.1-nano", **kwargs):
            super().__init__(**kwargs)
            self.judge_client = judge_client if judge_client is not None else OpenAI()
            self.judge_model = judge_model

        def judge(self, prompt, completion, answer, state) -> str:
            reply = self.judge_client.chat.completions.create(
                model=self.judge_model, temperature=0.0,
                messages=[{"role": "user", "content": f"Is {completion[-1]['content']!r} {answer}?"}])
            return reply.choices[0].message.content


    def load_environment(judge_model: str = "gpt-4.1-nano", judge_base_url: str = "http://127.0.0.1:9/v1"):
        client = OpenAI(base_url=judge_base_url, api_key="unused")
        aclient = AsyncOpenAI(base_url=judge_base_url, api_key="unused")
        rubric = CriteriaRubric(judge_client=client, judge_model=judge_model)

        def judged(prompt, completion, answer, state) -> float:
            return 1.0 if rubric.judge(prompt, completion, answer, state) == "yes" else 0.0

        async def asked_directly(completion, answer) -> float:  # the client called inside a reward
            reply = await aclient.chat.completions.create(
                model=judge_model, messages=[{"role": "user", "content": f"{completion[-1]['content']} == {answer}?"}])
            return 1.0 if reply.choices[0].message.content == "yes" else 0.0

        rubric.add_reward_func(judged)
        rubric.add_reward_func(asked_directly)
        return vf.SingleTurnEnv(dataset=[{"question": "2 + 2?", "answer": "4"}], rubric=rubric)
''')


def test_a_judge_client_the_env_calls_itself_reaches_the_runs_judge(tmp_path, stub, monkeypatch):
    """A rubric class of the module that takes a judge client (it was "has no compat equivalent"),
    and a client called directly inside a reward: their requests go to the run's judge
    (`--taskset.judge-base-url/-model`), recorded on the trace, not to the v0 client's default URL
    (port 9: nothing listens)."""
    monkeypatch.setenv("OPENAI_API_KEY", "unused")
    path, report = _migrate(tmp_path, "own_client", OWN_JUDGE_CLIENT)
    assert "compat.OpenAI(base_url=judge_base_url" in path.read_text()
    assert any(e.rule == "ENV010" and "CriteriaRubric" in e.message for e in report.entries)
    before = len(stub.requests)
    trace = _score(_load(path, {"judge_base_url": stub.url, "judge_model": "yes"}), "4")
    assert not trace.errors, trace.errors
    assert {k: v.score for k, v in trace.rewards.items()} == {"judged": 1.0, "asked_directly": 1.0}
    sent = stub.requests[before:]
    assert [r["model"] for r in sent] == ["yes", "yes"] and sent[0]["temperature"] == 0.0
    assert "'4' 4?" in sent[0]["messages"][0]["content"]
    assert len(trace.info["judge_calls"]) == 2


# ---- 0.1.14+'s signal decorators and verifiers' library env classes ---------------------------------

SIGNALS_0_1_14 = textwrap.dedent('''
    import verifiers as vf


    class Echo(vf.MultiTurnEnv):
        @vf.reward(weight=0.5)
        async def bonus(self, state) -> float:  # v0's Environment never discovered it: no reward in v0
            return 1.0

        @vf.setup(priority=2)
        async def prep(self, state):
            state["prepared"] = True

        async def env_response(self, messages, state, **kwargs):
            return [vf.UserMessage(content="again")]


    @vf.metric
    def exact(completion, answer) -> float:  # a plain function in the rubric's funcs: scored as listed
        return float(completion[-1]["content"] == answer)


    def load_environment():
        rows = [{"question": "Say a.", "answer": "a"}]
        return Echo(dataset=rows, rubric=vf.Rubric(funcs=[exact], weights=[1.0]), max_turns=1)
''')


def test_signal_decorators_on_v0_code_change_nothing_as_in_v0(tmp_path):
    """@vf.reward/@metric/@setup/@update/@advantage (0.1.14+) were "uses verifiers reward, setup ...:
    port it" TODOs. On v0 classes they did nothing (only verifiers.v1 discovers them): the migrated env
    keeps v0's rewards (the rubric's `exact` at its listed weight, no `bonus`) and the report says why."""
    path, report = _migrate(tmp_path, "echo", SIGNALS_0_1_14)
    notes = [e for e in report.entries if e.rule == "ENV014"]
    assert notes and all(e.status == "info" for e in notes) and "@reward, @setup" in notes[0].message
    trace = _score(_load(path), "a")
    assert not trace.errors, trace.errors
    assert {k: (v.score, v.weight) for k, v in trace.rewards.items()} == {"exact": (1.0, 1.0)}
    assert trace.reward == 1.0


def test_reasoning_gym_env_is_scored_by_the_env_its_arguments_built(tmp_path):
    """vf.ReasoningGymEnv (0.1.7+; "unknown environment class" before) runs at load time. A row's answer
    is an index into the generated dataset, so a row loaded with `--taskset.args` is scored by the env
    those arguments build (scored by the default env, the right reply would be checked against another
    puzzle: 0)."""
    rg = pytest.importorskip("reasoning_gym")
    source = (Path(__file__).parent / "migrate_corpus" / "v0" / "envs" / "reasoning_gym_env.py").read_text()
    path, report = _migrate(tmp_path, "rg_env", source)
    assert [e.rule for e in report.entries if "ReasoningGymEnv" in e.message] == ["ENV013"]
    args = {"gym": "arc_1d", "num_train_examples": 2, "num_eval_examples": 2, "seed": 3}
    gold = rg.create_dataset("arc_1d", size=4, seed=3)[2]["answer"]  # the first eval row is entry 2
    loaded = _load(path, {"args": args})
    trace = _score(loaded, f"<answer>{gold}</answer>")
    assert not trace.errors, trace.errors
    assert trace.rewards["check_answer_reward_func"].score == 1.0 and trace.reward == 1.0
    assert _score(_load(path, {"args": args}), "<answer>0</answer>").reward == 0.0


SANDBOX_0_1_14 = textwrap.dedent('''
    import verifiers as vf


    def made_file(completion) -> float:
        return float("made" in completion[-1]["content"])


    def load_environment(timeout: int = 2):
        rows = [{"question": "Make a file.", "answer": ""}]
        return vf.SandboxEnv(dataset=rows, rubric=vf.Rubric(funcs=[made_file]), max_turns=6,
                             docker_image="python:3.11-slim", timeout_per_command_seconds=timeout)
''')

PYTHON_0_1_14 = textwrap.dedent('''
    import verifiers as vf


    class MathPython(vf.PythonEnv):
        pass


    def correct(completion, answer) -> float:
        return float(answer in completion[-1]["content"])


    def load_environment():
        rows = [{"question": "What is 6 * 7? Use python.", "answer": "42"}]
        return MathPython(dataset=rows, rubric=vf.Rubric(funcs=[correct]), max_turns=6, pip_install_packages="")
''')


def _calls(*calls) -> list[dict]:
    """Scripted replies: one tool call per (name, arguments), then the final answer."""
    import json

    return [{"role": "assistant", "content": "", "tool_calls": [
        {"id": f"c{i}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}]}
        for i, (name, args) in enumerate(calls)]


class ScriptedMessages(Scripted):
    async def generate(self, request):
        from vf.engines.base import GenerateResult

        reply = self.replies.pop(0)
        return GenerateResult(message=reply if isinstance(reply, dict) else {"role": "assistant", "content": reply})


def test_sandbox_env_bash_runs_in_the_rollouts_runtime_and_answers_as_v0(tmp_path):
    """vf.SandboxEnv (0.1.5+) was "unknown environment class: check it", a multi-turn env with no tool:
    its `bash(command)` now runs in the rollout's vf runtime (the sandbox: the file lands in the rollout's
    own work dir, gone after it) and replies with v0's text, the timeout its timeout_per_command_seconds."""
    from vf.runner import EpisodeSpec, run_episode

    path, report = _migrate(tmp_path, "sbx", SANDBOX_0_1_14)
    assert [e.rule for e in report.entries if e.rule == "ENV015"] == ["ENV015"]
    loaded = _load(path)
    task = list(loaded.taskset.take(1))[0]
    assert [t["function"]["name"] for t in _tool_schemas(task)] == ["bash"]  # runtime is never the model's
    replies = _calls(("bash", {"command": "echo made > f.txt && cat f.txt && echo warn >&2"}),
                     ("bash", {"command": "true"}), ("bash", {"command": "sleep 20"}),
                     ("bash", {"command": "ls f.txt", "runtime": "host"})) + ["made it"]
    trace = asyncio.run(run_episode(task, EpisodeSpec(engine=ScriptedMessages(replies), model="m", env=loaded.env,
                                                      max_turns=8))).trace
    assert not trace.errors, trace.errors
    tool_replies = [m["content"] for m in trace.messages if m["role"] == "tool"]
    assert tool_replies[:3] == ["made\nstderr:\nwarn", "(no output)", "Error: Command timed out after 2s"]
    assert "unexpected arguments ['runtime']" in tool_replies[3]  # the model cannot aim it elsewhere
    assert trace.rewards["made_file"].score == 1.0
    assert not (tmp_path / "f.txt").exists() and not (Path.cwd() / "f.txt").exists()


def test_python_env_keeps_its_namespace_across_calls_as_v0s_repl(tmp_path):
    """vf.PythonEnv subclassed by the module: `python(code)` is a REPL whose names last the rollout,
    a trailing expression answers `Out[n]: ...`, an exception its traceback (v0's reply format)."""
    from vf.runner import EpisodeSpec, run_episode

    path, report = _migrate(tmp_path, "mp", PYTHON_0_1_14)
    loaded = _load(path)
    task = list(loaded.taskset.take(1))[0]
    assert [t["function"]["name"] for t in _tool_schemas(task)] == ["python"]  # PythonEnv hides bash
    replies = _calls(("python", {"code": "x = 6 * 7\nprint('set')"}), ("python", {"code": "x"}),
                     ("python", {"code": "1 / 0"}), ("python", {"code": "import sys; print(x, file=sys.stderr)"})) + ["42"]
    trace = asyncio.run(run_episode(task, EpisodeSpec(engine=ScriptedMessages(replies), model="m", env=loaded.env,
                                                      max_turns=8))).trace
    assert not trace.errors, trace.errors
    tool_replies = [m["content"] for m in trace.messages if m["role"] == "tool"]
    assert tool_replies[:2] == ["set", "Out[2]: 42"]
    assert tool_replies[2].startswith("Traceback") and tool_replies[2].rstrip().endswith("ZeroDivisionError: division by zero")
    assert tool_replies[3] == "stderr:\n42"  # the earlier cells ran again (quietly): x is still 42
    assert trace.rewards["correct"].score == 1.0


def _tool_schemas(task) -> list[dict]:
    from vf.taskset import task_toolsets
    from vf.toolset import tool_schema

    return [tool_schema(fn.__func__, name) for ts in task_toolsets(task) for name, fn in ts().tools().items()]


GYM_0_1_14 = textwrap.dedent('''
    import verifiers as vf
    from verifiers.envs.experimental.gym_env import EpisodicSumRubric


    class Guess:
        """A gym-style game: guess the number 0-9 (new gym API: reset -> (obs, info), 5-tuple steps)."""

        def __init__(self, tries: int = 3):
            self.tries = tries

        def reset(self, seed: int = 0):
            self.secret, self.left = seed % 10, self.tries
            return f"Guess my number (0-9), {self.tries} tries.", {}

        def step(self, action):
            self.left -= 1
            if action == self.secret:
                return "Correct!", 1.0, True, False, {"left": self.left}
            hint = "higher" if action < self.secret else "lower"
            return f"Wrong, go {hint}.", -0.1, False, self.left == 0, {"left": self.left}


    def load_environment(tries: int = 3):
        def won(state) -> float:
            return float(any(s.get("extras", {}).get("gym_info", {}).get("left", -1) >= 0 and s.get("reward") == 1.0
                             for s in state["trajectory"]))

        rubric = EpisodicSumRubric(weight=1.0)
        rubric.add_reward_func(won, weight=0.0)
        return vf.GymEnv(env_cls=Guess, env_kwargs={"tries": tries}, action_parser=int, rubric=rubric,
                         num_train_episodes=2, num_eval_episodes=2, seed=4, max_episode_steps=10)
''')


def test_gym_env_plays_each_row_s_game_and_sums_its_step_rewards(tmp_path):
    """vf.GymEnv (0.1.9+; "unknown environment class" before): rows are the games' first observations
    (eval rows: seeds 6, 7), each rollout resets its own game with the row's seed, every reply is an
    action, the step rewards stay on their trajectory steps (they were rebuilt away each turn) and
    v0's EpisodicSumRubric sums them; the rollout ends the turn after the game does, as 0.1.14's @stop.
    verifiers 0.1.14 itself (this module, `evaluate` against tests/openai_stub.py's `script` model with
    the same replies) gave the same three messages, 4 turns, reward 0.8 and won 1.0."""
    from vf.runner import EpisodeSpec, run_episode

    path, report = _migrate(tmp_path, "guess", GYM_0_1_14)
    assert [e.rule for e in report.entries if "GymEnv" in e.message] == ["ENV013"]
    loaded = _load(path)
    task = list(loaded.taskset.take(1))[0]
    assert task.data.answer == "6" and task.messages()[-1]["content"] == "Guess my number (0-9), 3 tries."
    trace = asyncio.run(run_episode(task, EpisodeSpec(engine=Scripted(["3", "7", "6", "unused", "unused"]), model="m",
                                                      env=loaded.env, max_turns=8))).trace
    assert not trace.errors, trace.errors
    users = [m["content"] for m in trace.messages if m["role"] == "user"][1:]
    assert users == ["Wrong, go higher.", "Wrong, go lower.", "Correct!\nEpisode already ended."]
    assert trace.num_turns == 4  # 0.1.14 asks for one more reply, then its @stop sees the game done
    assert trace.rewards["sum_step_rewards"].score == pytest.approx(0.8) and trace.reward == pytest.approx(0.8)
    assert (trace.rewards["won"].score, trace.rewards["won"].weight) == (1.0, 0.0)
    bad = asyncio.run(run_episode(task, EpisodeSpec(engine=Scripted(["six", "x", "x"]), model="m", env=loaded.env,
                                                    max_turns=8))).trace
    assert [m["content"] for m in bad.messages if m["role"] == "user"][-1].startswith("Action Parsing Error: invalid literal")
    assert bad.rewards["sum_step_rewards"].score == 0.0
    one_try = _load(path, {"args": {"tries": 1}})  # --taskset.args: the game the row's arguments made
    short = asyncio.run(run_episode(list(one_try.taskset.take(1))[0], EpisodeSpec(
        engine=Scripted(["3", "x", "x"]), model="m", env=one_try.env, max_turns=8))).trace
    assert [m["content"] for m in short.messages if m["role"] == "user"][1:] == ["Wrong, go higher.\nEpisode already ended."]


MCP_SERVER = textwrap.dedent('''
    import os

    from mcp.server.mcpserver import MCPServer

    server = MCPServer("notes")


    @server.tool()
    def shout(text: str) -> str:
        """Upper-case the text."""
        return text.upper() + os.environ.get("SUFFIX", "") + os.environ.get("OPENAI_API_KEY", "")


    if __name__ == "__main__":
        server.run("stdio")
''')

MCP_0_1_14 = textwrap.dedent('''
    import sys

    import verifiers as vf
    from verifiers.envs.experimental.mcp_env import MCPEnv

    SERVER = {"name": "notes", "command": sys.executable, "args": [__file__.replace("shout_env.py", "notes_server.py")],
              "env": {"SUFFIX": "!"}}


    def shouted(completion, answer) -> float:
        return float(answer in completion[-1]["content"])


    def load_environment():
        rows = [{"question": "Shout 'hi' with the tool.", "answer": "HI!"}]
        return MCPEnv(mcp_servers=[SERVER], dataset=rows, rubric=vf.Rubric(funcs=[shouted]), max_turns=4)
''')


def test_mcp_env_servers_are_started_once_per_run_and_their_tools_called(tmp_path, monkeypatch):
    """MCPEnv (0.1.9+; "unknown environment class" before): each of its stdio servers is a shared toolset
    of the migrated Taskset (`ToolsetConfig.command`), started for the run on the host as v0 did; the
    model calls its tools by their own names, the server gets its `env` on top of MCP's few defaults
    (no host secret: OPENAI_API_KEY stays out), and the reply reaches the trace."""
    from vf.runner import EpisodeSpec, run_episode, taskset_toolsets

    monkeypatch.setenv("OPENAI_API_KEY", "sk-host-secret")
    (tmp_path / "notes_server.py").write_text(MCP_SERVER)
    path, report = _migrate(tmp_path, "shout_env", MCP_0_1_14)
    assert [e.rule for e in report.entries if e.rule == "ENV016"] == ["ENV016"]
    loaded = _load(path)
    shared = taskset_toolsets(loaded)
    assert [type(ts).__name__ for ts in shared] == ["MCPServerTools"]
    spec = EpisodeSpec(engine=ScriptedMessages(_calls(("shout", {"text": "hi"})) + ["HI!"]), model="m", env=loaded.env,
                       max_turns=4, shared_toolsets=shared)
    trace = asyncio.run(run_episode(list(loaded.taskset.take(1))[0], spec)).trace
    assert not trace.errors, trace.errors
    assert [t["function"]["name"] for t in trace.tools] == ["shout"]
    assert [m["content"] for m in trace.messages if m["role"] == "tool"] == ["HI!"]
    assert trace.rewards["shouted"].score == 1.0


AGENT_0_1_14 = textwrap.dedent(r"""
    import shlex

    import verifiers as vf

    AGENT = '''
    import json, os, urllib.request
    body = {"model": os.environ["OPENAI_MODEL"], "messages": [{"role": "user", "content": os.environ["GREETING"]}]}
    request = urllib.request.Request(os.environ["OPENAI_BASE_URL"].rstrip("/") + "/chat/completions",
                                     data=json.dumps(body).encode(), headers={
                                         "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
                                         "Content-Type": "application/json"})
    reply = json.load(urllib.request.urlopen(request, timeout=60))
    print(reply["choices"][0]["message"]["content"], os.environ["OPENAI_TIMEOUT"])
    '''


    def answered(completion, answer) -> float:
        return float(any(answer in (m.get("content") or "") for m in completion if m["role"] == "assistant"))


    def load_environment():
        rows = [{"question": "unused: the agent knows its task", "answer": "pong"}]
        return vf.CliAgentEnv(run_command="python3 -c " + shlex.quote(AGENT), dataset=rows,
                              rubric=vf.Rubric(funcs=[answered]), environment_vars={"GREETING": "ping"})
""")


def test_cli_agent_env_runs_its_command_as_the_seats_program_harness(tmp_path):
    """vf.CliAgentEnv (0.1.9+; "unknown environment class" before): its run_command is the seat's default
    program harness, run in the rollout's runtime (the sandbox) with OPENAI_BASE_URL / OPENAI_API_KEY /
    OPENAI_MODEL at the interception server, v0's 3600 s client timeout and the env's environment_vars;
    the call it makes is a recorded turn, scored by the v0 rubric."""
    from vf.runner import EpisodeSpec, run_episode

    path, report = _migrate(tmp_path, "agent_env", AGENT_0_1_14)
    assert [e.rule for e in report.entries if e.rule == "ENV017"] == ["ENV017"]
    loaded = _load(path)
    assert loaded.env.config.agent.harness.id.endswith("agent_env.py:AgentEnvAgent")
    episode = asyncio.run(run_episode(list(loaded.taskset.take(1))[0], EpisodeSpec(
        engine=Scripted(["pong"]), model="m", env=loaded.env, max_turns=4)))
    trace = episode.trace
    assert not trace.errors and not episode.errors, (trace.errors, episode.errors)
    assert [m["content"] for m in trace.messages] == ["ping", "pong"]
    assert trace.rewards["answered"].score == 1.0


AGENT_HOOKS_0_1_14 = textwrap.dedent(r"""
    import tempfile
    from pathlib import Path

    import verifiers as vf

    from agent_env_data import AGENT


    def answered(completion, answer) -> float:
        return float(any(answer in (m.get("content") or "") for m in completion if m["role"] == "assistant"))


    class ScriptedAgentEnv(vf.CliAgentEnv):
        async def build_env_vars(self, state):
            env_vars = await super().build_env_vars(state)
            env_vars["GREETING"] = state["answer"].replace("pong", "ping")
            return env_vars

        async def post_sandbox_setup(self, state):
            with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as tmp:
                tmp.write(AGENT)
            await self.sandbox_client.upload_file(state["sandbox_id"], "agent.py", tmp.name)
            Path(tmp.name).unlink()
            done = await self.sandbox_client.execute_command(state["sandbox_id"], "python3 -c 'print(6 * 7)'")
            state["setup_said"] = done.stdout.strip()

        async def get_docker_image(self, state):
            return "python:3.12"


    def said_42(state) -> float:
        return float(state.get("setup_said") == "42")


    def load_environment():
        rows = [{"question": "unused: the agent knows its task", "answer": "pong"}]
        return ScriptedAgentEnv(run_command="python3 agent.py", dataset=rows,
                                rubric=vf.Rubric(funcs=[answered, said_42]))
""")


def test_cli_agent_subclass_sandbox_hooks_run_with_a_sandbox_client_on_the_runtime(tmp_path, monkeypatch):
    """A CliAgentEnv subclass's build_env_vars and post_sandbox_setup (flagged "vf does not call" before)
    run before the agent: `self.sandbox_client.upload_file` puts the agent script in the rollout's
    sandbox, `execute_command` runs there, the variable build_env_vars adds reaches the agent, and what
    the hook wrote on the v0 state reaches the rubric. get_docker_image stays a manual step."""
    from vf.runner import EpisodeSpec, run_episode

    (tmp_path / "agent_env_data.py").write_text(f"AGENT = {AGENT_0_1_14.split(chr(39) * 3)[1]!r}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "hooked_agent.py"
    path.write_text(AGENT_HOOKS_0_1_14)
    report = plan([path])
    manual = [e.message for e in report.entries if e.status == "manual"]
    assert len(manual) == 1 and "get_docker_image" in manual[0]
    assert sum("sandbox_client on the rollout's runtime" in e.message for e in report.entries) == 2
    apply(report)
    loaded = _load(path)
    episode = asyncio.run(run_episode(list(loaded.taskset.take(1))[0], EpisodeSpec(
        engine=Scripted(["pong"]), model="m", env=loaded.env, max_turns=4)))
    trace = episode.trace
    assert not trace.errors and not episode.errors, (trace.errors, episode.errors)
    assert [m["content"] for m in trace.messages] == ["ping", "pong"]
    assert trace.rewards["answered"].score == 1.0 and trace.rewards["said_42"].score == 1.0


SANDBOX_SETUP_0_1_14 = textwrap.dedent('''
    import verifiers as vf


    def found_it(completion) -> float:
        return float("seeded-42" in completion[-1]["content"])


    class SeededSandboxEnv(vf.SandboxEnv):
        async def setup_state(self, state, **kwargs):
            state = await super().setup_state(state, **kwargs)
            await self.sandbox_client.execute_command(state["sandbox_id"], "echo seeded-$((6 * 7)) > seed.txt")
            return state


    def load_environment():
        rows = [{"question": "What does seed.txt say?", "answer": ""}]
        return SeededSandboxEnv(dataset=rows, rubric=vf.Rubric(funcs=[found_it]), max_turns=4)
''')


def test_sandbox_env_setup_state_reaches_the_rollout_s_sandbox_through_sandbox_client(tmp_path):
    """A SandboxEnv subclass's setup_state seeds its sandbox with `self.sandbox_client.execute_command(
    state["sandbox_id"], ...)` (v0's client, not mapped before: AttributeError at setup). Now the id names
    the rollout's runtime, so the model's `bash` sees the file the setup made."""
    from vf.runner import EpisodeSpec, run_episode

    path, report = _migrate(tmp_path, "seeded", SANDBOX_SETUP_0_1_14)
    loaded = _load(path)
    task = list(loaded.taskset.take(1))[0]
    replies = _calls(("bash", {"command": "cat seed.txt"})) + ["it says seeded-42"]
    trace = asyncio.run(run_episode(task, EpisodeSpec(engine=ScriptedMessages(replies), model="m", env=loaded.env,
                                                      max_turns=4))).trace
    assert not trace.errors, trace.errors
    assert [m["content"] for m in trace.messages if m["role"] == "tool"] == ["seeded-42"]
    assert trace.rewards["found_it"].score == 1.0


def test_an_env_package_s_helper_module_loses_its_verifiers_import_too(tmp_path, monkeypatch):
    """A helper module of an env package (`from verifiers import XMLParser`, no load_environment) was
    left as it was: the migrated env still imported verifiers through it. Now its verifiers names go
    to vf.migrate.compat, so the env loads and scores without verifiers."""
    (tmp_path / "helpers.py").write_text(textwrap.dedent('''
        import verifiers as vf
        from verifiers import XMLParser

        PARSER = XMLParser(fields=["think", "answer"])


        def exact(completion, answer) -> float:
            return float(PARSER.parse_answer(completion) == answer)
    '''))
    (tmp_path / "pkg_env.py").write_text(textwrap.dedent('''
        import verifiers as vf

        from helpers import PARSER, exact


        def load_environment():
            return vf.SingleTurnEnv(dataset=[{"question": "2+2?", "answer": "4"}], parser=PARSER,
                                    rubric=vf.Rubric(funcs=[exact]))
    '''))
    report = plan([tmp_path])
    assert sorted(c.path.name for c in report.changes) == ["helpers.py", "pkg_env.py"]
    assert not [e for e in report.entries if e.status == "manual"], report.entries
    apply(report)
    assert "verifiers" not in (tmp_path / "helpers.py").read_text()
    monkeypatch.syspath_prepend(str(tmp_path))
    trace = _score(_load(tmp_path / "pkg_env.py"), "<think>sum</think><answer>4</answer>")
    assert not trace.errors and trace.rewards["exact"].score == 1.0


def test_a_v0_training_script_is_a_manual_step_not_a_silent_pass(tmp_path):
    """verifiers 0.1.0's examples/doublecheck.py (a training script, no load_environment): vf-migrate
    reported "0 files to change" and `--check` passed. Now its v0 names are rewritten or flagged, the
    training API with a TODO that points to vf-train, so `--check` fails until it is ported."""
    import subprocess
    import sys

    script = tmp_path / "doublecheck.py"
    script.write_text(textwrap.dedent('''
        import verifiers as vf
        from verifiers.utils import load_example_dataset

        dataset = load_example_dataset("math", "train", n=1000)
        vf_env = vf.DoubleCheckEnv(dataset=dataset, few_shot=[])
        model, tokenizer = vf.get_model_and_tokenizer("Qwen/Qwen2.5-1.5B-Instruct")
        trainer = vf.GRPOTrainer(model=model, processing_class=tokenizer, env=vf_env, args=vf.grpo_defaults(run_name="x"))
        trainer.train()
    '''))
    check = subprocess.run([sys.executable, "-m", "vf.commands.migrate", str(script), "--check"],
                           capture_output=True, text=True, check=False)
    assert check.returncode == 1 and "vf-train" in check.stdout + check.stderr
    report = plan([script])
    manual = sorted(e.message for e in report.entries if e.status == "manual")
    assert manual == ["uses verifiers DoubleCheckEnv", "uses verifiers GRPOTrainer, grpo_defaults",
                      "uses verifiers get_model_and_tokenizer"], manual
    new = report.changes[0].new
    assert "vf-train --taskset" in new and "import verifiers" not in new
    assert "from vf.migrate.compat import load_example_dataset" in new
