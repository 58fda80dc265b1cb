"""The built-in tasksets: gold replies earn full reward, wrong ones don't, generation is seeded,
and the multi-turn (wordle) and tool-use (calculator) tasksets work end to end."""

from __future__ import annotations

import asyncio
import sys

import pytest
from conftest import json_out

from vf.engines.base import GenerateRequest, GenerateResult, Usage
from vf.errors import UsageError
from vf.loading import builtin_ids, load_taskset
from vf.runner import EpisodeSpec, run_episode
from vf.validate import score_reply, validate_task, validate_taskset

IDS = builtin_ids() + ["reasoning-gym:countdown", "reasoning-gym:basic_arithmetic"]
N = 20


def run(coro):
    return asyncio.run(coro)


def test_builtins_are_the_expected_set():
    assert set(builtin_ids()) >= {"alphabet-sort", "arithmetic", "calculator", "reasoning-gym",
                                  "reverse-text", "wordle"}


@pytest.mark.parametrize("taskset_id", [i for i in IDS if i != "swe-mini"])
def test_gold_replies_earn_full_reward(taskset_id):
    # swe-mini's gold check is a patch run in a sandbox per task: tests/test_swe_mini.py
    loaded = load_taskset(taskset_id, {"size": N})
    report = run(validate_taskset(loaded))
    assert len(report.checks) == N
    assert report.ok, [c.reason for c in report.failures][:3]
    # a gold reply must earn 1.0; a runtime check (swe-mini: the gold patch) is a True verdict
    assert all(c.reward is None or c.reward == pytest.approx(1.0) for c in report.checks)


@pytest.mark.parametrize("taskset_id", IDS)
def test_a_wrong_reply_earns_less(taskset_id):
    loaded = load_taskset(taskset_id, {"size": 3})
    for task in loaded.taskset.tasks():
        episode = run(score_reply(task, "I have no idea.", loaded.env))
        assert episode.ok
        assert episode.reward < 1.0


@pytest.mark.parametrize("taskset_id", IDS)
def test_generation_is_seeded(taskset_id):
    def hashes(seed):
        return [t.data.hash for t in load_taskset(taskset_id, {"size": 5, "seed": seed}).taskset.tasks()]

    assert hashes(0) == hashes(0)
    assert hashes(0) != hashes(1)
    assert len(set(hashes(0))) == 5


def test_validate_task_reports_a_wrong_gold():
    from vf.environments.arithmetic import ArithmeticData, ArithmeticTask

    class Broken(ArithmeticTask):
        def validate(self):
            return f"\\boxed{{{self.data.answer + 1}}}"

    data = ArithmeticData(prompt="What is 2 + 3?", expression="2 + 3", answer=5)
    assert run(validate_task(ArithmeticTask(data))) == (True, 1.0, "gold reply earns full reward")
    ok, reward, reason = run(validate_task(Broken(data)))
    assert (ok, reward) == (False, 0.0)
    assert "correct=0" in reason


# ---- reply parsing -----------------------------------------------------------------------------


def test_boxed_number_parsing():
    from vf.environments.arithmetic import evaluate, last_boxed, parse_number

    assert last_boxed("so \\boxed{1} no, \\boxed{\\text{1,234}}.") == "\\text{1,234}"
    assert parse_number(last_boxed("\\boxed{\\text{1,234}}")) == 1234
    assert parse_number("$-7$") == -7
    assert parse_number("12.0.") == 12
    assert parse_number("twelve") is None
    assert last_boxed("\\boxed{12") is None
    assert evaluate([2, 3, 4, 5], ["+", "*", "-"]) == 2 + 3 * 4 - 5


def test_alphabet_sort_partial_credit():
    from vf.environments.alphabet_sort import parse_list, position_score

    gold = ["adam", "bea", "carl", "dora"]
    assert position_score(parse_list("<sorted>Adam, Bea, Dora, Carl</sorted>"), gold) == 0.5
    assert position_score(parse_list("<sorted>Adam, Bea, Carl</sorted>"), gold) == 0.75
    assert position_score(parse_list("adam, bea, carl, dora, eve"), gold) == 0.8


def test_wordle_feedback_marks_repeated_letters_like_wordle():
    from vf.environments.wordle import feedback, words

    assert feedback("deals", "ideal") == "YYYYX"
    assert feedback("eerie", "ideal") == "YXXYX"  # only one E in the secret: one Y
    assert feedback("llama", "hello") == "YYXXX"
    assert feedback("ideal", "ideal") == "GGGGG"
    assert len(words()) >= 200 and all(len(w) == 5 and w.isalpha() for w in words())


# ---- wordle end to end ---------------------------------------------------------------------------


class PlaysGuesses:
    """A model stand-in: replies with fixed texts in order and records what it was shown."""

    name = "plays-guesses"
    supports_tokens = False

    def __init__(self, replies):
        self.replies = list(replies)
        self.seen = []

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        self.seen.append([dict(m) for m in request.messages])
        return GenerateResult(message={"role": "assistant", "content": self.replies[len(self.seen) - 1]},
                              usage=Usage(prompt_tokens=1, completion_tokens=1))

    async def close(self):
        pass


def wordle_game(replies, max_guesses=6):
    from vf.environments.wordle import WordleData, WordleTask

    loaded = load_taskset("wordle", {"size": 1})
    task = WordleTask(WordleData(id="w", prompt="Guess the secret word.", answer="ideal", max_guesses=max_guesses))
    engine = PlaysGuesses(replies)
    episode = run(run_episode(task, EpisodeSpec(engine=engine, model="m", env=loaded.env, max_turns=8)))
    return episode.trace, engine


def test_wordle_game_feedback_and_rewards():
    trace, engine = wordle_game(["hello", "<guess>lead</guess>", "<guess>deals</guess>",
                                 "<guess>eerie</guess>", "<guess>IDEAL</guess>"])
    users = [m["content"] for m in trace.messages if m["role"] == "user"]
    fmt = "Invalid guess: reply with one 5-letter word inside <guess></guess> tags, e.g. <guess>crane</guess>."
    assert users == [
        "Guess the secret word.",
        f"{fmt} (5 guesses left)",
        f"{fmt} (4 guesses left)",
        "DEALS -> Y Y Y Y X (3 guesses left)",
        "EERIE -> Y X X Y X (2 guesses left)",
    ]
    assert len(engine.seen) == 5 and engine.seen[-1][-1]["content"] == users[-1]
    assert trace.stop_condition == "solved"
    assert trace.rewards["solved"].score == 1.0 and trace.rewards["solved"].weight == 0.8
    assert trace.rewards["efficiency"].score == pytest.approx(2 / 6)
    assert trace.reward == pytest.approx(0.8 + 0.2 * 2 / 6)
    assert trace.metrics["num_guesses"] == 5


def test_wordle_game_out_of_guesses():
    trace, engine = wordle_game(["<guess>crane</guess>", "<guess>crane</guess>", "<guess>crane</guess>"],
                                max_guesses=3)
    users = [m["content"] for m in trace.messages if m["role"] == "user"]
    assert users[1:] == ["CRANE -> X X Y X Y (2 guesses left)", "CRANE -> X X Y X Y (1 guess left)"]
    assert trace.stop_condition == "out_of_guesses"
    assert trace.reward == 0.0
    assert trace.metrics["num_guesses"] == 3
    assert len(engine.seen) == 3


# ---- calculator end to end (real HTTP to the scripted OpenAI-compatible stub) -------------------


def test_calculator_episode_calls_the_tool_over_http(stub):
    from vf.engines.openai_client import OpenAIEngine

    loaded = load_taskset("calculator", {"size": 1, "operations": ["add"], "seed": 3})
    task = list(loaded.taskset.take(1))[0]

    async def go(url):
        engine = OpenAIEngine(base_url=url, model="calc", max_retries=0, timeout=10)
        try:
            return await run_episode(task, EpisodeSpec(engine=engine, model="calc", env=loaded.env))
        finally:
            await engine.close()

    before = len(stub.requests)
    episode = run(go(stub.url))
    sent_tools = stub.requests[before]["tools"]
    trace = episode.trace
    assert episode.ok, trace.errors
    tool_msgs = [m for m in trace.messages if m["role"] == "tool"]
    assert [(m["name"], m["content"]) for m in tool_msgs] == [("add", str(task.data.answer))]
    assert trace.last_reply == f"\\boxed{{{task.data.answer}}}"
    assert trace.reward == 1.0
    assert trace.metrics["tool_calls"] == 1
    assert sorted(t["function"]["name"] for t in sent_tools) == ["add", "divide", "multiply", "subtract"]
    assert sent_tools[0]["function"]["parameters"]["required"] == ["a", "b"]


def test_vf_eval_calculator_cli(tmp_path, stub, cli):
    proc = cli("vf-eval", "calculator", "-m", "calc", "--base-url", stub.url, "-n", "3",
               "-o", str(tmp_path / "run"), "--json", "--taskset.operations", "[add]", timeout=60)
    assert proc.returncode == 0, proc.stderr
    summary = json_out(proc)
    assert summary["num_episodes"] == 3 and summary["num_errors"] == 0
    assert summary["mean_reward"] == 1.0
    assert summary["rewards"] == {"correct": 1.0}
    assert summary["metrics"] == {"tool_calls": 1.0}
    assert len((tmp_path / "run" / "traces.jsonl").read_text().splitlines()) == 3


# ---- reasoning-gym errors ----------------------------------------------------------------------


def test_reasoning_gym_unknown_dataset_is_a_usage_error(tmp_path, cli):
    with pytest.raises(UsageError) as err:
        list(load_taskset("reasoning-gym:countdwn", {"size": 2}).taskset.take(1))
    assert "no dataset 'countdwn'" in err.value.message and "reasoning-gym:countdown" in err.value.hint
    proc = cli("vf-eval", "reasoning-gym:nope", "-n", "1", "--base-url", "http://127.0.0.1:9/v1",
               "-o", str(tmp_path / "r"), timeout=60)
    assert proc.returncode == 2
    assert "no dataset 'nope'" in proc.stderr and "Traceback" not in proc.stderr


def test_reasoning_gym_missing_package_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # what `import` sees when it is absent
    with pytest.raises(UsageError) as err:
        list(load_taskset("reasoning-gym:chain_sum", {"size": 2, "seed": 12345}).taskset.take(1))
    assert "pip install reasoning-gym" in err.value.hint
