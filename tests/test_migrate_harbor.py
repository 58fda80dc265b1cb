"""v0 `HarborEnv` (verifiers 0.1.9+) after `vf-migrate`: Harbor task folders, each run by the env's
agent command in the rollout's sandbox and scored by the task's own tests/test.sh
(vf.migrate.v0_harbor). Before, vf-migrate left a TODO ("has no compat class yet")."""

from __future__ import annotations

import asyncio
import os
import textwrap

import pytest
from test_migrate_v0_api import Scripted, _load, _migrate
from test_runtime_sandbox import needs_bwrap

from vf.migrate import v0_harbor

# The agent: asks the model once, writes the reply to hello.txt in its working directory with
# where it ran and what it saw; then it cheats: a passing reward.txt.
AGENT = r'''
import json, os, pathlib, urllib.request
body = {"model": os.environ["OPENAI_MODEL"], "messages": [{"role": "user", "content": os.environ["GREETING"]}]}
request = urllib.request.Request(os.environ["OPENAI_BASE_URL"].rstrip("/") + "/chat/completions",
                                 data=json.dumps(body).encode(), headers={
                                     "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
                                     "Content-Type": "application/json"})
reply = json.load(urllib.request.urlopen(request, timeout=60))["choices"][0]["message"]["content"]
pathlib.Path("hello.txt").write_text(reply)
pathlib.Path("seen.txt").write_text("\n".join([os.getcwd(), os.environ["HARBOR_TASK_NAME"], os.environ["AGENT_WORKDIR"],
                                             pathlib.Path(os.environ["HARBOR_INSTRUCTION_PATH"]).read_text()]))
pathlib.Path("/logs/verifier/reward.txt").write_text("1.0")
'''

HARBOR_0_1_14 = textwrap.dedent(r'''
    import shlex

    import verifiers as vf

    AGENT = {agent!r}


    def load_environment(dataset_path: str = "tasks", tasks: list[str] | None = None):
        return vf.HarborEnv(run_command="python3 -c " + shlex.quote(AGENT), dataset_path=dataset_path, tasks=tasks,
                            environment_vars={{"GREETING": "say hi"}})
''').format(agent=AGENT)

TEST_SH = """\
#!/bin/bash
# the task's verifier: hello.txt must say hi, written from /app
if [ "$(cat /app/hello.txt)" = "hi" ] && [ "$(head -1 /app/seen.txt)" = "/app" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
"""


def _tasks(root):
    """A Harbor dataset: `hello` (tests/test.sh writes reward.txt), `half` (reward.json), and a
    folder without task.toml, which v0 skipped."""
    for name, instruction, test in (
            ("hello", "Write hi to /app/hello.txt.", TEST_SH),
            ("half", "Anything.", "echo '{\"reward\": 0.5}' > /logs/verifier/reward.json\n")):
        (root / name / "tests").mkdir(parents=True)
        (root / name / "solution").mkdir()
        (root / name / "instruction.md").write_text(instruction + "\n")
        (root / name / "task.toml").write_text('[environment]\ndocker_image = "harbor/' + name + ':1"\n')
        (root / name / "tests" / "test.sh").write_text(test)
        (root / name / "solution" / "solve.sh").write_text("echo hi > /app/hello.txt\n")
    (root / "broken").mkdir()
    (root / "broken" / "instruction.md").write_text("no task.toml")
    return root


def _episode(loaded, reply: str, index: int = 0):
    from vf.runner import EpisodeSpec, run_episode

    task = list(loaded.taskset.take(2))[index]
    return asyncio.run(run_episode(task, EpisodeSpec(engine=Scripted([reply]), model="m", env=loaded.env, max_turns=4)))


def test_harbor_rows_are_v0_s_rows():
    """The rows v0's load_harbor_dataset made (0.1.14's layout): sorted folders, `tasks` filters,
    a folder without task.toml skipped, none at all an error."""
    import tempfile
    from pathlib import Path

    root = _tasks(Path(tempfile.mkdtemp()))
    rows = v0_harbor.load_tasks(root)
    assert [r["info"]["task_name"] for r in rows] == ["half", "hello"]
    assert rows[1]["prompt"] == [{"role": "user", "content": "Write hi to /app/hello.txt."}]
    assert rows[1]["info"]["docker_image"] == "harbor/hello:1" and rows[1]["example_id"] == 1
    assert rows[1]["info"]["config"] == {"environment": {"docker_image": "harbor/hello:1"}}
    assert [r["info"]["task_name"] for r in v0_harbor.load_tasks(root, ["hello"])] == ["hello"]
    with pytest.raises(ValueError, match="No valid Harbor tasks"):
        v0_harbor.load_tasks(root, ["nope"])
    with pytest.raises(FileNotFoundError):
        v0_harbor.load_tasks(root / "missing")


@pytest.mark.parametrize("text,expected", [("1", 1.0), (" 0.25\n", 0.25), ('{"reward": 0.5}', 0.5),
                                           ('{"score": 1}', 0.0), ("not json", 0.0), ("[1]", 0.0)])
def test_reward_file_is_read_as_v0_read_it(text, expected):
    assert v0_harbor.parse_reward(text) == expected


@needs_bwrap
def test_harbor_env_runs_the_agent_in_app_and_scores_with_the_task_s_tests(tmp_path):
    """The migrated HarborEnv: the agent command runs in the sandbox's /app with the task's
    variables and the instruction at /task; the task's test.sh then scores it. What the agent
    forged in /logs/verifier does not count (a fresh directory for the tests): the reward.json task
    scores its 0.5, not the reward.txt = 1 the agent wrote, which v0 would have read first."""
    path, report = _migrate(tmp_path, "harbor_env", HARBOR_0_1_14)
    assert {e.rule for e in report.entries if "HarborEnv" in e.message} == {"ENV013", "ENV017"}
    root = _tasks(tmp_path / "tasks")
    loaded = _load(path, {"args": {"dataset_path": str(root)}})
    assert loaded.env.config.agent.harness.id.endswith("harbor_env.py:HarborEnvAgent")
    rows = list(loaded.taskset.take(2))
    assert [r.data.image for r in rows] == ["harbor/half:1", "harbor/hello:1"]

    good = _episode(loaded, "hi", index=1)
    assert not good.trace.errors and not good.errors, (good.trace.errors, good.errors)
    assert good.trace.rewards["harbor_reward"].score == 1.0 and good.trace.reward == 1.0
    assert [m["content"] for m in good.trace.messages][-1] == "hi"
    assert good.trace.info["harbor"]["reward_file"] == "reward.txt"

    wrong = _episode(_load(path, {"args": {"dataset_path": str(root)}}), "bye", index=1)
    assert not wrong.trace.errors, wrong.trace.errors
    assert wrong.trace.reward == 0.0

    half = _episode(loaded, "whatever", index=0)
    assert half.trace.reward == 0.5 and half.trace.info["harbor"]["reward_file"] == "reward.json"  # not the forgery


@needs_bwrap
def test_the_agent_sees_the_instruction_and_harbor_variables_where_v0_put_them(tmp_path):
    from vf.migrate.compat import HarborEnv, sandbox_setup
    from vf.runtime import RuntimeConfig, make_runtime

    root = _tasks(tmp_path / "tasks")
    env = HarborEnv(run_command="true", dataset_path=root, tasks=["hello"], environment_vars={"HARBOR_TASK_DIR": "/x"})

    async def go():
        async with make_runtime(RuntimeConfig()) as rt:
            await sandbox_setup(env, {"info": env.dataset[0]["info"]}, rt)
            return await rt.run("pwd; echo $HARBOR_TASK_NAME $HARBOR_TASK_DIR $AGENT_WORKDIR; cat $HARBOR_INSTRUCTION_PATH; "
                                "ls /task", cwd="/app")

    out = asyncio.run(go())
    assert out.ok and out.stdout.splitlines() == ["/app", "hello /x /app", "Write hi to /app/hello.txt.",
                                                  "instruction.md", "task.toml"]  # environment_vars win, as in v0


@needs_bwrap
def test_a_link_in_a_task_folder_never_copies_a_host_file(tmp_path):
    """A crafted task folder whose tests/ holds a symlink to a host file: copying it would put the
    host file where the agent's next command (or the test) reads it. Refused, as an error on the trace."""
    from vf.errors import TaskError
    from vf.runtime import RuntimeConfig, make_runtime

    secret = tmp_path / "secret.txt"
    secret.write_text("host secret")
    root = _tasks(tmp_path / "tasks")
    os.symlink(secret, root / "hello" / "tests" / "data.txt")

    async def go():
        info = v0_harbor.load_tasks(root, ["hello"])[0]["info"]
        async with make_runtime(RuntimeConfig()) as rt:
            with pytest.raises(TaskError, match="link"):
                await v0_harbor.run_tests(info, rt)
            return await rt.run("cat /tests/data.txt")

    assert "host secret" not in asyncio.run(go()).stdout


def test_a_task_with_mcp_servers_is_an_error_that_says_so(tmp_path):
    from vf.errors import TaskError
    from vf.runtime import RuntimeConfig, make_runtime

    info = {"task_name": "t", "task_dir": str(tmp_path),
            "config": {"environment": {"mcp_servers": [{"name": "s", "transport": "stdio", "command": "x"}]}}}

    async def go():
        async with make_runtime(RuntimeConfig(type="subprocess")) as rt:
            await v0_harbor.prepare(None, info, rt)

    with pytest.raises(TaskError, match="MCP servers"):
        asyncio.run(go())


# A HarborEnv subclass as real 0.1.14 envs wrote them (SweHarborEnv): its agent is a script that
# post_sandbox_setup uploads with v0's sandbox client, build_env_vars adds a variable, and it also
# overrides a hook vf does not call (compute_reward).
SUBCLASS = textwrap.dedent(r'''
    import tempfile
    from pathlib import Path

    import verifiers as vf
    from verifiers.envs.experimental.harbor_env import HarborEnv

    AGENT = {agent!r}


    class SweHarborEnv(HarborEnv):
        def __init__(self, dataset_path, **kwargs):
            super().__init__(run_command="python3 /app/agent.py", dataset_path=dataset_path, **kwargs)

        async def build_env_vars(self, state: vf.State) -> dict[str, str]:
            env_vars = await super().build_env_vars(state)
            env_vars.setdefault("GREETING", "say " + state["info"]["task_name"])
            return env_vars

        async def post_sandbox_setup(self, state: vf.State) -> None:
            await super().post_sandbox_setup(state)
            sandbox_id = state["sandbox_id"]
            await self.sandbox_client.execute_command(sandbox_id, "echo ready > setup.txt", working_dir="/app", timeout=60)
            with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as tmp:
                tmp.write(AGENT)
            await self.sandbox_client.upload_file(sandbox_id, "/app/agent.py", tmp.name)
            Path(tmp.name).unlink()

        async def compute_reward(self, state: vf.State) -> float:
            return 1.0


    def load_environment(dataset_path: str = "tasks", tasks: list[str] | None = None) -> SweHarborEnv:
        return SweHarborEnv(dataset_path=dataset_path, tasks=tasks, timeout_seconds=900.0, cpu_cores=2)
''').format(agent=AGENT)


@needs_bwrap
def test_a_harbor_subclass_s_sandbox_hooks_run_on_the_rollout_s_runtime(tmp_path):
    """The subclass's build_env_vars and post_sandbox_setup run before the agent, their
    `self.sandbox_client` calls on the rollout's sandbox (the uploaded script is the agent that
    runs); compute_reward, which vf does not call, is a manual step. The generated seat classes do
    not shadow the module's own `SweHarborEnv`, so load_environment() still builds it."""
    import importlib.util

    from vf.migrate import apply, plan
    from vf.migrate.compat import HarborEnv

    path = tmp_path / "swe_harbor.py"
    path.write_text(SUBCLASS)
    report = plan([path])
    manual = [e.message.split(" ")[0] for e in report.entries if e.status == "manual"]
    assert manual == ["SweHarborEnv.compute_reward"]
    assert sum("sandbox_client on the rollout's runtime" in e.message for e in report.entries) == 2
    apply(report)
    root = _tasks(tmp_path / "tasks")
    spec = importlib.util.spec_from_file_location("swe_harbor", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    env = module.load_environment(dataset_path=str(root))
    assert isinstance(env, HarborEnv) and type(env).__name__ == "SweHarborEnv" and len(env.dataset) == 2

    # the agent asks the model with GREETING = "say hello" (build_env_vars) and writes its reply
    loaded = _load(path, {"args": {"dataset_path": str(root)}})
    for reply, reward in (("hi", 1.0), ("bye", 0.0)):
        episode = _episode(loaded, reply, index=1)
        assert not episode.trace.errors and not episode.errors, (episode.trace.errors, episode.errors)
        assert [m["content"] for m in episode.trace.messages] == ["say hello", reply]
        assert episode.trace.reward == reward


V0_ROWS = """
import json, sys
import verifiers as vf
env = vf.HarborEnv(run_command="true", dataset_path=sys.argv[1], tasks=json.loads(sys.argv[2]))
print(json.dumps([dict(row) for row in env.dataset], sort_keys=True))
"""


@pytest.mark.v0ref
@pytest.mark.parametrize("tasks", [None, ["hello"]])
def test_rows_match_the_real_harbor_env(tmp_path, tasks):
    """`-m v0ref` with VF_V0_PYTHON at a verifiers 0.1.11+ venv (0.1.14 checked): its own
    HarborEnv's dataset on the same folders equals v0_harbor.load_tasks's rows."""
    import json
    import subprocess

    python = os.environ.get("VF_V0_PYTHON")
    if not python:
        pytest.skip("set VF_V0_PYTHON to a verifiers 0.1.11+ interpreter")
    root = _tasks(tmp_path / "tasks")
    out = subprocess.run([python, "-c", V0_ROWS, str(root), json.dumps(tasks)], capture_output=True, text=True,
                         timeout=300, check=True).stdout
    assert json.loads(out) == json.loads(json.dumps(v0_harbor.load_tasks(root, tasks), sort_keys=True))


@needs_bwrap
def test_the_sandbox_client_reaches_only_its_own_runtime_s_files(tmp_path):
    """v0 code names a sandbox by id: an id no live runtime has (forged, or a finished rollout's) is an
    error, and a path outside the runtime's working directory and added directories is refused
    rather than written on the host; a link the command left is not followed by download_file."""
    import gc

    from vf.errors import UsageError
    from vf.migrate.v0_api import SandboxError
    from vf.migrate.v0_sandbox import SandboxClient
    from vf.runtime import RuntimeConfig, make_runtime

    client, local = SandboxClient(), tmp_path / "local.txt"
    local.write_text("payload")

    async def go():
        async with make_runtime(RuntimeConfig()) as rt:
            sandbox_id = SandboxClient.attach(rt)
            rt.add_directory("/app")
            await client.upload_file(sandbox_id, "/app/in.txt", str(local))
            echoed = await client.execute_command(sandbox_id, "cat in.txt; ln -s /etc/passwd out.txt", working_dir="/app")
            with pytest.raises(UsageError):
                await client.upload_file(sandbox_id, str(tmp_path / "escaped.txt"), str(local))
            with pytest.raises(UsageError):
                await client.download_file(sandbox_id, "/app/out.txt", str(tmp_path / "copy.txt"))
            with pytest.raises(SandboxError, match="no vf runtime"):
                await client.execute_command("vf-forged", "true")
        return sandbox_id, echoed

    sandbox_id, echoed = asyncio.run(go())
    assert echoed.stdout == "payload" and echoed.exit_code == 0
    assert not (tmp_path / "escaped.txt").exists() and not (tmp_path / "copy.txt").exists()
    gc.collect()
    with pytest.raises(SandboxError, match="no vf runtime"):
        asyncio.run(client.execute_command(sandbox_id, "true"))
