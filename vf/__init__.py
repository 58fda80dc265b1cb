"""vf: reinforcement learning on language models.

The v1 environment API lives at the top level with verifiers v1's names, so an environment
written for verifiers (`import verifiers.v1 as vf`) runs here after its import says `import vf`.
Importing vf never imports torch: models, engines and the trainer load it only when used.

This file is the facade over both floors of the episode core: the authoring API's modules
(vf.types, vf.rows, vf.trace, vf.taskset, vf.toolset, vf.judge, vf.env, vf.harness, ...) and the
few names of the machinery verifiers exports beside them (`Agent`, `Agents`, `Interaction`,
`Segment`, `load_taskset`: vf.episode). The API modules never import vf.episode
(tests/test_layering.py).
"""

from vf import types
from vf.artifacts import Artifact, collect
from vf.configs.harness import HarnessConfig
from vf.env import (
    AgentConfig,
    Env,
    EnvConfig,
    SingleAgentEnv,
    SingleAgentEnvConfig,
    SubprocessConfig,
)
from vf.episode.agents import Agent, Agents, Interaction, Segment
from vf.episode.loading import load_taskset
from vf.errors import (
    EnvError,
    HarnessError,
    InterceptionError,
    ProviderError,
    RolloutError,
    SandboxError,
    TaskError,
    ToolsetError,
    TunnelError,
)
from vf.harness import Harness
from vf.judge import Judge, JudgeConfig, JudgeResponse, Judges, JudgeView
from vf.judges import (
    Criterion,
    DecisionJudge,
    DecisionJudgeConfig,
    ReferenceJudge,
    ReferenceJudgeConfig,
    RubricJudge,
    RubricJudgeConfig,
)
from vf.runtime import Runtime, RuntimeConfig
from vf.taskset import (
    FunctionConfig,
    State,
    Task,
    TaskConfig,
    TaskData,
    TaskResources,
    Taskset,
    TasksetConfig,
    TaskTimeout,
    WireTaskData,
    intercept,
    metric,
    reward,
    stop,
)
from vf.toolset import SharedToolsetConfig, Toolset, ToolsetConfig, tool
from vf.trace import Episode, ErrorInfo, MessageNode, ModelCall, Trace, TraceTask
from vf.types import (
    AssistantMessage,
    ContentPart,
    ImageUrlContentPart,
    ImageUrlSource,
    Message,
    Messages,
    Request,
    Response,
    SystemMessage,
    TextContentPart,
    Tool,
    ToolCall,
    ToolMessage,
    Usage,
    UserMessage,
    content_text,
)
from vf.utils.score import extract_boxed_answer, parse_judge_choice
from vf.version import TRACE_VERSION, __version__

Error = ErrorInfo

__all__ = [
    "Agent", "Artifact", "collect", "AgentConfig", "Agents", "AssistantMessage", "ContentPart", "Env", "EnvConfig", "Episode", "Error",
    "ErrorInfo", "FunctionConfig", "Harness", "HarnessConfig", "ImageUrlContentPart", "ImageUrlSource", "Interaction",
    "Judge", "JudgeConfig", "Message", "MessageNode", "Messages", "ModelCall", "Request", "Response", "Runtime",
    "RuntimeConfig", "Segment", "SingleAgentEnv", "SingleAgentEnvConfig", "State", "SubprocessConfig", "SystemMessage",
    "Task", "TaskConfig", "TaskData", "TaskResources", "TaskTimeout", "Taskset", "TasksetConfig", "TextContentPart",
    "Tool", "SharedToolsetConfig", "Toolset", "ToolsetConfig", "ToolCall", "ToolMessage", "Trace", "TraceTask",
    "TRACE_VERSION", "Usage", "UserMessage", "__version__",
    "content_text", "intercept", "load_taskset", "metric", "reward", "stop", "tool", "types",
    "Criterion", "DecisionJudge", "DecisionJudgeConfig", "JudgeResponse", "Judges", "JudgeView",
    "ReferenceJudge", "ReferenceJudgeConfig", "RubricJudge", "RubricJudgeConfig", "extract_boxed_answer",
    "parse_judge_choice",
    "WireTaskData", "RolloutError", "EnvError", "ProviderError", "HarnessError", "ToolsetError", "SandboxError",
    "TaskError", "InterceptionError", "TunnelError",
]

