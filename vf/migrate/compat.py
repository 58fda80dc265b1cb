"""Runtime shim for environments migrated from the v0 (legacy verifiers) API.

`vf-migrate` rewrites a v0 `load_environment()` module into a v1 taskset, but keeps the original
reward functions, parsers and `env_response` code unchanged. This module gives that code the v0
objects it was written against, with v0 semantics, so a migrated reward returns the same number
the v0 code gave for the same completion:

- `Parser`, `XMLParser`, `ThinkParser`: `parse`, `parse_answer`, `get_format_reward_func`,
  `get_assistant_messages` as in verifiers v0.
- `Rubric`: records `funcs`/`weights`/`parser` (and `add_reward_func`/`add_metric`); it scores
  nothing itself, the migrated Task's @vf.reward methods call `score()`.
- `SingleTurnEnv`, `MultiTurnEnv`, `ToolEnv`, `Environment`: record their constructor arguments
  (parser, rubric, max_turns, tools); a v0 `MultiTurnEnv` subclass keeps its `env_response` and
  `is_completed`, and `MultiTurnAdapter` runs them as a v1 `vf.Env`.
- `v0_args()` builds the arguments a v0 reward function named (`completion`, `prompt`,
  `answer`, `info`, `state`, `parser`, ...) from a v1 trace.

Nothing here imports torch or verifiers.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import re
from collections.abc import Callable, Iterable
from types import SimpleNamespace
from typing import Any, ClassVar

from pydantic import Field

from vf.env import Env
from vf.migrate import v0_api, v0_envs, v0_harbor, v0_judge
from vf.migrate.v0_api import (  # noqa: F401 - re-exported: migrated code names them here
    AssistantMessage,
    BrowserSandboxError,
    EmptyModelResponseError,
    Error,
    InfraError,
    InvalidModelResponseError,
    MissingKeyError,
    ModelError,
    OverlongPromptError,
    SandboxError,
    SystemMessage,
    TextMessage,
    ToolCall,
    ToolCallError,
    ToolError,
    ToolMessage,
    ToolParseError,
    TunnelError,
    UserMessage,
    advantage,
    cleanup,
    ensure_keys,
    metric,
    print_prompt_completions_sample,
    reward,
    run_cleanups,
    run_stops,
    setup,
    setup_logging,
    stop,
    stop_methods,
    teardown,
    trajectory,
    update,
)
from vf.migrate.v0_helpers import (  # noqa: F401 - re-exported: migrated imports name them here
    BOXED_SYSTEM_PROMPT,
    THINK_BOXED_SYSTEM_PROMPT,
    extract_boxed_answer,
    extract_hash_answer,
    load_dataset,
    load_example_dataset,
    math_answers_equal,
    python,
    strip_non_numeric,
)
from vf.migrate.v0_sandbox import (  # noqa: F401 - migrated envs subclass them
    CliAgentHarness,
    PythonTools,
    SandboxClient,
    SandboxTools,
    sandbox_setup,
)
from vf.taskset import State, Task, TaskConfig, TaskData, Taskset, TasksetConfig
from vf.taskset import reward as v1_reward
from vf.taskset import stop as v1_stop
from vf.toolset import SharedToolsetConfig, Toolset
from vf.trace import content_text

Messages = list[dict[str, Any]]

cache = functools.cache
"""Decorator for the generated `_v0_env()` builder: build the parser/rubric once per process."""


# ---- parsers (v0 semantics) --------------------------------------------------------------------


class Parser:
    """v0 `Parser(extract_fn)`: `parse(text)` applies `extract_fn`; `parse_answer` parses the last
    assistant message; its format reward is always 1.0."""

    def __init__(self, extract_fn: Callable[[str], Any] = lambda x: x, **kwargs: Any):
        self.extract_fn = extract_fn
        for key, value in kwargs.items():
            setattr(self, key, value)

    def parse(self, text: str) -> Any:
        return self.extract_fn(text)

    def get_assistant_messages(self, completion: Messages) -> Messages:
        return [m for m in completion if m.get("role") == "assistant"]

    def get_user_messages(self, completion: Messages) -> Messages:
        return [m for m in completion if m.get("role") == "user"]

    def get_system_messages(self, completion: Messages) -> Messages:
        return [m for m in completion if m.get("role") == "system"]

    def get_tool_messages(self, completion: Messages) -> Messages:
        return [m for m in completion if m.get("role") == "tool"]

    def parse_answer(self, completion: str | Messages) -> Any:
        if isinstance(completion, str):
            return self.parse(completion)
        messages = self.get_assistant_messages(completion)
        if not messages:
            return None
        return self.parse(_text(messages[-1].get("content")))

    def get_format_reward_func(self) -> Callable:
        def format_reward_func(completion, **kwargs) -> float:
            return 1.0

        return format_reward_func

    def example_reply(self, answer: str) -> str:
        """A reply in this parser's format whose answer is `answer` (vf-validate's probe)."""
        return answer


class ThinkParser(Parser):
    """v0 `ThinkParser`: the answer is the text after `</think>` ('' when there is no `</think>`);
    format reward = fraction of assistant messages shaped `<think>…</think>answer`."""

    def parse(self, text: str) -> Any:
        text = text.split("</think>")[-1].strip() if "</think>" in text else ""
        return self.extract_fn(text.strip())

    def get_format_reward_func(self) -> Callable:
        def follows_format(text: str) -> float:
            ok = (text.strip().startswith("<think>") and text.count("<think>") == 1
                  and text.count("</think>") == 1 and len(text.split("</think>")[-1]) > 0)
            return 1.0 if ok else 0.0

        def format_reward_func(completion, **kwargs) -> float:
            messages = self.get_assistant_messages(completion)
            return sum(follows_format(_text(m.get("content"))) for m in messages) / len(messages)

        return format_reward_func


    def example_reply(self, answer: str) -> str:
        return f"<think>\n...\n</think>\n{answer}"


class MaybeThinkParser(Parser):
    """v0 `MaybeThinkParser`: the answer is the text after the last `</think>` (the whole text
    when there is none); format reward as `Parser` (always 1.0)."""

    def parse(self, text: str) -> Any:
        return self.extract_fn(text.split("</think>")[-1].strip())


class XMLParser(Parser):
    """v0 `XMLParser(fields, answer_field)`; a field is a tag or a tuple of alternative tags."""

    def __init__(self, fields: list[str | tuple[str, ...]], answer_field: str = "answer", **kwargs: Any):
        super().__init__(**kwargs)
        self.answer_field = answer_field
        self._fields: list[tuple[str, list[str]]] = []
        for f in fields:
            alts = [f] if isinstance(f, str) else list(f)
            self._fields.append((alts[0], alts))

    def parse(self, text: str, strip: bool = True) -> SimpleNamespace:
        out: dict[str, str | None] = {}
        for _, alts in self._fields:
            for alt in alts:
                m = re.search(rf"<{alt}>\s*(.*?)\s*</{alt}>", text, re.DOTALL)
                out[alt] = (m.group(1).strip() if strip else m.group(1)) if m else None
        return SimpleNamespace(**out)

    def parse_answer(self, completion: str | Messages) -> str | None:
        texts = [completion] if isinstance(completion, str) else [
            _text(m.get("content")) for m in reversed(self.get_assistant_messages(completion))]
        for text in texts:
            value = getattr(self.parse(text), self.answer_field, None)
            if value is not None:
                return value
        return None

    def get_fields(self) -> list[str]:
        return [c for c, _ in self._fields]

    def example_reply(self, answer: str) -> str:
        return "\n".join(f"<{tag}>\n{answer if tag == self.answer_field else '...'}\n</{tag}>"
                         for tag, _ in self._fields)

    def get_format_str(self) -> str:
        """v0's format description: `<tag>\\n...\\n</tag>` per field (`<[ a | b ]>` for alternatives)."""
        parts = []
        for canonical, alts in self._fields:
            tag = f"[ {' | '.join(alts)} ]" if len(alts) > 1 else canonical
            parts.append(f"<{tag}>\n...\n</{tag}>")
        return "\n".join(parts)

    def get_format_reward_func(self) -> Callable:
        def format_reward_func(completion, **kwargs) -> float:
            messages = self.get_assistant_messages(completion)
            if not messages:
                return 0.0
            scores = []
            for msg in messages:
                content = _text(msg.get("content"))
                parsed, raw = self.parse(content), self.parse(content, strip=False)
                any_field, spacing, present = False, True, set()
                for i, (_, alts) in enumerate(self._fields):
                    for alt in alts:
                        if getattr(parsed, alt, None) is not None:
                            any_field = True
                            present.add(i)
                            if getattr(raw, alt, None) is None:
                                spacing = False
                        elif f"<{alt}>" in content or f"</{alt}>" in content:
                            present.add(i)
                score = 0.4 * len(present) / len(self._fields) if any_field else 0.0
                score += 0.2 if spacing else 0.0
                score += 0.2 if any(content.strip().startswith(f"<{a}>") for a in self._fields[0][1]) else 0.0
                score += 0.2 if any(content.strip().endswith(f"</{a}>") for a in self._fields[-1][1]) else 0.0
                scores.append(score)
            return sum(scores) / len(scores)

        return format_reward_func


_text = content_text  # v0 parsers read message content the same way traces do


# ---- rubric and environments (recorders) -------------------------------------------------------


class Rubric:
    """v0 `Rubric(funcs, weights, parser)`: records the functions in order (rewards and metrics).
    As in v0, a rubric without a parser has a plain `Parser()`: that is what its functions'
    `parser` argument gets (not the environment's parser)."""

    def __init__(self, funcs: list[Callable] | None = None, weights: list[float] | None = None,
                 parser: Parser | None = None, **kwargs: Any):
        self.funcs = list(funcs or [])
        self.weights = list(weights) if weights is not None else [1.0] * len(self.funcs)
        self.parser = parser if parser is not None else Parser()
        self.class_objects: dict[str, Any] = {}

    def entries(self) -> list[tuple[Callable, float, Rubric]]:
        """(function, weight, owning rubric) in v0's scoring order."""
        return [(f, w, self) for f, w in zip(self.funcs, self.weights)]

    def add_reward_func(self, func: Callable, weight: float = 1.0) -> None:
        self.funcs.append(func)
        self.weights.append(weight)

    def add_metric(self, func: Callable, weight: float = 0.0) -> None:
        self.add_reward_func(func, weight)

    def add_class_object(self, name: str, obj: Any) -> None:
        self.class_objects[name] = obj


class MathRubric(Rubric):
    """v0 `MathRubric`: the given functions, then `correct_answer` (weight 1.0): the parsed answer
    (by default: after `</think>`, inside the last `\\boxed{}`) checked by `math_answers_equal`."""

    def __init__(self, funcs: list[Callable] | None = None, weights: list[float] | None = None,
                 parser: Parser | None = None, timeout_seconds: float = 5, max_verify_chars: int = 50_000,
                 **kwargs: Any):
        parser = parser if parser is not None else MaybeThinkParser(
            extract_fn=functools.partial(extract_boxed_answer, strict=True))
        super().__init__(funcs=funcs, weights=weights, parser=parser)
        self.timeout_seconds, self.max_verify_chars = timeout_seconds, max_verify_chars
        self.add_reward_func(self.correct_answer)

    def correct_answer(self, parser: Parser, completion: Messages, answer: str, **kwargs: Any) -> float:
        response = parser.parse_answer(completion) or ""
        if len(response) > self.max_verify_chars:
            return 0.0
        return math_answers_equal(response, answer, int(self.timeout_seconds))


class ToolRubric(Rubric):
    """v0 `ToolRubric(tools=...)`: counts of tool calls (`total_tool_calls`, `<tool>_calls`) are
    metrics of weight 0 kept apart (`metric_funcs`), so `funcs` holds only what was added with
    `add_reward_func` and the total reward is v0's."""

    def __init__(self, tools: list[Callable] | None = None, parser: Parser | None = None, **kwargs: Any):
        super().__init__(funcs=kwargs.get("funcs"), weights=kwargs.get("weights"), parser=parser)
        self.tool_names = [getattr(t, "__name__", str(t)) for t in tools or []]
        self.metric_funcs = [self.total_tool_calls]

    @staticmethod
    def _calls(completion: Messages) -> list[str]:
        names = []
        for m in completion:
            for call in (m.get("tool_calls") or []) if m.get("role") == "assistant" else []:
                fn = call.get("function", {}) if isinstance(call, dict) else getattr(call, "function", None)
                names.append(fn.get("name") if isinstance(fn, dict) else getattr(fn, "name", ""))
        return names

    def total_tool_calls(self, completion: Messages, **kwargs: Any) -> float:
        return float(len(self._calls(completion)))


class RubricGroup(Rubric):
    """v0 `RubricGroup(rubrics)`: every member's functions in order, each with its own parser."""

    def __init__(self, rubrics: list[Rubric], **kwargs: Any):
        super().__init__(parser=kwargs.get("parser"))
        self.rubrics = list(rubrics)

    def entries(self) -> list[tuple[Callable, float, Rubric]]:
        return [e for r in self.rubrics for e in r.entries()] + super().entries()


JUDGE_PROMPT = """Given a ground truth answer \
and a response, determine if the response is correct.

Question:
```
{question}
```

Ground truth answer:
```
{answer}
```

Response:
```
{response}
```

Respond either "yes" or "no" only."""
"""v0 JudgeRubric's default judge prompt (placeholders {question}, {answer}, {response})."""


class JudgeRubric(Rubric):
    """v0 `JudgeRubric` of every 0.1.x release: records the judge settings; the migrated Task builds
    a `vf.Judge` from them. Its reward functions reach that judge as v0's did, as their `judge`
    argument or through `rubric.judge(prompt, completion, answer, state)`, plain (0.1.2) or
    awaited (0.1.3+) (see vf.migrate.v0_judge). `judge_sampling_args` go with every call;
    `judge_reward_func` is 0.1.0-0.1.1's built-in reward (yes → 1.0, no → 0.0, else the number the
    judge replied)."""

    def __init__(self, judge_client: Any = None, judge_model: str = "gpt-4.1-nano", judge_prompt: str = JUDGE_PROMPT,
                 parser: Parser | None = None, judge_sampling_args: dict[str, Any] | None = None, **kwargs: Any):
        super().__init__(parser=parser, **{k: v for k, v in kwargs.items() if k in ("funcs", "weights")})
        self.judge_client, self.judge_model, self.judge_prompt = judge_client, judge_model, judge_prompt
        self.judge_sampling_args = dict(judge_sampling_args or {})
        self.class_objects = {"judge_client": judge_client, "judge_model": judge_model, "judge_prompt": judge_prompt,
                              "judge_sampling_args": self.judge_sampling_args}

    def judge(self, prompt: Any, completion: Any, answer: Any, state: Any = None, **kwargs: Any) -> Any:
        call = v0_judge.current("rubric.judge()")
        return call.ask(prompt, completion, answer, state, kwargs, asynchronous=v0_judge.caller_is_async())

    def judge_reward_func(self, prompt: Any, completion: Any, answer: Any, **kwargs: Any) -> float:
        """verifiers 0.1.0-0.1.1: the judge's verdict on the whole last reply."""
        text = v0_judge.current("judge_reward_func").ask(prompt, completion, answer, kwargs.get("state"), {},
                                                          asynchronous=False)
        if "yes" in text.lower():
            return 1.0
        if "no" in text.lower():
            return 0.0
        return float(text)


JudgeCall = v0_judge.JudgeCall
OpenAI, AsyncOpenAI = v0_judge.JudgeClient, v0_judge.AsyncJudgeClient  # a judge env's own clients


def judge_arguments(**fields: str) -> Any:
    """A validator for a generated TasksetConfig: the load_environment() arguments the v0 judge
    client was built from (`judge_base_url`, `judge_model`, ...; `fields` maps a JudgeConfig key
    to its argument) reach the task's judge config when a run sets them
    (`--taskset.judge-base-url URL`), unless that run also sets `--taskset.task.judge.KEY`."""
    from pydantic import model_validator

    def bind(self: Any) -> Any:
        task = self.task
        explicit = task.judge.model_fields_set if "judge" in task.model_fields_set else set()
        changes = {key: getattr(self, arg) for key, arg in fields.items()
                   if arg in self.model_fields_set and key not in explicit}
        if changes:
            self.task = task.model_copy(update={"judge": task.judge.model_copy(update=changes)})
        return self

    return model_validator(mode="after")(bind)


class Environment:
    """Records what a v0 environment was built with; the dataset lives in the taskset's load()."""

    DEFAULT_MAX_TURNS = 10

    def __init__(self, parser: Parser | None = None, rubric: Rubric | None = None,
                 max_turns: int | None = None, tools: list[Callable] | None = None, **kwargs: Any):
        self.parser = parser if parser is not None else Parser()
        self.rubric = rubric if rubric is not None else Rubric(parser=self.parser)
        self.max_turns = max_turns if max_turns is not None else self.DEFAULT_MAX_TURNS
        self.tools = list(tools or [])
        for key, value in kwargs.items():
            setattr(self, key, value)

    def score(self, index: int, task: Any, trace: Any, state: Any, **extra: Any) -> Any:
        """Call the rubric's `index`-th function the v0 way, with its own rubric's parser as
        `parser` (a coroutine, which the v1 hook runner awaits). `extra` adds arguments (a
        JudgeRubric's `judge`, which also answers `rubric.judge(...)` while the function runs)."""
        fn, _, owner = self.rubric.entries()[index]
        judge = extra.get("judge")
        if isinstance(judge, JudgeCall):  # v0's judge() parses with its own rubric's parser, and its sampling
            judge.parser = owner.parser
            judge.sampling = dict(getattr(owner, "judge_sampling_args", None) or {})
        available = {**v0_args(task, trace, state), "parser": owner.parser, **owner.class_objects, **extra}
        return _scored(fn, pick(fn, available), judge if isinstance(judge, JudgeCall) else None)

    async def setup_state(self, state: dict, **kwargs: Any) -> dict:
        return state

    def update_tool_args(self, tool_name: str, tool_args: dict, messages: Messages, state: dict,
                         **kwargs: Any) -> dict:
        return tool_args


async def _scored(fn: Callable, kwargs: dict[str, Any], judge: JudgeCall | None = None) -> float:
    """`fn(**kwargs)` as a float; while it runs, `judge` is the current judge (`rubric.judge`).

    A function that raises, or returns something that is no number, raises here: the hook runner
    records it as an error on the trace, and the episode counts as errored. (v0 logged it and
    scored 0, so a broken reward looked like a wrong answer; that silent zero is what this avoids.)"""
    token = v0_judge.CURRENT.set(judge)
    try:
        out = fn(**kwargs)
        if inspect.isawaitable(out):
            out = await out
    finally:
        v0_judge.CURRENT.reset(token)
    try:
        return float(out)
    except (TypeError, ValueError):
        raise TypeError(f"reward function {getattr(fn, '__name__', fn)!r} returned {out!r}, not a number") from None


def probe(env: Environment, data: Any) -> Any:
    """vf-validate's reply for a migrated v0 task (`vf.validate.Probe`): the row's answer in the
    env parser's format. It is scored without a model (a v0 judge answers itself) and must not
    make a reward function raise; it need not earn full reward (v0 had no gold reply)."""
    from vf.validate import Probe

    answer = str(getattr(data, "answer", "") or "") or "..."
    return Probe(env.parser.example_reply(answer))


class SingleTurnEnv(Environment):
    DEFAULT_MAX_TURNS = 1


class _Verdict:
    """A bool that can also be awaited (v0 changed is_completed from sync to async)."""

    def __init__(self, value: bool):
        self.value = bool(value)

    def __bool__(self) -> bool:
        return self.value

    def __await__(self):
        yield from ()
        return self.value


class MultiTurnEnv(Environment):
    """Base for migrated v0 multi-turn envs: keeps `env_response` / `is_completed`.
    v0 default max_turns: -1 (no limit)."""

    DEFAULT_MAX_TURNS = -1

    def is_completed(self, messages: Messages | dict | None = None, state: dict | None = None, **kwargs: Any):
        """v0: done once `max_turns` (> 0) model turns ran, or (0.1.8+) once one of the env's
        `@stop` methods fires. Usable as v0 code calls it: `super().is_completed(messages, state)`
        plain (0.1.0-0.1.2) or awaited, or `is_completed(state)` (0.1.8+)."""
        if state is None and isinstance(messages, dict):  # 0.1.8+: is_completed(state)
            messages, state = None, messages
        state = state if state is not None else {}
        if self.max_turns > 0 and state.get("turn", 0) >= self.max_turns:
            state["is_completed"] = True
            return _Verdict(True)
        if not stop_methods(self):
            return _Verdict(False)
        return run_stops(self, state)  # @stop methods may be async: an awaitable verdict

    def env_response(self, messages: Messages, state: dict, **kwargs: Any):
        raise NotImplementedError


class ToolEnv(MultiTurnEnv):
    DEFAULT_MAX_TURNS = 10


class StatefulToolEnv(ToolEnv):
    """v0 `StatefulToolEnv`: `add_tool(fn, args_to_skip=[...])` and `update_tool_args` fill the
    hidden arguments of a tool call from the state; the migrated Toolset calls `tool_args`."""

    def add_tool(self, tool: Callable, args_to_skip: list[str] | None = None) -> None:
        self.tools.append(tool)

    def remove_tool(self, tool: Callable) -> None:
        self.tools = [t for t in self.tools if t is not tool]


@dataclasses.dataclass
class MCPServerConfig:
    """v0 MCPEnv's server entry (0.1.9+): a stdio MCP server program."""

    name: str
    command: str
    args: list[str] | None = None
    env: dict[str, str] | None = None
    description: str = ""


class MCPServerTools(Toolset):
    """The tools one v0 MCPEnv server lists, under their own names (v0 registered them unprefixed)."""

    TOOL_PREFIX = None


class MCPEnv(ToolEnv):
    """v0 `MCPEnv(mcp_servers=[...])` (0.1.9+): its servers, recorded; `toolsets()` gives one shared
    toolset per server (`SharedToolsetConfig.command`), which vf starts once per run on the host, as
    v0 did, and whose tools every rollout calls. v0 ran the servers for the env's lifetime; the
    migrated Taskset's `toolsets()` runs them for the run's."""

    DEFAULT_MAX_TURNS = 10

    def __init__(self, mcp_servers: Iterable[MCPServerConfig | dict] = (), **kwargs: Any):
        self.mcp_servers = [s if isinstance(s, MCPServerConfig) else MCPServerConfig(
            name=s["name"], command=s["command"], args=s.get("args"), env=s.get("env"),
            description=s.get("description", "")) for s in mcp_servers]
        super().__init__(**kwargs)

    def toolsets(self) -> list[Toolset]:
        return [MCPServerTools(SharedToolsetConfig(command=[s.command, *(s.args or [])], command_env=s.env))
                for s in self.mcp_servers]


class SandboxMixin:
    """v0's `SandboxMixin` (0.1.9+; the sandbox client of 0.1.5+'s SandboxEnv): `self.sandbox_client`
    on the rollout's runtime, named by the v0 state's `sandbox_id` (vf.migrate.v0_sandbox)."""

    sandbox_client = SandboxClient()

    def with_retry(self, fn: Callable) -> Callable:
        """v0 retried sandbox calls against a remote service; a vf runtime is local."""
        return fn


class SandboxEnv(SandboxMixin, StatefulToolEnv):
    """v0 `SandboxEnv` (0.1.5+): its options, recorded; its `bash` tool runs in the rollout's runtime
    (`SandboxTools`, which follows `timeout_per_command_seconds` and `environment_vars`). The
    container options (`docker_image`, `cpu_cores`, ...) are the run's runtime settings in vf
    (`--env.agent.runtime.*`); `setup_state` gets `state["sandbox_id"]` for `self.sandbox_client`."""

    timeout_per_command_seconds: int = 30
    environment_vars: dict[str, str] | None = None
    docker_image: str = "python:3.11-slim"


class CliAgentEnv(SandboxMixin, MultiTurnEnv):
    """v0 `CliAgentEnv(run_command=...)` (0.1.9+): its options, recorded; the seat runs `run_command`
    as a program harness (`CliAgentHarness`), every model call it makes intercepted and recorded.
    Container options are the run's `--env.agent.runtime.*`; `build_env_vars` and
    `post_sandbox_setup` run before the agent (`sandbox_setup`)."""

    run_command: str = ""
    environment_vars: dict[str, str] | None = None
    docker_image: str = "python:3.11-slim"

    async def build_env_vars(self, state: dict) -> dict[str, str]:
        """Every command's variables: `environment_vars` (v0 also set OPENAI_*, which the harness sets)."""
        return dict(self.environment_vars or {})

    async def post_sandbox_setup(self, state: dict) -> None:
        """v0's hook once the sandbox exists, before the agent starts (`sandbox_setup` runs it)."""


class HarborEnv(CliAgentEnv):
    """v0 `HarborEnv(run_command, dataset_path, ...)` (0.1.9+): its rows are the Harbor task folders
    (`v0_harbor.load_tasks`), its rubric v0's `harbor_reward` (the score the task's tests wrote).
    `HarborTaskset` runs it: see vf.migrate.v0_harbor. The MCP options of 0.1.11+ are recorded;
    a task that declares MCP servers is an error at setup."""

    def __init__(self, run_command: str, dataset_path: str | Any, tasks: list[str] | None = None,
                 agent_workdir: str = "/app", docker_image: str = "python:3.11-slim", **kwargs: Any):
        self.dataset_path, self.task_names, self.agent_workdir = dataset_path, tasks, agent_workdir
        super().__init__(run_command=run_command, docker_image=docker_image,
                         rubric=Rubric(funcs=[self.harbor_reward], weights=[1.0]), **kwargs)
        self.dataset = self.load_harbor_dataset()

    def load_harbor_dataset(self) -> list[dict[str, Any]]:
        return v0_harbor.load_tasks(self.dataset_path, self.task_names)

    async def build_env_vars(self, state: dict) -> dict[str, str]:
        return v0_harbor.variables(self, state.get("info") or {})

    async def post_sandbox_setup(self, state: dict) -> None:
        await v0_harbor.prepare(self, state.get("info") or {}, self.sandbox_client.runtime(state["sandbox_id"]))

    async def harbor_reward(self, state: dict, **kwargs: Any) -> float:
        return state.get("reward", 0.0)


class PythonEnv(SandboxEnv):
    """v0 `PythonEnv` (0.1.5+): a persistent Python REPL tool (`PythonTools`) instead of bash."""

    pip_install_packages: str = "numpy sympy scipy"


async def setup_state(env: Environment, task: Any, trace: Any, state: Any, runtime: Any = None) -> None:
    """Run a v0 env's `setup_state` on this episode's v0 state dict (v1: `Task.setup`); with the
    rollout's `runtime` (a SandboxEnv's), `state["sandbox_id"]` names it for `self.sandbox_client`."""
    st = v0_state(task, trace, state)
    if runtime is not None:
        st["sandbox_id"] = SandboxClient.attach(runtime)
    out = env.setup_state(st)
    if inspect.isawaitable(out):
        out = await out
    if isinstance(out, dict) and out is not st:
        st.update(out)


def tool_args(env: Environment, tool_name: str, arguments: dict[str, Any], state: Any,
              trace: Any = None) -> dict[str, Any]:
    """The arguments a v0 StatefulToolEnv would call `tool_name` with: the model's, plus what
    `update_tool_args` adds from the rollout's v0 state."""
    st = getattr(state, "v0_state", None)
    if st is None:
        st = {}
        try:
            state.v0_state = st
        except (AttributeError, ValueError):
            pass
    messages = trace.messages if trace is not None else []
    out = env.update_tool_args(tool_name, dict(arguments), messages, st)
    return dict(out) if isinstance(out, dict) else dict(arguments)


async def group_score(env: Environment, index: int, name: str, weight: float, task: Any, episode: Any) -> None:
    """A v0 group reward (plural arguments: `completions`, `answers`, `states`, ...) over the
    traces of one episode; each trace gets its score as reward `name` (v1: `Env.finalize`)."""
    traces = list(episode.traces)
    states = [getattr(t, "state", None) for t in traces]
    singles = [v0_args(task.data if hasattr(task, "data") else task, t, s) for t, s in zip(traces, states)]
    plural = {"prompts": [a["prompt"] for a in singles], "completions": [a["completion"] for a in singles],
              "answers": [a["answer"] for a in singles], "infos": [a["info"] for a in singles],
              "states": [a["state"] for a in singles], "tasks": [a["task"] for a in singles]}
    fn, _, owner = env.rubric.entries()[index]
    scores = fn(**pick(fn, {**plural, "parser": owner.parser, **owner.class_objects}))
    if inspect.isawaitable(scores):
        scores = await scores
    for trace, score in zip(traces, scores):
        record = getattr(trace, "record_reward", None)
        if record is not None:
            record(name, float(score), weight=weight)
        else:
            from vf.trace import RewardValue

            trace.rewards[name] = RewardValue(score=float(score), weight=weight)


# ---- v0 arguments from a v1 trace --------------------------------------------------------------


def split_messages(trace: Any) -> tuple[Messages, Messages]:
    """(prompt, completion): the messages before the first model reply, and the rest."""
    branch = [trace.nodes[i] for i in trace.branch()]
    first = next((i for i, n in enumerate(branch) if n.sampled or n.message.get("role") == "assistant"),
                 len(branch))
    return [dict(n.message) for n in branch[:first]], [dict(n.message) for n in branch[first:]]


class AttrDict(dict):
    """A dict whose keys also read as attributes: v0 reward functions read a tool call the way the
    openai client returned it (`call.function.name`), v1 traces store it as JSON."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


def _attrs(value: Any) -> Any:
    if isinstance(value, dict):
        return AttrDict({k: _attrs(v) for k, v in value.items()})
    if isinstance(value, list):
        return [_attrs(v) for v in value]
    return value


def v0_state(task: Any, trace: Any, state: Any) -> dict[str, Any]:
    """The v0 `state` dict for this episode, kept on the v1 State so env_response's writes persist:
    the keys of every 0.1.x release (`prompt`, `completion`, `answer`, `info`, `turn`, `responses`;
    0.1.8+: `trajectory`, `input`, `is_completed`, `final_env_response`, ...). Messages read as
    dicts and as attributes (0.1.11+ code writes `message.content`)."""
    saved = getattr(state, "v0_state", None) if state is not None else None
    if saved is None:
        saved = {}
        if state is not None:
            try:
                state.v0_state = saved
            except (AttributeError, ValueError):
                pass
    prompt, completion = split_messages(trace)
    prompt, completion = _attrs(prompt), _attrs(completion)
    answer, info = getattr(task, "answer", ""), getattr(task, "info", {}) or {}
    example_id, name = getattr(task, "idx", 0), getattr(task, "name", None) or "default"
    saved.update(prompt=prompt, completion=completion, answer=answer, info=info, example_id=example_id,
                 task=name, turn=trace.num_turns)
    saved["responses"] = [m for m in completion if m.get("role") == "assistant"]  # one per model reply
    trace_id = str(getattr(trace, "id", "") or "")
    steps = trajectory(prompt, completion, trace_id)
    for before, step in zip(saved.get("trajectory") or [], steps):  # what v0 code wrote on its steps persists
        step.update({k: before[k] for k in ("reward", "advantage", "extras") if k in before})  # (GymEnv's step rewards)
    saved["trajectory"] = steps
    saved["input"] = {"prompt": prompt, "answer": answer, "info": info, "example_id": example_id, "task": name}
    saved.setdefault("trajectory_id", trace_id)
    for key, value in (("is_completed", False), ("is_truncated", False), ("error", None), ("final_env_response", None),
                       ("reward", None), ("metrics", None), ("timing", {})):
        saved.setdefault(key, value)
    return saved


def v0_args(task: Any, trace: Any, state: Any, **extra: Any) -> dict[str, Any]:
    """Everything a v0 reward function could name."""
    st = v0_state(task, trace, state)
    return {"prompt": st["prompt"], "completion": st["completion"], "answer": st["answer"],
            "info": st["info"], "state": st, "task": st["task"], "example_id": st["example_id"], **extra}


def pick(fn: Callable, available: dict[str, Any]) -> dict[str, Any]:
    """The subset of `available` that `fn` names (all of it when fn takes **kwargs)."""
    params = inspect.signature(fn).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return dict(available)
    return {k: v for k, v in available.items() if k in params}


# ---- dataset rows ------------------------------------------------------------------------------


def rows(dataset: Iterable[dict[str, Any]] | None, data_class: type, system_prompt: str | None = None,
         few_shot: Messages | None = None) -> Iterable[Any]:
    """v0 dataset rows → TaskData: `question` (str) or `prompt` (messages), `answer`, `info`
    (dict or JSON string). Other columns are ignored, as v0 did."""
    if callable(dataset) and not hasattr(dataset, "__iter__"):
        dataset = dataset()  # v0 accepted a dataset builder (a function returning the dataset)
    if dataset is None:
        return
    if isinstance(dataset, dict) and "train" in dataset:  # load_dataset(...) without a split: its train split
        dataset = dataset["train"]
    fields = getattr(data_class, "model_fields", {})
    for row in dataset:
        row = dict(row)
        kw: dict[str, Any] = {}
        if row.get("prompt") is not None:
            prompt = [dict(m) for m in row["prompt"]] if not isinstance(row["prompt"], str) else row["prompt"]
        else:
            prompt = row.get("question")
        if few_shot:
            prompt = [*few_shot, *([{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt)]
        kw["prompt"] = prompt
        if system_prompt and not (isinstance(prompt, list) and prompt and prompt[0].get("role") == "system"):
            kw["system_prompt"] = system_prompt
        if "answer" in fields and row.get("answer") is not None:
            kw["answer"] = str(row["answer"])
        if "info" in fields and row.get("info") is not None:
            info = row["info"]
            kw["info"] = json.loads(info) if isinstance(info, str) else dict(info)
        yield data_class(**kw)


# ---- multi-turn adapter ------------------------------------------------------------------------


class MultiTurnAdapter(Env):
    """Runs a v0 `MultiTurnEnv`'s `is_completed` / `env_response` as a v1 Env.

    Subclasses set `v0_env` to a zero-argument callable returning the v0 env instance."""

    v0_env: Callable[[], MultiTurnEnv]

    async def run(self, task, agent) -> None:
        await agent.turn()
        while not agent.done:
            messages, final = await self._step(task.data, agent.trace, agent.state)
            if not messages:
                agent.finish("env_done")
                break
            for m in messages[:-1]:
                agent.add(m)
            # v0 0.1.0-0.1.7 checked is_completed(messages, state) before every model call, so an
            # env_response that ends the game (e.g. "correct") is added and no reply is asked for;
            # 0.1.8+ ends there only through state["final_env_response"] (its @stop methods run
            # before env_response, next round)
            if final or (not stop_methods(self._v0(task.data)) and await self._completed(
                    agent.trace.messages + [messages[-1]], task.data, agent.trace, agent.state)):
                agent.add(messages[-1])
                agent.finish("env_done")
                break
            await agent.turn(messages[-1])

    async def respond(self, task, trace, state):
        messages = await self.next_messages(task, trace, state)
        return messages[-1] if messages else None

    def _v0(self, task: Any) -> MultiTurnEnv:
        """The v0 env: the one the row's `--taskset.args` built (`V0Data.v0_args`), else the default."""
        args = getattr(task, "v0_args", None)
        return type(self).v0_env(args) if args else type(self).v0_env()

    async def _completed(self, messages, task, trace, state) -> bool:
        env = self._v0(task)
        done = env.is_completed(messages, v0_state(task, trace, state))
        if inspect.isawaitable(done):
            done = await done
        return bool(done)

    async def next_messages(self, task, trace, state) -> Messages | None:
        return (await self._step(task, trace, state))[0]

    async def _step(self, task, trace, state) -> tuple[Messages | None, bool]:
        """(the env's next messages, whether they end the rollout): None once it is completed;
        0.1.8+'s `state["final_env_response"]` replaces what env_response returned and ends it."""
        env = self._v0(task)
        messages = trace.messages
        if await self._completed(messages, task, trace, state):
            return None, False
        st = v0_state(task, trace, state)
        out = env.env_response(messages, st)
        if inspect.isawaitable(out):
            out = await out
        if isinstance(out, tuple):  # older v0: (messages, state)
            out, new_state = out
            if isinstance(new_state, dict) and new_state is not st:
                st.update(new_state)
        final = st.get("final_env_response") is not None
        if final:
            out = st["final_env_response"]
        if isinstance(out, (dict, str)):
            out = [out]
        return [({"role": "user", "content": m} if isinstance(m, str) else dict(m)) for m in out or []], final


# ---- EnvGroup, TextArenaEnv: run load_environment() itself ------------------------------------


class EnvGroup(Environment):
    """v0 `EnvGroup(envs, env_names)`: one dataset, the members' rows in order, each row's
    `info["env_id"]` naming its member (as v0 0.1.x routed it); a row is scored by its member's
    rubric alone, so its reward is that member's reward."""

    def __init__(self, envs: list[Environment], env_names: list[str] | None = None, **kwargs: Any):
        names = list(env_names) if env_names is not None else [f"env_{i}" for i in range(len(envs))]
        self.env_map = dict(zip(names, envs))
        super().__init__(**kwargs)
        self.dataset = [self._routed(r, n) for n, e in self.env_map.items() for r in _listed(getattr(e, "dataset", None))]
        evals = [(n, _listed(getattr(e, "eval_dataset", None))) for n, e in self.env_map.items()]
        self.eval_dataset = [self._routed(r, n) for n, rs in evals for r in rs] or None

    def _routed(self, row: dict[str, Any], name: str) -> dict[str, Any]:
        env = self.env_map[name]
        info = row.get("info")
        info = json.loads(info) if isinstance(info, str) else dict(info or {})
        out = {**row, "info": {**info, "env_id": name}}
        if getattr(env, "system_prompt", None) and out.get("prompt") is None:  # each member's own prompt
            out["prompt"] = [{"role": "system", "content": env.system_prompt},
                             {"role": "user", "content": out.get("question", "")}]
        return out

    def member(self, data: Any) -> Environment:
        return self.env_map[(getattr(data, "info", None) or {}).get("env_id")]


def _listed(dataset: Any) -> list[dict[str, Any]]:
    if callable(dataset) and not hasattr(dataset, "__iter__"):
        dataset = dataset()
    return [dict(r) for r in dataset] if dataset is not None else []


def TextArenaEnv(game: str = "Wordle-v0", **kwargs: Any) -> Environment:
    """v0 `TextArenaEnv(game=...)`: Wordle-v0 is played by vf (vf.migrate.textarena); another
    textarena game is a clear error (vf does not wrap the textarena package)."""
    from vf.migrate.textarena import make

    return make(game, **kwargs)


class ReasoningGymEnv(SingleTurnEnv):
    """v0 `ReasoningGymEnv(gym, ...)` (0.1.7+): reasoning-gym's generated rows (vf.migrate.v0_envs) and
    v0's rubric: the generator's `score_answer` on the parser's answer (`<answer>` by default), then
    the parser's format reward at weight 0."""

    def __init__(self, gym: str | list[str | dict], num_train_examples: int = 1000, num_eval_examples: int = 100,
                 system_prompt: str | None = None, parser: Parser | None = None, seed: int = 0, **kwargs: Any):
        self.gym, self.seed = gym, seed
        self.num_train_examples, self.num_eval_examples = num_train_examples, num_eval_examples
        self.rg_dataset = rg_dataset = v0_envs.reasoning_gym_dataset(gym, num_train_examples + num_eval_examples, seed)
        train, evals = v0_envs.reasoning_gym_rows(rg_dataset, num_train_examples)
        parser = parser or XMLParser(fields=["answer"])
        rubric = Rubric(parser=parser)

        async def check_answer_reward_func(completion: Messages, answer: str, **kwargs: Any) -> float:
            entry = rg_dataset[int(answer)]  # a row's answer is its entry's index
            response = str(parser.parse_answer(completion)).strip()
            return rg_dataset.score_answer(answer=response, entry=entry)

        rubric.add_reward_func(check_answer_reward_func)
        rubric.add_reward_func(parser.get_format_reward_func(), weight=0.0)
        if system_prompt is None:
            system_prompt = v0_envs.reasoning_gym()[2]["default"]
        super().__init__(parser=parser, rubric=rubric, dataset=train, eval_dataset=evals, system_prompt=system_prompt,
                         **kwargs)


def sum_step_rewards(state: dict) -> float:
    """v0 GymEnv's reward: the game's step rewards, summed over the rollout's trajectory."""
    return float(sum(float(step.get("reward", 0.0) or 0.0) for step in state.get("trajectory", [])))


class EpisodicSumRubric(Rubric):
    def __init__(self, weight: float = 1.0, **kwargs: Any):
        super().__init__(funcs=[sum_step_rewards], weights=[weight], **kwargs)


class GymEnv(MultiTurnEnv):
    """v0 `GymEnv` (0.1.9+; 0.1.14's code): a gym-style game (`env_cls` with `reset(seed=)` and `step(action)`),
    one episode per row (vf.migrate.v0_envs.gym_rows). Each rollout resets its own game with the
    row's seed; every model reply is parsed into an action (`action_parser`) and stepped, the
    step's reward kept on its trajectory step; the rollout stops once the game is done, and the
    default rubric sums the step rewards."""

    def __init__(self, env_cls: Callable[..., Any], env_kwargs: dict[str, Any] | None = None,
                 action_parser: Callable[[str], Any] | None = None, obs_to_text: Callable[[Any], str] | None = None,
                 num_train_episodes: int = 1000, num_eval_episodes: int = 20, max_episode_steps: int | None = None,
                 seed: int = 0, system_prompt: str | None = None, few_shot: list[dict] | None = None,
                 parser: Parser | None = None, rubric: Rubric | None = None, message_type: str = "chat"):
        self.env_cls, self.env_kwargs = env_cls, dict(env_kwargs or {})
        self.action_parser = action_parser or (lambda x: x)
        self.obs_to_text_fn = obs_to_text
        self.num_train_episodes, self.num_eval_episodes, self.seed = num_train_episodes, num_eval_episodes, seed
        train, evals = v0_envs.gym_rows(env_cls, self.env_kwargs, self.obs_to_text, num_train_episodes,
                                        num_eval_episodes, seed)
        super().__init__(parser=parser, rubric=rubric or EpisodicSumRubric(), max_turns=max_episode_steps or 1000,
                         dataset=train, eval_dataset=evals or None, system_prompt=system_prompt, few_shot=few_shot,
                         message_type=message_type)

    def obs_to_text(self, obs: Any) -> str:
        return self.obs_to_text_fn(obs) if self.obs_to_text_fn else str(obs)

    def wrap_response(self, text: str) -> Messages:
        return [UserMessage(content=text)]

    async def env_response(self, messages: Messages, state: dict, **kwargs: Any) -> Messages:
        if "gym_env" not in state:
            env = self.env_cls(**self.env_kwargs)
            env.reset(seed=int(state["answer"]))
            state["gym_env"], state["gym_done"] = env, False
        env = state["gym_env"]
        raw = self.parser.parse_answer(messages)
        if raw is None:
            last = state["trajectory"][-1]["completion"]
            raw = str(last[-1].get("content", "")) if isinstance(last, list) and last else str(last)
        try:
            action = self.action_parser(raw)
        except Exception as e:  # noqa: BLE001 - v0 ended the game with the parser's error as the reply
            state["gym_done"] = True
            state["trajectory"][-1]["reward"] = 0.0
            return self.wrap_response(f"Action Parsing Error: {e}")
        obs, step_reward, term, trunc, info = v0_envs.normalize_step(env.step(action))
        state["trajectory"][-1]["reward"] = step_reward
        state["trajectory"][-1]["extras"]["gym_info"] = info
        state["gym_done"] = term or trunc
        text = self.obs_to_text(obs)
        return self.wrap_response(f"{text}\nEpisode already ended." if state["gym_done"] else text)

    @stop
    async def is_done(self, state: dict) -> bool:
        return state.get("gym_done", False)

    @cleanup
    async def cleanup_env(self, state: dict) -> None:
        env = state.pop("gym_env", None)
        if env is not None and getattr(env, "close", None) is not None:
            env.close()


class V0Data(TaskData):
    """A v0 row: prompt, answer, info."""

    answer: str = ""
    info: dict = Field(default_factory=dict)
    v0_args: dict | None = None
    """The load_environment() arguments the row was built with (None: its defaults; kept off the
    row hash then): scoring rebuilds the env with them, so a row is scored by the rubric of the
    env that made it (a ReasoningGymEnv's answer is an index into its own generated dataset)."""


class V0Config(TasksetConfig):
    """`args`: keyword arguments of the v0 load_environment(); `split`: "eval" (its eval_dataset,
    the train dataset when it has none) or "train"."""

    args: dict[str, Any] = Field(default_factory=dict)
    split: str = "eval"


class V0Task(Task[V0Data, State, TaskConfig]):
    """Scores a row with the v0 rubric of the environment that owns it (an EnvGroup's member)."""

    v0_env: ClassVar[Callable[..., Environment]]

    def _owner(self) -> Environment:
        env = type(self).v0_env(self.data.v0_args)
        return env.member(self.data) if isinstance(env, EnvGroup) else env

    def validate(self):
        """v0 had no gold reply: vf-validate scores a probe reply (`probe`)."""
        return probe(self._owner(), self.data)

    @v1_stop
    def v0_max_turns(self, trace) -> bool:
        limit = self._owner().max_turns
        return limit > 0 and trace.num_turns >= limit

    @v1_reward(name="v0_rubric")
    async def v0_rubric(self, task, trace, state) -> dict[str, float]:
        """Every v0 function of the owner's rubric, under its own name and weight; the hook
        itself reports nothing (an empty mapping drops its name)."""
        return await self._rubric(task, trace, state)

    async def _rubric(self, task, trace, state) -> dict[str, float]:
        env = self._owner()
        failed = []
        for i, (fn, weight, _) in enumerate(env.rubric.entries()):
            name = getattr(fn, "__name__", f"reward_{i}")
            try:
                score = await env.score(i, task, trace, state)
            except Exception as e:  # noqa: BLE001 - the others are still scored; the trace errors below
                failed.append(f"{name}: {type(e).__name__}: {e}")
                continue
            trace.record_reward(name, score, weight=weight)
        if failed:  # an error on the trace (not a 0 that looks like a wrong answer)
            raise RuntimeError("v0 reward function(s) raised: " + "; ".join(failed))
        return {}


class V0Taskset(Taskset[V0Task, V0Config]):
    """The v1 taskset of a v0 module whose environment vf-migrate keeps building at run time
    (RUNTIME_ENVS of vf.migrate.python_env): a subclass sets `v0_load = staticmethod(load_environment)`."""

    v0_load: ClassVar[Callable[..., Environment]]
    v0_task: ClassVar[type[V0Task]] = V0Task

    def __init_subclass__(cls, **kwargs: Any):
        super().__init_subclass__(**kwargs)
        if "v0_load" not in cls.__dict__:
            return
        env_for = functools.partial(built_env, cls.v0_load)
        cls._task = type(f"{cls.__name__}Task", (cls.v0_task,), {"v0_env": staticmethod(env_for)})
        if getattr(cls, "v0_multi_turn", False):  # env_response / is_completed of the row's env too
            cls.ENV = type(f"{cls.__name__}Env", (MultiTurnAdapter,), {"v0_env": staticmethod(env_for)})

    @classmethod
    def task_class(cls) -> type[Task]:
        return getattr(cls, "_task", V0Task)

    def load(self):
        args = dict(self.config.args)
        env = built_env(type(self).v0_load, args)
        evals = getattr(env, "eval_dataset", None)
        dataset = evals if self.config.split == "eval" and evals is not None else getattr(env, "dataset", None)
        for row in rows(dataset, V0Data, system_prompt=getattr(env, "system_prompt", None),
                        few_shot=getattr(env, "few_shot", None)):
            yield self.row(env, row.model_copy(update={"v0_args": args}) if args else row)

    def row(self, env: Environment, row: V0Data) -> V0Data:
        """A loaded row, as the taskset keeps it (HarborTaskset adds the task's image)."""
        return row


def built_env(load: Callable[..., Environment], args: dict | None = None) -> Environment:
    """`load(**args)`, built once per argument set per process (a taskset's rows, their scoring
    and a HarborAgent all use the same env)."""
    return _built(load, json.dumps(args or {}, sort_keys=True))


@functools.cache
def _built(load: Callable[..., Environment], args_json: str) -> Environment:
    return load(**json.loads(args_json))


class HarborTask(V0Task):
    """A Harbor task folder's row: /task and the agent's workdir before the agent, the task's
    tests after it; v0's rubric then reads the score they wrote (vf.migrate.v0_harbor)."""

    async def setup(self, task, trace, state, runtime) -> None:
        await sandbox_setup(self._owner(), v0_state(task, trace, state), runtime)

    @v1_reward(name="v0_rubric")
    async def v0_rubric(self, task, trace, state, runtime) -> dict[str, float]:
        score, report = await v0_harbor.run_tests(self.data.info, runtime)
        trace.info["harbor"] = report
        v0_state(task, trace, state)["reward"] = score  # v0's post_rollout, which harbor_reward reads
        return await self._rubric(task, trace, state)


class HarborTaskset(V0Taskset):
    """A migrated module whose env is a v0 HarborEnv (vf.migrate.v0_harbor); its ENV is the
    module's one seat, which runs a HarborAgent."""

    v0_task = HarborTask

    def row(self, env: Environment, row: V0Data) -> V0Data:
        return row.model_copy(update={"image": row.info.get("docker_image") or env.docker_image})


class HarborAgent(CliAgentHarness):
    """The v0 HarborEnv's run_command as a program harness, in the agent's workdir; a subclass
    sets `v0_load = staticmethod(load_environment)` (the row's arguments pick the env)."""

    v0_load: ClassVar[Callable[..., Environment]]

    def v0(self, data: Any) -> Environment:
        return built_env(type(self).v0_load, getattr(data, "v0_args", None))


# v0 type aliases used in annotations of migrated code.
ChatMessage = dict[str, Any]
State = dict[str, Any]
Info = dict[str, Any]
SamplingArgs = dict[str, Any]
RewardFunc = Callable[..., Any]
IndividualRewardFunc = GroupRewardFunc = RewardFunc
Message = ChatMessage
ChatMessages = list[ChatMessage]
MessageType = str
ModelResponse = Any
RolloutInput = TrajectoryStep = dict[str, Any]

SUPPORTED = {"Parser", "XMLParser", "ThinkParser", "MaybeThinkParser", "Rubric", "JudgeRubric", "MathRubric",
             "ToolRubric", "RubricGroup", "Environment", "SingleTurnEnv", "MultiTurnEnv", "ToolEnv",
             "StatefulToolEnv", "Messages", "ChatMessage", "State", "Info", "SamplingArgs", "RewardFunc",
             "BOXED_SYSTEM_PROMPT", "THINK_BOXED_SYSTEM_PROMPT", "extract_boxed_answer", "extract_hash_answer",
             "strip_non_numeric", "load_example_dataset", "python", "EnvGroup", "TextArenaEnv", "ReasoningGymEnv",
             "SandboxEnv", "PythonEnv", "GymEnv", "EpisodicSumRubric", "MCPEnv", "MCPServerConfig",
             "CliAgentEnv", "HarborEnv",
             "stop", "cleanup", "teardown", "UserMessage", "SystemMessage", "AssistantMessage", "ToolMessage",
             "TextMessage", "ToolCall", "Message", "ChatMessages", "MessageType", *v0_api.INERT_SIGNALS,
             "ModelResponse", "GroupRewardFunc", "IndividualRewardFunc", "RolloutInput", "TrajectoryStep",
             *v0_api.ERRORS, *v0_api.HELPERS}
"""The v0 names this shim provides; any other `verifiers` name is flagged by vf-migrate."""
