"""LLM judges: a model call through any OpenAI-compatible endpoint that scores a trace.

    class YesNoJudge(vf.Judge[float]):
        prompt = "Question: {question}\\nAnswer: {answer}\\nIs the answer correct? Say yes or no."

        async def score(self, task, trace) -> float:
            result = await self.evaluate(trace=trace, question=task.prompt_text, answer=trace.last_reply)
            return float(vf.parse_judge_choice(result.text, ("yes", "no")) == "yes")

A task's rewards may call a judge directly, or a run plugs judges into every task (verifiers'
`TaskConfig.judges`), on the command line as a JSON/YAML list:

    --env.taskset.task.judges '[{"id": "reference", "model": "gpt-4.1-mini", "base_url": "http://..."}]'

in an `@ eval.toml` as `[[env.taskset.task.judges]]` tables, in a `--config` YAML, or in code as
`vf.TaskConfig(judges=[vf.ReferenceJudgeConfig(...)])`. An id is a built-in (`reference`,
`rubric`, `decision`: vf.judges), `pkg.module:Class`, `path/file.py:Class`, or an installed
package exporting one Judge subclass in `__all__` (as in verifiers). Each entry is validated as
its judge's own config type when the config loads. Plugged judges run concurrently after the
task's rewards; each adds the reward `name` (default: its id, or for a `module:Class` id the
class name in snake case less `Judge`) with its `weight`; a judge returning a mapping adds one
reward per key.

Every call is recorded in `trace.info["judge_calls"]` (request, reply, parsed verdict, usage)
and its usage in `trace.extra_usage`, as verifiers records them. A judge that errors (its
endpoint fails, its reply has no verdict) is an error on the trace, its reward stays None and
the run goes on (the episode is redone by `--resume`): a judge failure is never scored against
the model.

Defaults that differ from verifiers (whose defaults point at Prime's hosted inference): with no
`base_url` a judge calls `$OPENAI_BASE_URL`, its key is read from `OPENAI_API_KEY`, its model is
`judge`; `decision` keeps verifiers' endpoint, model and `PRIME_API_KEY`. A transient endpoint
failure (429, 5xx, timeout) is retried once.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Generic, Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    FiniteFloat,
    SerializeAsAny,
    ValidationError,
    model_validator,
)
from typing_extensions import TypeVar

from vf.errors import ConfigError, EngineError, UsageError
from vf.imports import import_plugin
from vf.types import Usage, content_text, to_wire
from vf.utils.exports import exported_subclasses
from vf.utils.score import parse_judge_choice

if TYPE_CHECKING:
    from vf.engines.openai_client import OpenAIEngine

JudgeView = Literal["last_reply", "full_trace"]
"""What of the rollout a judge reads as `{response}`: the final reply, or the whole transcript."""


class ClientTimeout(BaseModel):
    """Seconds per phase of one HTTP request (verifiers' `timeout.*`); None waits indefinitely."""

    model_config = ConfigDict(extra="forbid")
    connect: float | None = Field(30.0, gt=0)
    read: float | None = Field(None, gt=0)
    write: float | None = Field(None, gt=0)
    pool: float | None = Field(None, gt=0)


class JudgeSampling(BaseModel):
    """Sampling for judge calls. Only what is set is sent (the endpoint's defaults otherwise);
    provider-specific keys pass through as top-level body fields, as verifiers sends them."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)
    temperature: float | None = None
    top_p: float | None = None
    reasoning_effort: str | None = None
    max_tokens: int | None = Field(None, validation_alias=AliasChoices("max_tokens", "max_completion_tokens"))

    @model_validator(mode="before")
    @classmethod
    def _flatten(cls, data: Any) -> Any:
        # one key per parameter: `extra_body` entries and `max_completion_tokens` fold in
        if not isinstance(data, dict):
            return data
        out: dict[str, Any] = {}
        for layer in (data.get("extra_body") or {}, data):
            layer = {k: v for k, v in layer.items() if k != "extra_body"}
            if "max_completion_tokens" in layer:
                layer.setdefault("max_tokens", layer.pop("max_completion_tokens"))
            out.update(layer)
        return out


class JudgeConfig(BaseModel):
    """A judge: its endpoint, model, prompt and how its verdict is weighted (verifiers' fields)."""

    model_config = ConfigDict(extra="forbid")

    id: str = ""
    """Which judge, when plugged: a built-in (`reference`, `rubric`, `decision`), `pkg.module:Class`,
    `path/file.py:Class`, or an installed package. Empty for a judge called from task code."""
    name: str = ""
    """Reward key (default: the id, or the class name for a `module:Class` id)."""
    weight: FiniteFloat = 1.0
    model: str = "judge"
    sampling: JudgeSampling = Field(default_factory=JudgeSampling)
    prompt: Path | None = None
    """File whose text replaces the judge's prompt template."""
    base_url: str | None = None
    """OpenAI-compatible endpoint (None = the OPENAI_BASE_URL environment variable)."""
    api_key_var: str = "OPENAI_API_KEY"
    """Environment variable holding the API key (the key itself is never saved)."""
    headers: dict[str, str] = Field(default_factory=dict)
    """Extra HTTP headers sent with every call."""
    headers_from_env: dict[str, str] = Field(default_factory=dict)
    """Header name → environment variable, read when calling (overrides `headers`)."""
    timeout: Annotated[float, Field(gt=0)] | ClientTimeout = 60.0
    """Seconds per call, or verifiers' per-phase form (`{connect, read, write, pool}`)."""

    @model_validator(mode="before")
    @classmethod
    def _none_strings(cls, data: Any) -> Any:
        # TOML has no null: "None" means None, as verifiers' configs read it
        if isinstance(data, dict):
            data = {k: (None if v == "None" else v) for k, v in data.items()}
        return data


Judges = list[SerializeAsAny[JudgeConfig]]
"""`TaskConfig.judges`: plugged judges, each serialised as its own config type."""


def usage_from_openai(usage: Any) -> Usage | None:
    """A chat completion's `usage` as verifiers counts it: cached input split out of `prompt_tokens`."""
    if not isinstance(usage, dict):
        return None
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    reasoning = (usage.get("completion_tokens_details") or {}).get("reasoning_tokens")
    return Usage(prompt_tokens=int(usage.get("prompt_tokens") or 0) - int(cached or 0),
                 completion_tokens=int(usage.get("completion_tokens") or 0),
                 cached_input_tokens=cached, reasoning_tokens=reasoning, cost=usage.get("cost"))


ParsedT = TypeVar("ParsedT", default=Any)
ConfigT = TypeVar("ConfigT", bound=JudgeConfig, default=JudgeConfig)


class JudgeResponse(BaseModel, Generic[ParsedT]):
    text: str
    parsed: ParsedT | None = None
    usage: Usage | None = None


def judge_question(task, question_field: str) -> str:
    """The `{question}` a judge sees: the task's prompt as text, or the named task field."""
    if not question_field:
        return task.prompt_text
    value = getattr(task, question_field, None)
    if value is None:
        raise ValueError(f"judge found no {question_field!r} field on the task; point `question_field` at "
                         "the task's question field, or leave it empty for the task prompt")
    return str(value)


def judge_response(trace, view: JudgeView) -> str:
    return trace.transcript if view == "full_trace" else trace.last_reply


def judge_verdict(text: str, choices: Sequence[str]) -> str:
    """The verdict label in a judge's reply; none is an error (a judge failure, not the model's)."""
    verdict = parse_judge_choice(text, choices)
    if verdict is None:
        raise ValueError(f"judge returned no {'/'.join(choices)} verdict: {text!r}")
    return verdict


def _client_headers(config: JudgeConfig) -> dict[str, str]:
    headers = dict(config.headers)
    for name, var in config.headers_from_env.items():
        if (value := os.environ.get(var)) is not None:
            headers[name] = value
    return headers


def _http_timeout(timeout: float | ClientTimeout):
    import httpx

    if isinstance(timeout, ClientTimeout):
        return httpx.Timeout(**timeout.model_dump())
    return timeout


def _schema_format(schema: type[BaseModel]) -> dict[str, Any]:
    """OpenAI structured output for `schema`, built as the openai SDK builds it."""
    from openai.lib._pydantic import to_strict_json_schema

    return {"type": "json_schema",
            "json_schema": {"name": schema.__name__, "schema": to_strict_json_schema(schema), "strict": True}}


class Judge(Generic[ParsedT, ConfigT]):
    prompt: str | None = None
    """Default prompt template (`{field}` placeholders), replaced by a config `prompt` file."""
    schema: type[BaseModel] | None = None
    """Set to ask for structured output: `JudgeResponse.parsed` is then the validated object."""
    config_class: type[JudgeConfig] | None = None
    """The config type, when not given as the generic parameter (`vf.Judge[float, MyConfig]`)."""

    def __init__(self, config: ConfigT | dict | None = None):
        config_type = judge_config_type(type(self))
        if not isinstance(config, config_type):  # a dict, or a plain JudgeConfig for a judge with its own fields
            raw = config.model_dump(exclude_unset=True) if isinstance(config, JudgeConfig) else (config or {})
            config = config_type(**raw)
        self.config: ConfigT = config  # type: ignore[assignment]
        if config.prompt is not None:
            self.prompt = Path(config.prompt).read_text(encoding="utf-8")

    @property
    def reward_name(self) -> str:
        return reward_key(type(self), self.config)

    def build_messages(self, **fields: Any) -> str | list:
        """The prompt template with this call's `{field}` placeholders filled in one pass (a value
        holding a literal `{answer}` is never re-filled; other braces stay as written)."""
        if self.prompt is None:
            raise ValueError(f"{type(self).__name__} has no `prompt`; set it or override build_messages")
        if not fields:
            return self.prompt
        pattern = re.compile(r"\{(" + "|".join(map(re.escape, fields)) + r")\}")
        return pattern.sub(lambda m: str(fields[m.group(1)]), self.prompt)

    async def score(self, task, trace) -> float | Mapping[str, float]:
        raise NotImplementedError(f"{type(self).__name__} implements no `score`, so it cannot be plugged via "
                                  "`taskset.task.judges`; implement `score` or call it from a task @reward")

    def parse(self, response: JudgeResponse) -> Any:
        return response.parsed if self.schema is not None else response.text

    def client(self, base_url: str | None = None) -> OpenAIEngine:
        """A fresh client for one call (closed by the caller): vf's OpenAI-compatible engine on the
        judge's endpoint, key, headers and timeouts."""
        from vf.engines.openai_client import OpenAIEngine

        url = base_url or self.config.base_url or os.environ.get("OPENAI_BASE_URL")
        if not url:
            raise ConfigError([f"judge {self.reward_name!r}: no base_url"],
                              hint="set base_url in its judge config, or OPENAI_BASE_URL")
        return OpenAIEngine(url, self.config.model, api_key_var=self.config.api_key_var,
                            timeout=_http_timeout(self.config.timeout), max_retries=1, max_connections=8,
                            headers=_client_headers(self.config))

    async def complete(self, messages: str | list, *, trace=None, schema: type[BaseModel] | None = None,
                       parse: Callable[[JudgeResponse], Any] | None = None, **sampling: Any) -> JudgeResponse:
        """One judge call. With `trace`, the exchange is recorded on it even when the reply is
        unusable (a refusal, no structured output, `parse` raising): it was billed."""
        wire = [{"role": "user", "content": messages}] if isinstance(messages, str) else [to_wire(m) for m in messages]
        headers = sampling.pop("extra_headers", None)
        sampling.pop("extra_query", None), sampling.pop("timeout", None)
        params = JudgeSampling.model_validate({**self.config.sampling.model_dump(exclude_unset=True),
                                               **JudgeSampling.model_validate(sampling).model_dump(exclude_unset=True)})
        body: dict[str, Any] = {"model": self.config.model, "messages": wire, **params.model_dump(exclude_none=True)}
        if schema is not None:
            body["response_format"] = _schema_format(schema)
        response: JudgeResponse | None = None
        client = self.client()
        try:
            data = await client.post_json(f"{client.base_url}/chat/completions", body, headers)
            message = _first_message(data, client.base_url)
            response = JudgeResponse(text=message.get("content") or "", usage=usage_from_openai(data.get("usage")))
            if schema is not None:
                if message.get("refusal") is not None:
                    raise RuntimeError(f"judge refused structured output: {message['refusal']}")
                try:
                    response.parsed = schema.model_validate_json(response.text) if response.text else None
                except ValidationError:
                    response.parsed = None
                if response.parsed is None:
                    raise RuntimeError("judge returned no parseable structured output")
            if parse is not None:
                response.parsed = parse(response)
            return response
        finally:
            await client.close()
            if trace is not None and response is not None:
                trace.record_judge_call(name=self.reward_name, request={"model": body["model"], "messages": wire},
                                        response=response)

    async def evaluate(self, *, trace=None, **fields: Any) -> JudgeResponse[ParsedT]:
        """`build_messages(**fields)` → one call → `parse`: the verdict in `.parsed`."""
        return await self.complete(self.build_messages(**fields), trace=trace, schema=self.schema, parse=self.parse)

    async def close(self) -> None:
        """Nothing to release (each call opens and closes its own client); kept for old callers."""


def _first_message(data: dict[str, Any], url: str) -> dict[str, Any]:
    choices = data.get("choices")
    message = choices[0].get("message") if isinstance(choices, list) and choices and isinstance(choices[0], dict) else None
    if not isinstance(message, dict) or not isinstance(message.get("content"), (str, list, type(None))):
        raise EngineError(f"malformed response from {url}: no choices[0].message", type="ProviderError")
    return {**message, "content": content_text(message.get("content"))}


# ---- plugging judges by config ------------------------------------------------------------------

BUILTIN = {
    "reference": "vf.judges.reference:ReferenceJudge",
    "rubric": "vf.judges.rubric:RubricJudge",
    "decision": "vf.judges.decision:DecisionJudge",
}


def reward_key(cls: type, config: JudgeConfig) -> str:
    """A judge's reward name: `name`, else a built-in's or package's id, else from the class name
    (`YesNoJudge` → `yes_no`)."""
    fallback = re.sub(r"(?<!^)(?=[A-Z])", "_", cls.__name__.removesuffix("Judge")).lower()
    return config.name or ("" if is_code_ref(config.id) else config.id) or fallback or "judge"


def is_code_ref(judge_id: str) -> bool:
    """`pkg.module:Class` or `path/file.py[:Class]`, as opposed to a built-in or package id."""
    return ":" in judge_id or judge_id.endswith(".py")


def judge_config_type(cls: type) -> type[JudgeConfig]:
    """A judge class's config type: its generic parameter (`Judge[float, MyConfig]`, through the
    MRO), else its `config_class`, else JudgeConfig."""
    for klass in cls.__mro__:
        for base in klass.__dict__.get("__orig_bases__", ()):
            for arg in getattr(base, "__args__", ()):
                if isinstance(arg, type) and issubclass(arg, JudgeConfig):
                    return arg
        if isinstance(klass.__dict__.get("config_class"), type):
            return klass.__dict__["config_class"]
    return JudgeConfig


def _exported_judge(module, judge_id: str) -> type:
    found = exported_subclasses(module, Judge)
    if len(found) != 1:
        raise ValueError(f"judge {judge_id!r}: module {module.__name__} exports {len(found)} Judge subclasses "
                         "(via `__all__`); a judge package exports exactly one")
    return found[0]


def judge_class(judge_id: Any) -> type[Judge]:
    """The Judge class an id names (see the module docstring); ValueError naming what was tried."""
    if not isinstance(judge_id, str) or not judge_id.strip():
        raise ValueError(f"each judges entry needs an `id`: a built-in ({', '.join(BUILTIN)}), "
                         f"pkg.module:Class, path/file.py:Class, or an installed package (got {judge_id!r})")
    spec = BUILTIN.get(judge_id.replace("-", "_").lower(), judge_id)  # ids normalise as verifiers imports them
    try:  # the plugin grammar every resolver shares (vf.imports.import_plugin); built-ins are ours
        found = import_plugin("judge", spec, trusted=spec is not judge_id)
    except (ModuleNotFoundError, FileNotFoundError) as e:
        raise ValueError(f"judge {judge_id!r} not found ({e}); built-ins: {', '.join(BUILTIN)}") from None
    except UsageError as e:
        raise ValueError(f"judge {judge_id!r}: {e}") from None
    if found is None:
        raise ValueError(f"judge {judge_id!r} not found; built-ins: {', '.join(BUILTIN)}")
    module, attr = found
    if attr is None:
        cls = _exported_judge(module, judge_id)
    elif (cls := getattr(module, attr, None)) is None:
        raise ValueError(f"judge {judge_id!r}: {module.__name__} has no {attr!r}")
    if not (isinstance(cls, type) and issubclass(cls, Judge)):
        raise ValueError(f"judge {judge_id!r} is not a vf.Judge subclass")  # noqa: TRY004 - pydantic reports ValueError
    return cls


def resolve_judges(entries: Sequence[Any]) -> list[JudgeConfig]:
    """`TaskConfig.judges` entries (dicts or configs) → each judge's own config type, validated;
    two entries with the same reward key are refused (one verdict would hide the other)."""
    resolved: list[JudgeConfig] = []
    for i, entry in enumerate(entries):
        if isinstance(entry, JudgeConfig) and entry.id and isinstance(entry, judge_config_type(judge_class(entry.id))):
            resolved.append(entry)
            continue
        raw = entry.model_dump(exclude_unset=True) if isinstance(entry, BaseModel) else entry
        if not isinstance(raw, Mapping):
            raise ValueError(f"judges[{i}]: an entry is a mapping with an `id`, got {type(raw).__name__}")  # noqa: TRY004
        config_type = judge_config_type(judge_class(raw.get("id")))
        try:
            resolved.append(config_type.model_validate(dict(raw)))
        except ValidationError as e:
            problems = "; ".join(f"{'.'.join(map(str, err['loc'])) or 'entry'}: "
                                 f"{err['msg'].removeprefix('Value error, ')}" for err in e.errors())
            raise ValueError(f"judges[{i}] ({raw.get('id')}): {problems}") from None
    for i, config in enumerate(resolved):
        if config.prompt is not None and not Path(config.prompt).is_file():
            raise ValueError(f"judges[{i}] ({config.id}): prompt file {str(config.prompt)!r} does not exist")
    keys = [reward_key(judge_class(c.id), c) for c in resolved]
    if dupes := sorted({k for k in keys if keys.count(k) > 1}):
        raise ValueError(f"judges entries share a reward key {dupes}; set a distinct `name` on each")
    return resolved


def load_judge(config: JudgeConfig | Mapping[str, Any]) -> Judge:
    if not isinstance(config, JudgeConfig):
        config = resolve_judges([config])[0]
    return judge_class(config.id)(config)


