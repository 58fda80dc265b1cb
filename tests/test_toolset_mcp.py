"""Toolsets as MCP: naming, typed per-rollout state (also on a shared server), content results,
tool errors and timeouts recorded and shown to the model, served toolsets (a server process per
rollout, a standalone `Toolset.run()` reached by URL), and no server outliving its rollout."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

import vf
from vf.episode.tools import open_shared_tools, open_tools
from vf.toolset import SharedToolsetConfig, ToolError, ToolsetConfig

sys.path.insert(0, str(Path(__file__).parent))
from mcp_tools import PNG, AsyncSetup, CountState, Probe

SERVED = ToolsetConfig(runtime={"type": "subprocess"})


def run(coro):
    return asyncio.run(coro)


def children() -> set[int]:
    """Live (non-zombie) child processes of this test process."""
    me, out = str(os.getpid()), set()
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = Path(f"/proc/{d}/stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if fields[1] == me and fields[0] != "Z":
                out.add(int(d))
    return out


class RolloutState(vf.State):
    """The task's state: a different class than the toolset's, sharing the `calls` field."""

    calls: int = 0


async def _exercise(config: ToolsetConfig) -> dict:
    state, trace = RolloutState(), vf.Trace()
    ctx = {"state": state, "trace": trace}
    out: dict = {}
    async with open_tools([Probe(config)], state, timeout=5) as tools:
        out["names"] = sorted(s["function"]["name"] for s in tools.schemas)
        out["echo"] = await tools.call("probe_echo", '{"text": "x"}', ctx)
        out["echo2"] = await tools.call("probe_echo", {"text": "y"}, ctx)
        out["image"] = await tools.call("probe_image", {}, ctx)
        tools.timeouts["probe_slow"] = 0.3
        for name, args in (("probe_boom", {}), ("probe_slow", {"seconds": 5}), ("probe_echo", {"txt": 1})):
            with pytest.raises(ToolError) as err:
                await tools.call(name, args, ctx)
            out.setdefault("errors", []).append(str(err.value))
        out["pid"] = int(await tools.call("probe_pid", {}, ctx))
    out["calls"] = state.calls
    out["recorded"] = [(e["tool"], e["type"]) for e in trace.info["tool_errors"]]
    return out


def test_tool_names_follow_verifiers_prefix_rules():
    class WebSearch(vf.Toolset):
        @vf.tool(name="find")
        def search(self, q: str) -> str:
            return q

    class Bare(WebSearch):
        TOOL_PREFIX = None

    assert list(WebSearch().tools()) == ["web_search_find"]  # "" → snake-cased class name
    assert list(Bare().tools()) == ["find"]
    assert list(Probe().tools())[0].startswith("probe_")
    assert vf.toolset.prefix_name("x", "y") == "x_y" and vf.toolset.prefix_name(None, "y") == "y"


def test_generic_parameters_default_like_verifiers():
    class Cfg(ToolsetConfig):
        depth: int = 2

    class One(vf.Toolset[Cfg]):
        pass

    assert One.config_class() is Cfg and One.state_class() is vf.State
    assert Probe.config_class() is ToolsetConfig and Probe.state_class() is CountState
    assert One().config.depth == 2 and vf.Toolset().config == ToolsetConfig()
    assert Probe(state=CountState(calls=4)).state.calls == 4


def test_in_process_results_errors_and_timeouts():
    out = run(_exercise(ToolsetConfig()))
    assert out["echo"] == "hi x" and out["echo2"] == "hi y"  # setup() ran; text result
    assert out["calls"] == 2  # the toolset's typed view wrote back to the rollout's state
    assert out["image"] == [{"type": "text", "text": "a red pixel"},
                            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}}]
    assert out["errors"][0] == "probe_boom failed: RuntimeError: kaboom"
    assert out["errors"][1] == "probe_slow timed out after 0.3s"
    assert "unexpected arguments ['txt']" in out["errors"][2]
    assert out["recorded"] == [("probe_boom", "RuntimeError"), ("probe_slow", "ToolTimeout"),
                               ("probe_echo", "BadArguments")]
    assert out["pid"] == os.getpid()


def test_async_setup_is_awaited_and_classes_get_the_rollout_state():
    async def go():
        async with open_tools([AsyncSetup], vf.State()) as tools:
            return await tools.call("ready_flag", {}, {})

    assert run(go()) == "true"


def test_shared_toolset_isolates_state_per_rollout():
    shared_probe = Probe(SharedToolsetConfig())

    async def rollout(shared, word):
        state = CountState()
        async with open_tools([], state, shared=shared) as tools:
            for i in range(3):
                await tools.call("probe_echo", {"text": f"{word}{i}"}, {"state": state})
                await asyncio.sleep(0)  # interleave with the other rollout
        return state

    async def go():
        async with open_shared_tools([shared_probe]) as shared:
            return await asyncio.gather(rollout(shared, "a"), rollout(shared, "b"))

    a, b = run(go())
    assert a.seen == ["a0", "a1", "a2"] and b.seen == ["b0", "b1", "b2"]
    assert a.calls == b.calls == 3


def test_harness_episode_shows_tool_errors_and_images_and_goes_on():
    """Through vf.harness, which opens a rollout's toolsets with `open_tools`."""
    from vf.runner import EpisodeSpec, run_episode

    class Data(vf.TaskData):
        answer: str = "ok"

    class ProbeTask(vf.Task[Data, CountState, vf.TaskConfig]):
        toolsets = [Probe]

        @vf.reward
        def done(self, trace) -> float:
            return float(trace.last_reply == "ok")

    call = lambda i, n: {"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": "{}"}}
    replies = [{"role": "assistant", "content": None, "tool_calls": [call(1, "probe_boom"), call(2, "probe_image")]},
               "ok"]

    class Scripted:
        name, supports_tokens = "scripted", False

        async def generate(self, request):
            from vf.engines.base import GenerateResult, Usage

            m = replies.pop(0)
            m = {"role": "assistant", "content": m} if isinstance(m, str) else m
            return GenerateResult(message=m, finish_reason="stop", usage=Usage(1, 1))

    ep = run(run_episode(ProbeTask(Data(prompt="go")), EpisodeSpec(engine=Scripted(), model="m")))
    t = ep.traces[0]
    tool_msgs = [m for m in t.messages if m["role"] == "tool"]
    assert ep.ok and t.reward == 1.0
    assert tool_msgs[0]["content"] == "error: probe_boom failed: RuntimeError: kaboom"
    assert tool_msgs[1]["content"][1]["type"] == "image_url"
    assert [e["tool"] for e in t.info["tool_errors"]] == ["probe_boom"]


@pytest.mark.slow
def test_served_toolset_matches_in_process_and_dies_with_its_rollout():
    before = children()
    local, served = run(_exercise(ToolsetConfig())), run(_exercise(SERVED))
    for key in ("echo", "echo2", "image", "calls"):
        assert served[key] == local[key], key
    assert [t for t, _ in served["recorded"]] == [t for t, _ in local["recorded"]]
    assert served["recorded"][0][1] == "ToolServerError"  # the exception ran in the server process
    assert served["errors"][0] == local["errors"][0]  # the server's error text reaches the model
    assert served["errors"][1] == local["errors"][1]
    assert served["pid"] != os.getpid()
    assert children() == before  # the server process is gone with its rollout


@pytest.mark.slow
def test_served_server_that_crashes_or_hangs_is_recorded_and_the_rollout_goes_on():
    async def go():
        state, trace = CountState(), vf.Trace()
        ctx = {"state": state, "trace": trace}
        async with open_tools([Probe(SERVED)], state, timeout=1.0) as tools:
            errors = []
            for name in ("probe_hang", "probe_crash", "probe_echo"):
                with pytest.raises(ToolError) as err:
                    await tools.call(name, {"text": "z"} if name == "probe_echo" else {}, ctx)
                errors.append(str(err.value))
        return errors, trace.info["tool_errors"]

    before = children()
    errors, recorded = run(go())
    assert errors[0] == "probe_hang timed out after 1s"
    assert errors[1].startswith("probe_crash failed") and errors[2].startswith("probe_echo failed")
    assert [e["type"] for e in recorded][0] == "ToolTimeout" and len(recorded) == 3
    assert children() == before


@pytest.mark.slow
def test_standalone_run_is_reached_by_url_without_state():
    env = {**os.environ, "MCP_PORT": "0", "PYTHONPATH": str(Path(__file__).parent)}
    proc = subprocess.Popen([sys.executable, str(Path(__file__).parent / "mcp_tools.py")], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline().split()
        assert line[0] == "vf-mcp-port", proc.stderr.read()
        url = f"http://127.0.0.1:{line[1]}/mcp"

        async def go():
            state = CountState()
            async with open_tools([Probe(ToolsetConfig(url=url))], state) as tools:
                text = await tools.call("probe_echo", {"text": "r"}, {"state": state})
                return text, state, tools.schemas

        text, state, schemas = run(go())
        assert text == "hi r"
        assert state.calls == 0  # a URL server is not ours: no state is sent to it
        echo = next(s for s in schemas if s["function"]["name"] == "probe_echo")["function"]
        assert echo["description"] == "Echo the text back." and echo["parameters"]["required"] == ["text"]
    finally:
        proc.kill()
        proc.wait(timeout=10)


class _Garbage(BaseHTTPRequestHandler):
    def do_POST(self):
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b"{not json-rpc at all")

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("garbage", [False, True])
def test_unreachable_or_garbage_server_is_a_toolset_error(garbage):
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Garbage)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}/mcp" if garbage else "http://127.0.0.1:9/mcp"

    async def go():
        async with open_tools([Probe(ToolsetConfig(url=url))], CountState()):
            pass

    try:
        with pytest.raises(vf.toolset.ToolsetError, match="did not answer"):
            run(go())
    finally:
        httpd.shutdown()


class InRuntime(vf.Toolset):
    @vf.tool
    async def where(self, runtime) -> str:
        return (await runtime.run("pwd")).stdout.strip()


def test_a_tool_that_takes_the_runtime_is_hidden_from_the_model_and_never_served():
    """`runtime` is vf's to fill: it is no parameter of the tool's schema, and a toolset configured
    to be served (another process, where the rollout's runtime does not exist) is refused at open."""
    assert InRuntime.needs_runtime() and not Probe.needs_runtime()
    assert vf.toolset.tool_schema(InRuntime.where, "where")["function"]["parameters"]["properties"] == {}

    async def go():
        async with open_tools([InRuntime(ToolsetConfig(url="http://127.0.0.1:9/mcp"))], vf.State()):
            pass

    with pytest.raises(vf.toolset.ToolsetError, match="cannot be served"):
        run(go())


@pytest.mark.slow
def test_server_dies_when_vf_is_killed(tmp_path):
    """A served toolset's process must not outlive a `kill -9` of the process that started it."""
    import signal
    import time

    script = tmp_path / "holder.py"
    script.write_text(
        "import asyncio, sys\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from vf.toolset import ToolsetConfig\n"
        "from vf.episode.tools import open_tools\n"
        "from mcp_tools import CountState, Probe\n"
        "async def main():\n"
        "    async with open_tools([Probe(ToolsetConfig(runtime={'type': 'subprocess'}))], CountState()) as t:\n"
        "        print(await t.call('probe_pid', {}, {}), flush=True)\n"
        "        await asyncio.sleep(60)\n"
        "asyncio.run(main())\n")
    holder = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    server_pid = int(holder.stdout.readline())
    assert Path(f"/proc/{server_pid}").exists()
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=10)
    for _ in range(50):
        if not Path(f"/proc/{server_pid}").exists() or "Z" in Path(f"/proc/{server_pid}/stat").read_text().split()[2]:
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"tool server {server_pid} outlived its killed parent")
