"""agentic-judge / shared-agentic-judge: a solver plays the task, then a judge AGENT verifies it.

The judge (seat `judge`, never trained on) is an agent with a harness that executes code
(`bash` or a program harness; the tool-less `null` is refused — a verdict that needs no execution
is a plugged judge, `--env.taskset.task.judges`). It gets verifiers 0.4's grading prompt (the
solver's task, the rubric's criteria, a workspace note; `[env.task]` replaces the policy text or
adds hints) and the solver's observable trace record (reasoning and provider state dropped unless
`include_hidden_reasoning`) as a file, and must write its verdicts as JSON to a file:

    {"verdicts": [{"name": "<criterion>", "reason": "<one sentence>", "verdict": "<choice>"}]}

The env's `finalize` validates them strictly (every criterion once, each verdict one of its
choices; vf.judges.rubric) onto the solver's trace: metric `judge/<name>` per criterion and
reward `judge` (the weight-averaged criterion score, weight `score.judge_weight`); the task's own
rewards are scaled by `score.task_weight` (0 by default: judge-only). A judge that writes no
verdict, or a malformed one, fails its own trace (`--env.judge.retries` reruns it) and the solver
gets no judge reward.

The env id picks the runtime boundary:
    agentic-judge         a fresh runtime with the solver's policy; only the task's declared
                          artifacts (`TaskData.artifacts`) are restored into it
    shared-agentic-judge  the solver's own runtime, kept open after it finished, with every file
                          it left

Both judge runtimes follow the solver's (`--env.solver.runtime.*`; the judge seat's own runtime
setting is replaced), and the host-process `subprocess` runtime is refused: the judge runs code.
Where verifiers uses /tmp/verdict.json and /tmp/trace.json, vf's `sandbox` keeps only the working
directory between commands, so both files live there (VERDICT_FILE, TRACE_FILE); setup removes
whatever the solver left at those names before writing the record (link-safe writes).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, FiniteFloat

from vf.artifacts import restore
from vf.bounded import load_json
from vf.env import AgentConfig, Env, EnvConfig
from vf.envs.isolated_verifier import HOST_RUNTIMES
from vf.episode.harnesses import NullHarness, make_harness
from vf.errors import UsageError
from vf.judges.rubric import Criterion, RubricVerdicts, load_criteria, score_verdicts
from vf.taskset import Task, TaskData

VERDICT_FILE = ".vf-judge-verdict.json"
TRACE_FILE = ".vf-judge-trace.json"
"""In the judge runtime's working directory (relative paths)."""
VERDICT_MAX_BYTES = 1 << 20
"""The judge's verdict file is model-made: read at most this much."""

GRADE_PROMPT = """\
You are grading another agent's attempt at a task. Verify the work EMPIRICALLY:
reconstruct what the agent did from its trace and test it with real execution
in your sandbox — never take the trace's word for an outcome you can check."""

TASK_SECTION = """\
## The task the agent was given

{prompt}"""

SOLVED = Criterion(name="solved", text="The task is fully solved: what the task asked for is achieved, and "
                                       "you verified it with real execution.")

RECORD_NOTE = f"""\
The agent's observable trace record (JSON: messages, tool calls, and its `info`)
is written by the harness — not the agent — at `{TRACE_FILE}` in your working
directory. The record can be very large — never dump it whole; peek selectively
(list its keys, then slice out specific fields with python or jq) and pull only
what you need. Hidden reasoning and opaque provider state are not included unless
the run explicitly opts in. The record may also carry the task's own scores/metrics
and reference material (a gold answer, a reference solution, held-out tests). Those
are context, not your standard: recorded scores can be wrong and references can be
narrower than the task; do not over-index on how a reference solves it. Your verdict
is what YOU verified by execution."""

SHARED_WORKSPACE_NOTE = f"""\
## Your workspace

The graded agent worked in this sandbox. Its edits and any scoring side effects
are present. {RECORD_NOTE}"""

ISOLATED_WORKSPACE_NOTE = f"""\
## Your workspace

This is a fresh sandbox built from the task's image. The task's published
artifacts were restored at their original paths (relative to the working
directory); other changes made by the graded agent are not present. {RECORD_NOTE}"""

HINT_SECTION = """\
## Hints

{hint}"""


def verdict_section(criteria: list[Criterion]) -> str:
    listing = "\n".join(c.render() for c in criteria)
    return f"""\
## Your verdict

Grade the attempt on these criteria:

{listing}

When you are done verifying, write your verdict as JSON to `{VERDICT_FILE}` in your working directory:

    {{"verdicts": [{{"name": "<criterion name>", "reason": "<one sentence citing \
what you verified>", "verdict": "<answer>"}}, ...]}}

with one entry per criterion, using each criterion's exact name. For each, first
write the one-sentence reason grounded in what you actually verified, then set
verdict to exactly one of the options listed in parentheses after that
criterion."""


def render(template: str, **fields: str) -> str:
    """Documented placeholders substituted in one pass (a custom policy may hold literal braces;
    a substituted value is never re-scanned); an unknown placeholder stays as written."""
    pattern = re.compile(r"\{(" + "|".join(map(re.escape, fields)) + r")\}")
    return pattern.sub(lambda m: fields[m.group(1)], template)


class TextFile(BaseModel):
    """A file-backed text value (`{ path = "policy.md" }` in TOML)."""

    model_config = ConfigDict(extra="forbid")
    path: Path


class JudgeTaskConfig(BaseModel):
    """`[env.task]`: the judge's grading policy and what lands in its runtime."""

    model_config = ConfigDict(extra="forbid")
    prompt: str | TextFile | None = None
    """The grading policy (inline text or a file); may place the task with `{prompt}`, else the
    task statement is appended. The verdict contract and workspace note are always added."""
    hint: str | TextFile | None = None
    """Task-family pointers, added as their own section."""
    rubric: Path | None = None
    """A `.toml`/`.json` file with a `criteria` list (the rubric judge's format); None grades the
    single built-in `solved` criterion."""
    include_hidden_reasoning: bool = False
    """Keep reasoning and provider state in the trace record the judge reads."""

    @staticmethod
    def _text(value: str | TextFile) -> str:
        return value if isinstance(value, str) else value.path.read_text(encoding="utf-8")

    def build_prompt(self) -> str:
        return GRADE_PROMPT + "\n\n" + TASK_SECTION if self.prompt is None else self._text(self.prompt)

    def build_hint(self) -> str | None:
        return None if self.hint is None else self._text(self.hint)

    def criteria(self) -> list[Criterion]:
        return [SOLVED] if self.rubric is None else load_criteria(self.rubric)


class ScoreConfig(BaseModel):
    """How the verdict composes with the taskset's own rewards on the solver's trace."""

    model_config = ConfigDict(extra="forbid")
    task_weight: FiniteFloat = 0.0
    """Scale on the taskset's own rewards; 1 keeps them beside the verdict."""
    judge_weight: FiniteFloat = 1.0
    """Weight of the `judge` reward."""


class JudgeTask(Task):
    """The judge's task, minted from the solver's finished trace: its setup restores the artifacts
    (isolated mode), clears stale files and writes the trace record; its finalize reads the verdict
    off the still-open runtime (a missing or malformed one fails the judge's own trace)."""

    def __init__(self, data: TaskData, files: dict[str, bytes], artifacts: dict[str, bytes | None]):
        super().__init__(data)
        self.files, self.artifacts = files, artifacts

    @classmethod
    def from_trace(cls, solution, config: JudgeTaskConfig, share_runtime: bool = True) -> JudgeTask:
        """verifiers' signature: the solver's task is its trace's typed row (`solution.task.data`)."""
        solved = solution.task.data
        record = solution.model_dump(mode="json")
        if not config.include_hidden_reasoning:
            for node in record.get("nodes", []):
                node["message"].pop("reasoning_content", None)
                node["message"].pop("provider_state", None)
        template = config.build_prompt()
        body = render(template, prompt=solved.prompt_text)
        if "{prompt}" not in template:  # a policy that does not place the task still needs it
            body += "\n\n" + render(TASK_SECTION, prompt=solved.prompt_text)
        sections = [body, verdict_section(config.criteria()),
                    SHARED_WORKSPACE_NOTE if share_runtime else ISOLATED_WORKSPACE_NOTE]
        if (hint := config.build_hint()) is not None:
            sections.insert(1, render(HINT_SECTION, hint=hint))
        mirrored = {k: getattr(solved, k) for k in ("image", "workdir", "resources", "network_allow", "network_block")
                    if k in solved.model_fields_set}  # an unset network_allow must stay unset (no network)
        data = TaskData(idx=solved.idx, prompt="\n\n".join(sections), **mirrored)
        return cls(data, files={TRACE_FILE: json.dumps(record).encode()},
                   artifacts={} if share_runtime else dict(solution.state.artifacts or {}))

    async def setup(self, runtime) -> None:
        await restore(runtime, self.artifacts)
        # the solver may have had this box: a pre-seeded verdict must never read as the judge's
        await runtime.run(["rm", "-rf", "--", VERDICT_FILE, *self.files], env={})
        for path, content in self.files.items():
            await runtime.write(path, content)

    async def finalize(self, trace, runtime) -> None:
        try:
            raw = await runtime.read(VERDICT_FILE, max_bytes=VERDICT_MAX_BYTES)
        except Exception as e:
            raise ValueError(f"the judge wrote no verdict to {VERDICT_FILE}; its final act must be writing "
                             '{"verdicts": [{"name", "reason", "verdict"}, ...]} there') from e
        trace.info["verdict"] = RubricVerdicts.model_validate(load_json(raw)).model_dump()


class AgenticJudgeEnvConfig(EnvConfig):
    solver: AgentConfig = Field(default_factory=AgentConfig)
    """The solver; its runtime must be isolated (`sandbox`, the default, or `docker`)."""
    judge: AgentConfig = Field(default_factory=lambda: AgentConfig(harness={"id": "bash"}))
    """The judge; its runtime setting is replaced by the solver's."""
    task: JudgeTaskConfig = Field(default_factory=JudgeTaskConfig)
    score: ScoreConfig = Field(default_factory=ScoreConfig)


class AgenticJudgeEnv(Env[AgenticJudgeEnvConfig]):
    """The grading protocol; subclasses choose the runtime boundary."""

    def __init__(self, config: AgenticJudgeEnvConfig | None = None):
        config = config if config is not None else AgenticJudgeEnvConfig()
        config.judge = config.judge.model_copy(update={"runtime": config.solver.runtime})
        super().__init__(config)
        judge = make_harness(config.judge.harness)
        if isinstance(judge, NullHarness) and not judge.NEEDS_RUNTIME:
            raise UsageError(f"agentic-judge needs a judge harness that executes code, but {judge.config.id!r} "
                             "is a tool-less chat loop",
                             hint="--env.judge.harness.id bash; a verdict that needs no execution is a plugged "
                                  "judge (--env.taskset.task.judges), not an agent")
        if config.solver.runtime.type in HOST_RUNTIMES:
            raise UsageError("agentic-judge needs the solver (and so the judge) in an isolated runtime, but it is "
                             f"{config.solver.runtime.type!r}",
                             hint="--env.solver.runtime.type sandbox (the default) or docker")
        # a missing policy file or a malformed rubric fails here, not after a solve
        config.task.build_prompt(), config.task.build_hint(), config.task.criteria()

    async def setup(self, agents) -> None:
        agents.judge.trainable = False  # the judge grades the policy; its tokens are not training data

    async def finalize(self, task, episode) -> None:
        by_seat = {t.agent["name"]: t for t in episode.traces}
        solution, judged = by_seat["solver"], by_seat["judge"]
        verdicts = RubricVerdicts.model_validate(judged.info.get("verdict")).verdicts
        criteria = self.config.task.criteria()
        scores = score_verdicts(verdicts, criteria)
        for criterion in criteria:
            solution.record_metric(f"judge/{criterion.name}", scores[criterion.name])
        if self.config.score.task_weight != 1.0:
            for reward in solution.rewards.values():
                if reward is not None:
                    reward.weight *= self.config.score.task_weight
        total = sum(c.weight for c in criteria)
        solution.record_reward("judge", sum(c.weight * scores[c.name] for c in criteria) / total,
                               weight=self.config.score.judge_weight)


class SharedAgenticJudgeEnv(AgenticJudgeEnv):
    """The judge works in the solver's runtime, with everything the solver left there."""

    async def run(self, task, agents) -> None:
        async with agents.solver.provision(task) as box:
            solution = await agents.solver.run(task, runtime=box)
            if not solution.ok:
                raise RuntimeError("the solver's rollout failed, so the judge never ran")
            await agents.judge.run(JudgeTask.from_trace(solution, self.config.task, share_runtime=True), runtime=box)


class IsolatedAgenticJudgeEnv(AgenticJudgeEnv):
    """The judge works in a fresh runtime holding only the solver's declared artifacts."""

    async def run(self, task, agents) -> None:
        solution = await agents.solver.run(task)
        if not solution.ok:
            raise RuntimeError("the solver's rollout failed, so the judge never ran")
        await agents.judge.run(JudgeTask.from_trace(solution, self.config.task, share_runtime=False))
