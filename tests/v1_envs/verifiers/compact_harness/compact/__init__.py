"""`compact`: a harness shipped as its own package (tests/v1_envs/*/compact_harness/, put on
PYTHONPATH or pip-installed), named by its id: `--env.agent.harness.id compact`.

Its program (program.py, stdlib only) runs in the rollout's runtime with the runtime's `python3`:
a chat loop with one `bash` tool against the interception `endpoint`, then one more call on a
compacted history for the final answer, written to `answer_file`.

NEEDS_CONTAINER = False: the program is this package's own small loop, not a third-party agent
with host state to leak, and there is no docker here; so verifiers 0.4.0 runs it on its
subprocess runtime (it refuses harnesses that need a container there).
"""

import json
from pathlib import Path

from pydantic import Field
from verifiers.v1.clients import ModelContext
from verifiers.v1.configs.harness import HarnessConfig
from verifiers.v1.harness import Harness
from verifiers.v1.runtimes import ProgramResult, Runtime
from verifiers.v1.task import TaskData

PROGRAM = (Path(__file__).parent / "program.py").read_bytes()
STATE_DIR = ".compact"

__all__ = ["CompactHarness", "CompactHarnessConfig"]


class CompactHarnessConfig(HarnessConfig):
    max_turns: int = Field(4, ge=1)
    """Model calls in the tool loop before the program compacts anyway."""
    answer_file: str = "answer.txt"
    """Where, in the working directory, the program writes its final answer."""


class CompactHarness(Harness[CompactHarnessConfig]):
    APPENDS_SYSTEM_PROMPT = True
    NEEDS_CONTAINER = False

    async def setup(self, runtime: Runtime) -> None:
        await runtime.write(f"{STATE_DIR}/program.py", PROGRAM)

    async def launch(self, ctx: ModelContext, trace, runtime: Runtime, endpoint: str, secret: str,
                     mcp_urls: dict[str, str], data: TaskData) -> ProgramResult:
        system, prompt = self.resolve_text_prompt(data)
        request = {"model": ctx.model, "prompt": prompt or "", "system": system,
                   "max_turns": self.config.max_turns, "answer_file": self.config.answer_file}
        await runtime.write(f"{STATE_DIR}/request.json", json.dumps(request).encode())
        # the key by environment, not argv: argv is visible to every process on a host runtime
        env = {**self.config.resolved_env, "OPENAI_BASE_URL": endpoint, "OPENAI_API_KEY": secret}
        return await runtime.run_program(["python3", f"{STATE_DIR}/program.py", f"{STATE_DIR}/request.json"], env)
