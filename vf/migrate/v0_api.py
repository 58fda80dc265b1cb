"""The parts of the verifiers 0.1.8+ API that v0 environment classes are written against, besides
the core classes in `compat`: message types, the `@stop` / `@cleanup` / `@teardown` decorators,
and the rollout `trajectory` of the v0 state.

- `UserMessage`, `SystemMessage`, `AssistantMessage`, `ToolMessage`, `TextMessage`, `ToolCall`
  (0.1.11+): pydantic models in v0 that read both as attributes and as dict keys. Here they are
  dicts with the role filled in (what `env_response` returns goes into the trace as it is) that
  also read as attributes.
- `@stop` (0.1.8+): a method `(self, state) -> bool` (sync or async) that ends the rollout; all
  of an env's stop methods run before each model call, highest `priority` first, then by name.
  `@cleanup` methods run once the rollout stopped; `@teardown` ones belong to the env's lifetime
  (kept, never called: vf builds the v0 env once per process and drops it at exit).
- `trajectory(prompt, completion)`: 0.1.8+'s `state["trajectory"]`, one step per model reply
  (`prompt`: the messages the model saw, `completion`: its reply), rebuilt from the v1 trace.

Each mirrors verifiers 0.1.14, so v0 code reads what it read there.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any


class _Message(dict):
    """A v0 typed message: a dict (role, content, ...) whose keys also read as attributes."""

    ROLE = ""

    def __init__(self, content: Any = None, **fields: Any):
        super().__init__(role=fields.pop("role", self.ROLE), content=content, **fields)

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name: str, value: Any) -> None:
        self[name] = value

    def model_dump(self, **kwargs: Any) -> dict[str, Any]:
        return dict(self)


class SystemMessage(_Message):
    ROLE = "system"

    @classmethod
    def from_path(cls, path: Any) -> SystemMessage:
        from pathlib import Path

        return cls(content=Path(path).read_text(encoding="utf-8"))


class UserMessage(_Message):
    ROLE = "user"


class AssistantMessage(_Message):
    ROLE = "assistant"


class ToolMessage(_Message):
    ROLE = "tool"

    def __init__(self, content: Any = None, tool_call_id: str = "", **fields: Any):
        super().__init__(content, tool_call_id=tool_call_id, **fields)


class TextMessage(_Message):
    ROLE = "text"


class ToolCall(_Message):
    """v0's flat tool call (`id`, `name`, `arguments`), as 0.1.11+ returned it."""

    def __init__(self, id: str = "", name: str = "", arguments: str = "", **fields: Any):
        dict.__init__(self, id=id, name=name, arguments=arguments, **fields)


# ---- @stop, @cleanup, @teardown ----------------------------------------------------------------


def _marker(kind: str) -> Callable:
    def decorator(func: Callable | None = None, *, priority: int = 0, **options: Any) -> Callable:
        def mark(f: Callable) -> Callable:
            setattr(f, kind, True)
            setattr(f, f"{kind}_priority", priority)
            for key, value in options.items():  # @reward(weight=..., stage=...), @cleanup(stage=...)
                setattr(f, f"{kind}_{key}", value)
            return f

        return mark if func is None else mark(func)

    decorator.__name__ = kind
    decorator.__doc__ = f"v0 `@{kind}` / `@{kind}(priority=N)`: marks a method of a v0 environment class."
    return decorator


stop = _marker("stop")
cleanup = _marker("cleanup")
teardown = _marker("teardown")

# ---- @reward, @metric, @setup, @update, @advantage (0.1.14+) -----------------------------------
# Exported by `verifiers` (0.1.14–0.2.x) and `verifiers.legacy` (0.3.x), but only verifiers.v1's
# Taskset and Harness discover them: a v0 Environment discovers @stop/@cleanup/@teardown and a v0
# Rubric @cleanup/@teardown, so on v0 code they mark a method and change nothing. The same here:
# the function comes back unchanged (a Rubric's funcs list still scores it), and the rewards stay
# v0's. vf-migrate says so where a module uses them (ENV014).
INERT_SIGNALS = ("reward", "metric", "setup", "update", "advantage")
reward = _marker("reward")
metric = _marker("metric")
setup = _marker("setup")
update = _marker("update")
advantage = _marker("advantage")


def _marked(env: Any, kind: str) -> list[Callable]:
    found = [getattr(env, name) for name in dir(type(env)) if getattr(getattr(type(env), name, None), kind, False) is True]
    return sorted(found, key=lambda m: (-getattr(m, f"{kind}_priority", 0), m.__name__))


def stop_methods(env: Any) -> list[Callable]:
    """The env's @stop methods in v0's order (priority, highest first, then name)."""
    return _marked(env, "stop")


async def run_stops(env: Any, state: dict[str, Any]) -> bool:
    """v0's `is_completed(state)` (0.1.8+): the first stop method that fires sets `is_completed`
    and `stop_condition` on the state and runs the @cleanup methods."""
    for method in stop_methods(env):
        done = method(state)
        if inspect.isawaitable(done):
            done = await done
        if done:
            state["is_completed"] = True
            state["stop_condition"] = method.__name__
            await run_cleanups(env, state)
            return True
    return False


async def run_cleanups(env: Any, state: dict[str, Any]) -> None:
    for method in _marked(env, "cleanup"):
        out = method(state)
        if inspect.isawaitable(out):
            await out


# ---- state["trajectory"] -----------------------------------------------------------------------


def trajectory(prompt: list[dict[str, Any]], completion: list[dict[str, Any]], trajectory_id: str = "") -> list[dict]:
    """One step per model reply: the messages before it (`prompt`) and the reply (`completion`)."""
    steps, seen = [], list(prompt)
    for message in completion:
        if message.get("role") == "assistant":
            steps.append({"prompt": list(seen), "completion": [message], "response": None, "tokens": None,
                          "reward": None, "advantage": None, "is_truncated": False, "trajectory_id": trajectory_id,
                          "extras": {}})
        seen.append(message)
    return steps


# ---- errors (0.1.6+) and small helpers -------------------------------------------------------------


class Error(Exception):
    """v0 `vf.Error`: the base of the errors a rollout records (0.1.6+). Raised in migrated code, it
    is recorded on the trace like any exception (type and message)."""


class InfraError(Error):
    pass


class SandboxError(InfraError):
    pass


class BrowserSandboxError(SandboxError):
    pass


class TunnelError(InfraError):
    pass


class ModelError(Error):
    pass


class EmptyModelResponseError(ModelError):
    pass


class InvalidModelResponseError(ModelError):
    pass


class OverlongPromptError(Error):
    pass


class ToolError(Error):
    pass


class ToolCallError(ToolError):
    pass


class ToolParseError(ToolError):
    pass


class MissingKeyError(Error):
    pass


ERRORS = ("Error", "InfraError", "SandboxError", "BrowserSandboxError", "TunnelError", "ModelError",
          "EmptyModelResponseError", "InvalidModelResponseError", "OverlongPromptError", "ToolError", "ToolCallError",
          "ToolParseError", "MissingKeyError")


def ensure_keys(keys: list[str]) -> None:
    """v0 `vf.ensure_keys` (0.1.10+): every named environment variable is set, else MissingKeyError."""
    import os

    missing = [k for k in keys if not os.environ.get(k)]
    if missing:
        raise MissingKeyError(f"missing environment variable(s): {', '.join(missing)}")


def setup_logging(*args: Any, **kwargs: Any) -> None:
    """v0 `vf.setup_logging`: vf's commands set up their own output; nothing to do."""


def print_prompt_completions_sample(*args: Any, **kwargs: Any) -> None:
    """v0's console table of samples: vf-eval writes traces.jsonl; nothing to print here."""


TRAINING = frozenset({"GRPOTrainer", "GRPOEnvTrainer", "GRPOConfig", "RLTrainer", "RLConfig", "grpo_defaults",
                      "lora_defaults", "get_model", "get_tokenizer", "get_model_and_tokenizer", "SFTTrainer"})
"""v0's Python training API (0.1.x scripts): vf trains from the command line (`vf-train`)."""
HELPERS = ("ensure_keys", "setup_logging", "print_prompt_completions_sample")
