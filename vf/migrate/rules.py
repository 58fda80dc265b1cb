"""The migration rules: id, what the rule does, and a before/after example.

Every report entry names one of these ids; MIGRATION.md embeds the table
(`python -m vf.migrate.rules` prints it; a test keeps them equal).
"""

from __future__ import annotations

from dataclasses import dataclass

from vf.trainer.defaults import IPO_EPS


@dataclass(frozen=True)
class Rule:
    id: str
    kind: str
    title: str
    description: str
    before: str
    after: str


R = Rule
RULES: list[Rule] = [
    # ---- v0 environment modules ----------------------------------------------------------------
    R("ENV001", "environment", "load_environment() → Taskset",
      "`load_environment(**kwargs)` becomes a TaskData subclass, a TasksetConfig whose fields are the "
      "function's keyword parameters (with their defaults), a Task and a Taskset whose `load()` keeps "
      "the original dataset-building code. `**kwargs` is dropped (it fed env constructor options). A "
      "parameter that holds an object (`parser: XMLParser = XMLParser(...)`, `client: AsyncOpenAI | None = "
      "None`) is no config field (no command line could set it, and pydantic has no schema for it): it keeps "
      "its default, and the report says so.",
      "def load_environment(num_examples: int = 3, **kwargs):\n    dataset = build(num_examples)\n"
      "    return vf.SingleTurnEnv(dataset=dataset, rubric=rubric)",
      "class MyEnvConfig(vf.TasksetConfig):\n    num_examples: int = 3\n\n"
      "class MyEnvTaskset(vf.Taskset[MyEnvTask, MyEnvConfig]):\n    def load(self):\n"
      "        num_examples = self.config.num_examples\n        dataset = build(num_examples)\n"
      "        yield from compat.rows(dataset, MyEnvData)"),
    R("ENV002", "environment", "dataset columns → TaskData rows",
      "`question` (str) or `prompt` (messages), `answer`, `info` (dict or JSON string) become "
      "`TaskData(prompt=..., answer=..., info=...)`; `system_prompt=`/`few_shot=` of the env are "
      "applied per row.",
      "vf.SingleTurnEnv(dataset=ds, system_prompt=SYSTEM)",
      "class MyEnvData(vf.TaskData):\n    answer: str = ''\n    info: dict = {}\n...\n"
      "yield from compat.rows(ds, MyEnvData, system_prompt=SYSTEM)"),
    R("ENV003", "environment", "Rubric funcs/weights → @vf.reward methods",
      "Each rubric function becomes a `@vf.reward(weight=w)` method (weight 0 / `add_metric` → "
      "`@vf.metric`) that calls the original function unchanged with the v0 arguments it names "
      "(`completion`, `prompt`, `answer`, `info`, `state`, `parser`), built from the v1 trace by "
      "`vf.migrate.compat`. The parser and rubric are rebuilt once by `_v0_env()`. A function that raises "
      "(or returns no number) is an error on its trace, as a v1 reward is: the episode counts as errored "
      "(v0 logged it and scored 0, so a broken reward looked like a wrong answer). The Task's `validate()` "
      "returns a probe reply (the row's answer in the parser's format), so `vf-validate` runs every reward "
      "function once without a model and names the one that raises. `MathRubric` adds `correct_answer` (weight 1.0); a `RubricGroup` contributes its "
      "members' functions in order (each with its own parser); `ToolRubric`'s tool-call counts (weight-0 "
      "metrics) are left to the trace, which records every tool call.",
      "rubric = vf.Rubric(funcs=[correct, parser.get_format_reward_func()], weights=[1.0, 0.2])",
      "@vf.reward(weight=1.0)\ndef correct(self, task, trace, state):\n"
      "    return _v0_env().score(0, task, trace, state)\n\n@vf.reward(weight=0.2)\n"
      "def format_reward_func(self, task, trace, state):\n    return _v0_env().score(1, task, trace, state)"),
    R("ENV004", "environment", "parsers → compat parsers",
      "`vf.Parser`, `vf.XMLParser`, `vf.ThinkParser` (and every other `verifiers` name) resolve to "
      "`vf.migrate.compat`, which reproduces v0 parsing and format rewards.",
      "parser = vf.XMLParser(['think', 'answer'])", "parser = compat.XMLParser(['think', 'answer'])"),
    R("ENV005", "environment", "SingleTurnEnv → one-turn stop",
      "A `SingleTurnEnv` becomes a `@vf.stop` that ends the episode after the first model reply.",
      "return vf.SingleTurnEnv(dataset=ds, rubric=rubric)",
      "@vf.stop\ndef single_turn(self, trace) -> bool:\n    return trace.num_turns >= 1"),
    R("ENV006", "environment", "MultiTurnEnv.env_response → Env adapter",
      "A `vf.MultiTurnEnv` subclass keeps its `env_response`/`is_completed` (now on "
      "`compat.MultiTurnEnv`) and is run by a generated `compat.MultiTurnAdapter` (a `vf.Env`) set as "
      "the taskset's `ENV`; `max_turns` becomes a `@vf.stop`. The class may derive from vf's through "
      "classes of the module. verifiers 0.1.8+ hooks keep their meaning: `@vf.stop` methods "
      "(`(self, state) -> bool`, by priority) end the rollout before the next env_response, "
      "`state[\"final_env_response\"]` ends it with those messages, `@vf.cleanup` methods run once it "
      "stopped; the v0 state has `trajectory` (one step per model reply), `input`, `is_completed`; "
      "`vf.UserMessage`/`SystemMessage`/`AssistantMessage`/`ToolMessage` are messages (dicts that read as "
      "attributes), `vf.Error`/`vf.ToolError`/... are exceptions recorded on the trace.",
      "class Guess(vf.MultiTurnEnv):\n    def env_response(self, messages, state): ...",
      "class Guess(compat.MultiTurnEnv):\n    def env_response(self, messages, state): ...\n\n"
      "class GuessEnv(compat.MultiTurnAdapter):\n    v0_env = staticmethod(_v0_env)"),
    R("ENV007", "environment", "ToolEnv(tools=[fn]) → Toolset",
      "Each module-level tool function becomes a `@vf.tool` method of a generated `vf.Toolset` with "
      "the same signature and docstring, calling the original function; the Task lists the toolset.",
      "vf.ToolEnv(dataset=ds, tools=[add], max_turns=4)",
      "class MyEnvTools(vf.Toolset):\n    @vf.tool\n    def add(self, a: int, b: int) -> int:\n"
      "        '''Add two integers.'''\n        return add(a=a, b=b)"),
    R("ENV008", "environment", "imports",
      "`import verifiers as vf` becomes `import vf` plus `from vf.migrate import compat`; "
      "`from verifiers import X` and `from verifiers.<module> import X` (data_utils, types, parsers, "
      "rubrics, utils.tools) become `from vf.migrate.compat import X`, also inside functions. "
      "`from datasets import load_dataset` becomes `from vf.migrate.compat import load_dataset`: the hub "
      "as before, or local JSON-lines files when `VF_DATA_DIR` is set (`<org>__<name>[.<config>][.<split>].jsonl`). "
      "A module that imports verifiers without a `load_environment()` (a helper of an env package, a v0 "
      "script) gets the same rewrite, its code kept, so the migrated env needs no verifiers; v0's Python "
      "training API there (`GRPOTrainer`, `grpo_defaults`, `get_model_and_tokenizer`, ...) is a TODO "
      "pointing to `vf-train`.",
      "import verifiers as vf", "import vf\nfrom vf.migrate import compat"),
    R("ENV009", "environment", "setup_state → Task.setup",
      "A v0 env class's `setup_state(state)` runs from the generated `Task.setup` on the rollout's v0 "
      "state dict (kept whole on the typed State as `v0_state`), so env_response, tools and rewards see "
      "what it wrote.",
      "async def setup_state(self, state, **kwargs):\n    state['secret'] = 7\n    return state",
      "async def setup(self, trace, state):\n    await compat.setup_state(_v0_env(), self.data, trace, state)"),
    R("ENV010", "environment", "JudgeRubric → vf.Judge",
      "A `JudgeRubric` becomes a generated `vf.Judge` (the v0 `judge_prompt`, default v0's prompt) "
      "and a TaskConfig field `judge` (a JudgeConfig with the v0 client's settings as defaults); reward functions that name `judge` get "
      "a v0-style `judge(prompt, completion, answer, state)` that calls it (recorded in "
      "`trace.info[\"judge_calls\"]`). As in v0 it fills `{question}`, `{answer}`, `{response}` with the "
      "last prompt message, the answer and the judge rubric's own parser's answer (a plain Parser unless one "
      "was given). The v0 client's `base_url` and `os.getenv(VAR)` API key become the defaults of a "
      "generated JudgeConfig (`--taskset.task.judge.base-url` sets one, keeping the others); when they came "
      "from load_environment arguments (`judge_base_url`, `judge_model`, ...), a run's "
      "`--taskset.judge-base-url` reaches the judge too. Every release's call reaches the same judge: "
      "`rubric.judge(...)` plain (0.1.2) or awaited (0.1.3+), `judge` as an argument, `judge_sampling_args` "
      "(sent with each call); replies are cached per prompt in the v0 state, as 0.1.3+ did; "
      "`judge_reward_func` is 0.1.0-0.1.1's built-in reward.",
      "rubric = vf.JudgeRubric(judge_client=OpenAI(base_url=url), judge_model='gpt-4.1-mini')",
      "class MyEnvJudge(vf.Judge):\n    prompt = compat.JUDGE_PROMPT\n\n"
      "class MyEnvJudgeConfig(vf.JudgeConfig):\n    model: str = 'gpt-4.1-mini'\n"
      "    base_url: str | None = 'https://api.openai.com/v1'\n\n"
      "class MyEnvTaskConfig(vf.TaskConfig):\n    judge: MyEnvJudgeConfig = MyEnvJudgeConfig()"),
    R("ENV011", "environment", "StatefulToolEnv → Toolset with typed state",
      "The tools of a `StatefulToolEnv` (from `tools=` and `self.add_tool(fn, args_to_skip=[...])`) become "
      "`@vf.tool` methods of a `vf.Toolset[vf.ToolsetConfig, MyEnvState]`; the skipped arguments leave the "
      "signature the model sees and are filled from the state by the v0 `update_tool_args`.",
      "self.add_tool(run, args_to_skip=['session'])",
      "class MyEnvTools(vf.Toolset[vf.ToolsetConfig, MyEnvState]):\n    @vf.tool\n    def run(self, code: str):\n"
      "        args = compat.tool_args(_v0_env(), 'run', {'code': code}, self.state)\n        return run(**args)"),
    R("ENV012", "environment", "group rewards → Env.finalize",
      "A reward function with plural arguments (`completions`, `answers`, `states`, ...) is scored in a "
      "generated `Env.finalize(task, episode)` over the episode's traces (`compat.group_score`). v0 "
      "grouped the rollouts of one prompt; flagged for review (run with a multi-trace env such as "
      "`--env.id best-of-n` to keep groups).",
      "def relative(completions, answers, **kwargs) -> list[float]: ...",
      "async def finalize(self, task, episode):\n"
      "    await compat.group_score(_v0_env(), 0, 'relative', 1.0, task, episode)"),
    R("ENV900", "environment", "not translatable: kept and flagged",
      "Anything without a mechanical v1 form (non-literal weights, tools defined inside load_environment, "
      "unknown env classes or constructor options, verifiers' library env classes not mapped yet, each named with "
      "the v1 construct to port it to) is kept and marked `# TODO(vf-migrate): ...` naming the "
      "line; a module the codemod cannot handle at all is kept unchanged under a `# TODO(vf-migrate)` header "
      "that names the line and the decision to make. The output always compiles.",
      "return MyCustomEnvBase(dataset=ds, rubric=rubric)",
      "# TODO(vf-migrate): unknown environment class 'MyCustomEnvBase': migrated as a multi-turn env; check it"),
    R("ENV013", "environment", "EnvGroup, TextArenaEnv, ReasoningGymEnv, GymEnv, HarborEnv → compat.V0Taskset",
      "An env whose rows and rubric exist only once it is built keeps its `load_environment()` (on "
      "`vf.migrate.compat`'s v0 classes) behind a generated `compat.V0Taskset` that builds it at load time "
      "(`--taskset.args` are its keyword arguments). `EnvGroup(envs, env_names)`: one taskset of every "
      "member's rows, each with `info[\"env_id\"]` naming its member, scored by that member's rubric "
      "(each v0 function under its own name and weight: v0's reward). `TextArenaEnv(game=\"Wordle-v0\")`: "
      "played by vf (its word list and G/Y/X rules, textarena's reply layout, six guesses); another "
      "textarena game is an error naming what to do. `ReasoningGymEnv(gym, ...)` (0.1.7+): reasoning-gym's "
      "generated rows and its `score_answer` on the `<answer>` field, as v0 built them. A row loaded with "
      "`--taskset.args` records them, so it is scored by the env those arguments build. `GymEnv(env_cls, "
      "action_parser, obs_to_text, ...)` (0.1.9+): a row per episode (its first observation, reset with the "
      "row's seed), each reply parsed into an action and stepped, the step rewards kept on their trajectory "
      "steps and summed by v0's `EpisodicSumRubric`. `HarborEnv(run_command, dataset_path, tasks, "
      "agent_workdir, docker_image)` (0.1.9+): `compat.HarborTaskset`, a row per Harbor task folder (its "
      "`task.toml` image as the row's `image`); `run_command` is the seat's program harness (ENV017), run in "
      "the task's /app with /task/instruction.md and the HARBOR_* variables; then the task's `tests/test.sh` "
      "runs in fresh /tests, /oracle and /logs/verifier (nothing the agent left there counts) and v0's "
      "`harbor_reward` reads reward.txt, else reward.json. Those absolute paths are `Runtime.add_directory` "
      "directories: the sandbox (default) or docker runtime. A task declaring `[[environment.mcp_servers]]` "
      "is an error that says so; a subclass's `build_env_vars` / `post_sandbox_setup` run before the agent "
      "(ENV017), its other sandbox hooks are flagged. The env may be a class of the "
      "module derived from one of these.",
      "vf_env = vf.EnvGroup([env1, env2], env_names=['gsm8k', 'math'])",
      "vf_env = compat.EnvGroup([env1, env2], env_names=['gsm8k', 'math'])\n...\n"
      "class MathGroupTaskset(compat.V0Taskset):\n    v0_load = staticmethod(load_environment)"),
    R("ENV015", "environment", "SandboxEnv, PythonEnv → their tool in the rollout's runtime",
      "verifiers' `SandboxEnv` (a `bash(command)` tool in a Prime sandbox container per rollout, 0.1.5+) and "
      "`PythonEnv` (a persistent Python REPL tool, `python(code)`, bash hidden), used directly or subclassed: "
      "a generated subclass of `compat.SandboxTools` / `compat.PythonTools` is the Task's toolset, and the tool "
      "runs in the rollout's vf runtime (a bubblewrap sandbox by default; `--env.agent.runtime.type docker` for "
      "a container), replying with v0's text and following `timeout_per_command_seconds` and "
      "`environment_vars`. The REPL keeps its names by re-running the rollout's earlier cells before each new "
      "one (vf's runtimes keep no process between commands). Container options (`docker_image`, `cpu_cores`, "
      "`pip_install_packages`, ...) are kept on the compat env and reported: in vf they are the run's runtime "
      "settings. v0's sandbox client works on the rollout's runtime: a subclass's `setup_state` gets "
      "`state[\"sandbox_id\"]`, and `self.sandbox_client.execute_command(sandbox_id, ...)`, `upload_file`, "
      "`download_file`, ... run there (paths in its working directory or its added directories).",
      "return vf.PythonEnv(dataset=ds, rubric=rubric, max_turns=6)",
      "class MathPythonPythonTools(compat.PythonTools):\n    v0_env = staticmethod(_v0_env)\n\n"
      "class MathPythonTask(vf.Task[...]):\n    toolsets = [MathPythonPythonTools]"),
    R("ENV016", "environment", "MCPEnv → shared stdio toolsets",
      "verifiers' `MCPEnv(mcp_servers=[{name, command, args, env}, ...])` (0.1.9+) started each stdio MCP "
      "server once and let every rollout call its tools by their own names. The migrated Taskset's "
      "`toolsets()` returns one shared toolset per server (`SharedToolsetConfig(command=[command, *args], "
      "command_env=env)`): vf starts the program on the host once per run and stops it after, the server gets "
      "its `env` on top of MCP's default few variables (no host secret), and no rollout state is sent to it.",
      "return MCPEnv(mcp_servers=[{'name': 'fetch', 'command': 'uvx', 'args': ['mcp-server-fetch']}], dataset=ds)",
      "    @classmethod\n    def toolsets(cls, config):\n        return _v0_env().toolsets()"),
    R("ENV017", "environment", "CliAgentEnv, HarborEnv → the seat's program harness",
      "verifiers' `CliAgentEnv(run_command=...)` (0.1.9+; `HarborEnv` derives from it) ran an agent command in a Prime sandbox with "
      "`OPENAI_BASE_URL` at its interception server, each model call a turn. The migrated env's seat runs a "
      "generated subclass of `compat.CliAgentHarness` by default (`--env.agent.harness.id` picks another): "
      "the command runs in the rollout's runtime (the sandbox by default) with `OPENAI_BASE_URL`, "
      "`OPENAI_API_KEY` and `OPENAI_MODEL` at the seat's interception endpoint, secret and model, v0's 3600 s "
      "client timeouts and the env's `environment_vars`; every call is recorded and the v0 rubric scores the "
      "trace. A subclass's `build_env_vars(state)` and `post_sandbox_setup(state)` run before the agent "
      "(the variables on every command, the harness's OPENAI_* on top), their `self.sandbox_client` calls "
      "on the rollout's runtime (`state[\"sandbox_id\"]` names it); its other sandbox hooks "
      "(`get_docker_image`, `start_agent`, `post_rollout`, ...) are flagged, to move to `Task.setup(runtime)`.",
      "return vf.CliAgentEnv(run_command='python agent.py', dataset=ds, rubric=rubric)",
      "class MyEnvAgent(compat.CliAgentHarness):\n    v0_env = staticmethod(_v0_env)\n\n"
      "class MyEnvEnvConfig(vf.SingleAgentEnvConfig):\n"
      "    agent: vf.AgentConfig = vf.AgentConfig(harness=vf.HarnessConfig(id=f\"{__file__}:MyEnvAgent\"))"),
    R("ENV014", "environment", "@reward/@metric/@setup/@update/@advantage on v0 code: kept, inert",
      "verifiers 0.1.14-0.3.x export these decorators for verifiers.v1's Taskset and Harness; a v0 "
      "Environment discovers only `@stop`/`@cleanup`/`@teardown` and a v0 Rubric only `@cleanup`/`@teardown`, "
      "so on v0 code they marked a method and changed nothing. They stay, as `compat` markers with the same "
      "effect (none), so the migrated rewards are v0's; the report says where, and how to make one count "
      "(a `@vf.reward`/`@vf.metric` method of the migrated Task).",
      "class Game(vf.MultiTurnEnv):\n    @vf.reward(weight=0.5)\n    async def bonus(self, state): ...",
      "class Game(compat.MultiTurnEnv):\n    @compat.reward(weight=0.5)\n    async def bonus(self, state): ..."),
    # ---- scripts and CI files ------------------------------------------------------------------
    R("SCR001", "script", "v0 vf-eval flags → v1 vf-eval",
      "A `vf-eval` call is classified by its flags (v0, verifiers 0.4.0, or ours already). v0 flags: "
      "`-a JSON` → `--taskset.KEY V`; `-b`/`--api-base-url` → `--base-url`; `-k` → `--api-key-var`; "
      "`-t` → `--sampling.max-tokens`; `-T` → `--sampling.temperature`; `-S JSON` → `--sampling.KEY V`; "
      "`-x '{\"max_turns\": N}'` → `--max-turns N`; `--timeout` → `--episode-timeout`; "
      "`--shuffle`/`--shuffle-seed` → `--select.shuffle true`/`--select.seed`; `-s`/`-f` dropped "
      "(always saved); `-R PATH` → `--resume PATH`; display flags dropped; `-p`/`-e`/`-C`/`-H` flagged. "
      "The prime CLI's `prime env eval ENV ...` / `prime eval [run] ENV ...` (verifiers' vf-eval with the "
      "same flags) become `vf-eval ENV ...`; `--skip-upload`/`--follow` are dropped, `--hosted` and a call "
      "without `-b` (Prime Inference) are flagged.",
      "vf-eval my-env -a '{\"difficulty\": \"hard\"}' -n 10 -r 3 -b http://x/v1 -k KEY -T 0.7 -s",
      "vf-eval my-env --taskset.difficulty hard -n 10 -r 3 --base-url http://x/v1 --api-key-var KEY "
      "--sampling.temperature 0.7"),
    R("SCR002", "script", "verifiers 0.4.0 / v1 eval flags → our vf-eval",
      "`eval`/`uv run eval` (v1 v0.2–0.3) and 0.4.0 `vf-eval` dotted flags: `--env.taskset.X` → "
      "`--taskset.X`; `--client.base-url` → `--base-url`; `--client.api-key-var` → `--api-key-var`; "
      "`--num-rollouts`/`--num-tasks`/`--select.limit` → `-r`/`-n`; `-s` → `--select.shuffle true`; "
      "`--env.agent.max-turns` → `--max-turns`; `@ x.toml` → `--config x.yaml`; `-v1` id suffix dropped; "
      "`--no-push`/`--rich.*` dropped.",
      "uv run eval reverse-text-v1 --num-tasks 5 --env.taskset.size 50 --client.base-url http://x/v1",
      "vf-eval reverse-text -n 5 --taskset.size 50 --base-url http://x/v1"),
    R("SCR003", "script", "vf-vllm → vf-serve",
      "`vf-vllm --model M` becomes `vf-serve --model M`; vLLM-only flags are flagged.",
      "vf-vllm --model Qwen/Qwen3-0.6B --port 8000", "vf-serve --model Qwen/Qwen3-0.6B --port 8000"),
    R("SCR004", "script", "old trainers → vf-train",
      "`vf-train @ cfg.toml` (in-tree v0 trainer), `vf-rl @ cfg.toml` and `prime-rl @ cfg.toml` become "
      "`vf-train cfg.yaml` (the config is migrated by CFG004, which states the loss). The default loss "
      f"is now IPO with eps {IPO_EPS:g}.",
      "vf-train @ configs/train.toml", "vf-train configs/train.yaml"),
    R("SCR005", "script", "vf-replay → vf-eval --score",
      "0.4.0 `vf-replay RUN` (offline re-scoring) becomes `vf-eval --score RUN`.",
      "vf-replay outputs/run1", "vf-eval --score outputs/run1"),
    R("SCR900", "script", "removed commands: flagged",
      "`vf-install`, `vf-tui`, `vf-setup`, `vf-build`, `vf-gepa`, `vf-debug`, "
      "`serve` and bare `validate`/`debug`/`gepa` have no vf equivalent; the line gets a "
      "`# TODO(vf-migrate)` comment saying what to do instead.",
      "vf-install my-env",
      "vf-install my-env  # TODO(vf-migrate): vf-install is gone; pip install -e the package, or pass "
      "the module path to vf-eval"),
    # ---- configs -------------------------------------------------------------------------------
    R("CFG001", "config", "v0 eval TOML → YAML config",
      "A v0 eval TOML (top-level defaults + `[[eval]]` tables) becomes one `--config` YAML per eval "
      "(`x.yaml`, or `x.<name>.yaml` for several); the TOML is removed (its `.bak` kept). "
      "`num_examples` → `select.limit`, `rollouts_per_example` → `num_rollouts`, `args` → taskset "
      "fields, `sampling_args`/`max_tokens`/`temperature` → `sampling`, `extra_env_kwargs.max_turns` → "
      "`max_turns`; `endpoint_id`/`endpoints_path`/`[[ablation]]` are flagged.",
      "model = \"m\"\nnum_examples = 5\n[[eval]]\nenv_id = \"my-env\"\nargs = {difficulty = \"hard\"}",
      "taskset:\n  id: my-env\n  difficulty: hard\nmodel: m\nselect:\n  limit: 5"),
    R("CFG002", "config", "v1 v0.2.x / v0.3.x TOML → YAML config",
      "`num_tasks` → `select.limit`, `num_rollouts` → `num_rollouts`, `[taskset]`/`[env.taskset]` → "
      "`taskset`, `max_turns`/`[env.agent] max_turns` → `max_turns`, `[legacy]` → taskset id + args; "
      "`[harness]`/`[env.agent.runtime]`/`[serve]` flagged.",
      "num_tasks = 5\n[taskset]\nid = \"reverse-text-v1\"", "taskset:\n  id: reverse-text\nselect:\n  limit: 5"),
    R("CFG003", "config", "verifiers 0.4.0 eval TOML → YAML config",
      "`[env.taskset]` → `taskset`, `[client] base_url/api_key_var` → `engine`, `[select]` → `select`, "
      "`[sampling]` → `sampling`, `num_rollouts`, `max_concurrent`, `model`; `[run]`, `push`, `[rich]`, "
      "`output_dir` dropped.",
      "model = \"m\"\n[env.taskset]\nid = \"gsm8k\"\n[client]\nbase_url = \"http://x/v1\"",
      "taskset:\n  id: gsm8k\nmodel: m\nengine:\n  base_url: http://x/v1"),
    R("CFG004", "config", "trainer configs → vf-train YAML with an explicit loss",
      "In-tree v0 `vf-train` TOML (`model`, `[env]`, `[trainer.args]`) and prime-rl-style `[trainer]` "
      "configs (`rl.toml`: `[model]`, `[orchestrator]`, `[[orchestrator.train.env]]`, `[orchestrator.eval]`, "
      "`[trainer.optim]`, `[trainer.loss]`, `max_steps`, `seq_len`) become a vf-train YAML with the same "
      "meaning. `[trainer.loss]`: `type = \"ipo\"` / `ipo_threshold` → `ipo` with that `eps`; `type = "
      "\"icepop\"` → `icepop` with the same ratio band; DPPO (`dppo_mask_*`) and `custom` have no vf loss and "
      f"are flagged. A config that relied on the old default loss states `loss` explicitly (`ipo`, `eps: {IPO_EPS:g}`, "
      "vf's default) and the report says so. `[trainer.model]`: `cp`/`ep` → `parallel.cp`/`parallel.ep`, `ac` → "
      "`trainer.activation_checkpointing`, `compile` → `model.compile`, `impl` → `model.impl`, `seq_len` → "
      "`trainer.seq_len`; `max_async_level` (how far inference may run ahead) → `async.max_off_policy_steps`, "
      "the staleness bound; an env's `harness`/`runtime` → `env.agent.*`; `[trainer.model.lora]` → `lora` "
      "when vf-train has LoRA, else the config is refused (not converted: it would fine-tune every weight). "
      "Several training envs become a `tasksets` mixture when vf-train takes one, else the first is kept and "
      "the others are named (manual). Every other key is listed one by one, never dropped silently: `info` "
      "when it only says how the run is deployed (wandb, deployment, inference, log, attn, tp, ...), "
      "`manual` otherwise.",
      "model = \"Qwen/Qwen3-0.6B\"\n[env]\nid = \"my-env\"\n[trainer.args]\nlearning_rate = 1e-6\nmax_steps = 100",
      f"model:\n  path: Qwen/Qwen3-0.6B\ntaskset:\n  id: my-env\nloss:\n  name: ipo\n  params:\n    eps: {IPO_EPS:g}\n"
      "optim:\n  lr: 1.0e-06\nsteps: 100"),
    R("CFG900", "config", "pyproject [tool.verifiers.eval]: flagged",
      "`[tool.verifiers.eval] num_examples/rollouts_per_example` defaults are not read by vf; pass "
      "`-n`/`-r` or a `--config` YAML. The pyproject is not rewritten.",
      "[tool.verifiers.eval]\nnum_examples = 5", "(pass -n 5 to vf-eval)"),
    # ---- run dirs ------------------------------------------------------------------------------
    R("RUN001", "rundir", "v0 results.jsonl + metadata.json → traces.jsonl + config.yaml",
      "Each v0 row becomes an Episode: prompt messages → unsampled nodes, completion → nodes "
      "(assistant sampled), `reward` → rewards.reward (the v0 weighted total), `metrics` → metrics, "
      "`error` → errors. Task data = idx (example_id), prompt/system_prompt, answer, info, so the "
      "migrated taskset re-scores (`vf-eval --score DIR`) and resumes them. metadata.json → config.yaml.",
      "results.jsonl: {\"example_id\": 0, \"prompt\": [...], \"completion\": [...], \"reward\": 1.0}",
      "traces.jsonl: {\"task\": {\"data\": {\"idx\": 0, ...}}, \"traces\": [{\"nodes\": [...], \"rewards\": "
      "{\"reward\": {\"score\": 1.0, \"weight\": 1.0}}}]}"),
    R("RUN002", "rundir", "v1 generations A–E → our traces",
      "Sniffed by shape, not version: bare-trace lines (A: results.jsonl, B: traces.jsonl) are wrapped "
      "in an Episode; Episode lines (C, D, E) are kept; float rewards become {score, weight: 1}; nested "
      "timing is flattened; usage keeps integer counts; verifiers-only task fields are dropped; "
      "config.toml / configs/eval.json / configs/resolved/eval.json become config.yaml (`-v1` id suffix "
      "dropped).",
      "traces.jsonl: {\"nodes\": [...], \"rewards\": {\"lcs\": 0.5}}",
      "traces.jsonl: {\"traces\": [{\"nodes\": [...], \"rewards\": {\"lcs\": {\"score\": 0.5, \"weight\": 1.0}}}]}"),
    # ---- every input ---------------------------------------------------------------------------
    R("SRC900", "input", "files past a limit: refused, the rest migrated",
      "A Python module vf-migrate would parse is refused when it is larger than 256 KB, nests deeper than 200 "
      "syntax levels, or is past what Python's own parser takes (e.g. 2000 nested parentheses); a file larger "
      "than 64 MB is not read. It is checked with Python's parser before libcst sees it, so no input crashes "
      "the run. A refused file is listed (status `refused`, naming the limit) and left unchanged; every other "
      "file is still migrated (and written with --write), then the command exits 2.",
      "vf-migrate . --check   # envs/generated.py: 5.5 MB",
      "envs/generated.py:1: [SRC900] refused: not migrated: the module is 5.2 MB (vf-migrate parses Python "
      "modules up to 256 KB) ...  (exit 2)"),
]

BY_ID = {r.id: r for r in RULES}


def markdown() -> str:
    """The rule table as markdown, one section per rule with before/after examples."""
    out = ["# vf-migrate rules", "",
           "`vf-migrate PATH...` prints a unified diff and a summary (dry run); `--write` applies it "
           "(refused on a git tree with uncommitted changes to tracked files unless `--force`; every "
           "changed or removed file keeps a `.bak`); `--check` exits 1 when anything would change; "
           "`--json` prints the report (file, line, rule, status). It never imports or runs the code it "
           "migrates (Python is rewritten with libcst). A second run changes nothing.", "",
           "Status `migrated`: done. `manual`: kept and marked `TODO(vf-migrate)`; a person must finish "
           "it. `info`: a note. `refused`: a file past a limit, left unchanged (exit 2).", ""]
    kind = None
    titles = {"environment": "v0 environment modules", "script": "Scripts and CI files",
              "config": "Config files", "rundir": "Run dirs", "input": "Every input"}
    for r in RULES:
        if r.kind != kind:
            kind = r.kind
            out += [f"## {titles[kind]}", ""]
        out += [f"### {r.id}: {r.title}", "", r.description, "", "Before:", "", "```", r.before, "```", "",
                "After:", "", "```", r.after, "```", ""]
    return "\n".join(out)


if __name__ == "__main__":
    print(markdown(), end="")
