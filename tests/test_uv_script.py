"""verifiers 0.4's `runtime.prepare_uv_script` on vf's runtimes (vf.runtime.uv_script).

A PEP 723 script's dependencies are resolved on the host (pip, from a local wheel this test
builds, no index), cached, and mounted read-only into the runtime; the sandbox has no network,
so a dependency it imports can only have come from that mount. The last test is a harness
package, as a verifiers user ships one, whose `launch` runs its program through the helper.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest
from test_agent_harnesses import needs_bwrap
from test_peer_harnesses import ENVS, outcome, recorded, scripted  # noqa: F401  (scripted: a fixture)

from vf.errors import HarnessError, UsageError
from vf.runtime import RuntimeConfig, make_runtime
from vf.runtime.uv_script import read_metadata

SCRIPT = """# /// script
# requires-python = ">=3.10"
# dependencies = ["vfdemo==1.0"]
# ///
import os, sys, vfdemo
print(vfdemo.VALUE + 1, os.environ.get("VIRTUAL_ENV") is not None, *sys.argv[1:])
"""
RUNTIMES = ["subprocess", pytest.param("sandbox", marks=needs_bwrap)]


def build_wheel(directory: Path, name: str = "vfdemo", version: str = "1.0", value: int = 41) -> Path:
    """A pure-Python wheel with one module (`VALUE = value`), by hand: no build backend runs."""
    path = directory / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    files = {f"{name}/__init__.py": f"VALUE = {value}\n",
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: vf-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    files[f"{info}/RECORD"] = "".join(f"{f},,\n" for f in [*files, f"{info}/RECORD"])
    with zipfile.ZipFile(path, "w") as z:
        for arcname, text in files.items():
            z.writestr(arcname, text)
    return path


@pytest.fixture
def wheels(tmp_path):
    directory = tmp_path / "wheels"
    directory.mkdir()
    build_wheel(directory)
    return {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(directory)}


@pytest.fixture
def cache(monkeypatch):
    """A fresh agent cache the sandbox's user (nobody, under a root vf) can reach."""
    path = tempfile.mkdtemp(prefix="vf-uv-cache-")
    os.chmod(path, 0o755)
    monkeypatch.setenv("VF_AGENT_CACHE", path)
    yield Path(path)
    subprocess.run(["rm", "-rf", path], check=False)


def test_metadata_is_read_as_pep_723_says():
    assert read_metadata(SCRIPT.encode()).dependencies == ("vfdemo==1.0",)
    assert read_metadata(SCRIPT.encode()).requires_python == ">=3.10"
    assert read_metadata(b"print(1)\n").dependencies == ()
    with pytest.raises(HarnessError, match="not TOML"):
        read_metadata(b"# /// script\n# dependencies = [\n# ///\n")
    with pytest.raises(HarnessError, match="list of requirement strings"):
        read_metadata(b"# /// script\n# dependencies = 'six'\n# ///\n")


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_scripts_dependency_is_installed_on_the_host_and_imported_offline(runtime, wheels, cache, capfd):
    async def go():
        async with make_runtime(RuntimeConfig(type=runtime)) as rt:
            argv = await rt.prepare_uv_script(SCRIPT, wheels)
            first = await rt.run_program([*argv, "a b"], {})
            bare = await rt.run([*(await rt.prepare_uv_script(SCRIPT, wheels, activate=False)), "x"])
            ran = await rt.run_uv_script(SCRIPT.encode(), ["y"], wheels)
            return argv, first, bare, ran

    argv, first, bare, ran = asyncio.run(go())
    assert first.ok and first.stdout == "42 True a b\n", first.stderr
    assert bare.ok and bare.stdout == "42 False x\n", bare.stderr  # activate=False: no VIRTUAL_ENV
    assert ran.ok and ran.stdout == "42 True y\n", ran.stderr
    assert str(cache) in argv[-1] and argv[-1].endswith(".py")  # stored content-addressed in the cache
    err = capfd.readouterr().err
    assert err.count("vf: installing uv-script") == 1 and "vfdemo==1.0" in err  # once, then cached


@needs_bwrap
def test_the_sandbox_cannot_write_the_scripts_environment(wheels, cache):
    """The environment and the script are mounted read-only: one rollout's program cannot
    plant code that the next rollout's runs."""
    attack = SCRIPT.replace("print(", "open(vfdemo.__file__, 'a').write('X = 1')\nprint(")

    async def go():
        async with make_runtime(RuntimeConfig(type="sandbox")) as rt:
            return await rt.run_uv_script(attack, [], wheels)

    result = asyncio.run(go())
    # read-only mount; under a root vf the sandbox's nobody is refused by the file modes first
    assert result.exit_code != 0 and ("Read-only file system" in result.stderr
                                      or "Permission denied" in result.stderr), result.stderr
    (module,) = cache.glob("uv-script-*/venv/lib/python3*/site-packages/vfdemo/__init__.py")
    assert module.read_text() == "VALUE = 41\n"


def test_a_dependency_that_cannot_be_found_is_a_harness_error_naming_it(wheels, cache):
    async def go():
        async with make_runtime(RuntimeConfig(type="subprocess")) as rt:
            await rt.prepare_uv_script(SCRIPT.replace("vfdemo==1.0", "vfdemo==9.9"), wheels)

    with pytest.raises(HarnessError, match="vfdemo==9.9"):
        asyncio.run(go())
    assert not list(cache.glob("uv-script-*/installed.json"))  # a failed install leaves no marker


HARNESS = '''
import json, os
from pathlib import Path
from vf.configs.harness import HarnessConfig
from vf.harness import Harness

PROGRAM = (Path(os.environ["UVPKG_PROGRAM"])).read_text()
__all__ = ["UvHarness"]


class UvHarnessConfig(HarnessConfig):
    answer_file: str = "answer.txt"


class UvHarness(Harness[UvHarnessConfig]):
    APPENDS_SYSTEM_PROMPT = True
    NEEDS_CONTAINER = False

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data):
        system, prompt = self.resolve_text_prompt(data)
        request = {"model": ctx.model, "prompt": prompt or "", "system": system, "max_turns": 4,
                   "answer_file": self.config.answer_file}
        await runtime.write("request.json", json.dumps(request).encode())
        index = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": os.environ["UVPKG_WHEELS"]}
        program = await runtime.prepare_uv_script(PROGRAM, {**self.config.resolved_env, **index})
        env = {**self.config.resolved_env, "OPENAI_BASE_URL": endpoint, "OPENAI_API_KEY": secret}
        return await runtime.run_program([*program, "request.json"], env)
'''


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_harness_package_launching_a_uv_script_runs_like_the_compact_one(runtime, wheels, cache, stub,
                                                                           scripted, tmp_path):  # noqa: F811
    """The compact harness's program, as a uv script that imports its dependency: the same
    rewards and conversations as the recorded verifiers run of the compact package."""
    (tmp_path / "pkg" / "uvpkg").mkdir(parents=True)
    (tmp_path / "pkg" / "uvpkg" / "__init__.py").write_text(HARNESS)
    compact = (ENVS / "compact_harness" / "compact" / "program.py").read_text()
    program = tmp_path / "program.py"
    program.write_text(SCRIPT.split("import os")[0] + "import vfdemo\nassert vfdemo.VALUE == 41\n" + compact)
    scripted("compact")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ENVS), str(tmp_path / "pkg"), os.environ.get("PYTHONPATH", "")]), "FAKE_KEY": "sk-test",
           "NO_COLOR": "1", "UVPKG_PROGRAM": str(program), "UVPKG_WHEELS": wheels["PIP_FIND_LINKS"]}
    proc = subprocess.run([str(Path(sys.executable).parent / "vf-eval"), str(ENVS / "compact_v1.py"), "-m",
                           "bash:cat note.txt", "--client.base-url", stub.url, "--client.api-key-var", "FAKE_KEY",
                           "--no-push", "--no-rich", "--env.agent.runtime.type", runtime,
                           "--env.agent.harness.id", "uvpkg", "--env.agent.harness.answer_file", "final.txt",
                           "-o", str(tmp_path / "run")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert outcome(tmp_path / "run" / "traces.jsonl") == recorded("compact")
    assert proc.stderr.count("vf: installing uv-script") == 1  # three rollouts, one install


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_the_rest_of_verifiers_runtime_api_a_harness_package_calls(runtime):
    """`runtime.env` reaches every command beneath the command's own values; `with_user(None)` is
    the runtime itself and another user is refused; no live processes (ACP) are offered."""
    async def go():
        async with make_runtime(RuntimeConfig(type=runtime)) as rt:
            rt.env = {"TASK_VAR": "task", "BOTH": "task"}
            shown = await rt.with_user(None).run(["sh", "-c", 'echo "$TASK_VAR $BOTH"'], {"BOTH": "command"})
            with pytest.raises(UsageError, match="another user"):
                rt.with_user("agent")
            return shown, rt.process_env({"X": "1"}), rt.supports_live_processes

    shown, merged, live = asyncio.run(go())
    assert shown.stdout == "task command\n"
    assert merged == {"TASK_VAR": "task", "BOTH": "task", "X": "1"} and live is False
