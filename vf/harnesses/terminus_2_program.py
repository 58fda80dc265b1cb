"""Terminus-2 (harbor) on one task, in the runtime's working directory: run by the harness with
the agent's own interpreter (`python -c`), so it imports harbor and never vf.

Harbor drives its agents in a container through an environment object; here that object runs
each command as a local shell, in the working directory the program starts in (the runtime's).
Arguments: MODEL LOGS_DIR MAX_TURNS TASK SYSTEM_PROMPT (MAX_TURNS 0: no limit of its own).
The model endpoint and key come from OPENAI_BASE_URL and OPENAI_API_KEY (litellm reads them).
"""

import asyncio
import os
import subprocess
import sys
from pathlib import Path, PurePosixPath

from harbor.agents.terminus_2 import Terminus2
from harbor.environments.base import ExecResult
from harbor.models.agent.context import AgentContext
from harbor.models.trial.paths import EnvironmentPaths


class WorkdirEnvironment:
    """The part of harbor's environment interface Terminus-2 uses, as local shell commands."""

    default_user = None
    session_id = "vf"

    async def exec(self, command, cwd=None, env=None, timeout_sec=None, user=None):
        done = await asyncio.to_thread(subprocess.run, command, shell=True, cwd=cwd,
                                       env={**os.environ, **(env or {})}, capture_output=True, text=True,
                                       timeout=timeout_sec, check=False)
        return ExecResult(stdout=done.stdout, stderr=done.stderr, return_code=done.returncode)


async def main(model: str, logs_dir: str, max_turns: str, task: str, system_prompt: str) -> None:
    logs = Path(logs_dir)
    logs.mkdir(parents=True, exist_ok=True)
    Path(os.environ["TMUX_TMPDIR"]).mkdir(mode=0o700, exist_ok=True)  # tmux makes only its tmux-UID below
    EnvironmentPaths.agent_dir = PurePosixPath(logs)  # its pane log, not harbor's /logs/agent
    agent = Terminus2(logs_dir=logs, model_name=model, max_turns=int(max_turns) or None,
                      api_base=os.environ["OPENAI_BASE_URL"], llm_kwargs={"custom_llm_provider": "openai"},
                      record_terminal_session=False, interleaved_thinking=True)
    if system_prompt:  # Terminus has its own prompt; a task's system prompt goes in front of every call
        call = agent._llm.call

        async def call_with_system_prompt(*args, message_history, **kwargs):
            return await call(*args, message_history=[{"role": "system", "content": system_prompt},
                                                      *message_history], **kwargs)

        agent._llm.call = call_with_system_prompt
    environment = WorkdirEnvironment()
    await agent.setup(environment)
    await agent.run(task, environment, AgentContext())


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:6]))
