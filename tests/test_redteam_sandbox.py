"""Red team: a hostile model with the `bash` harness against the real sandbox runtime.

Each test is one attack from issue 22, run the way a model would run it (the harness's own
`bash`/`edit` tools, through the in-process loop's `run_tools` where the harness's timeout matters), and
asserts what the host must keep: its files, contents and owners, its memory, its disk, and
that nothing a command started outlives the call or vf itself.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest
from test_runtime_sandbox import needs_bwrap

import vf
from vf.episode.harnesses import make_harness
from vf.episode.rollout import Rollout, SeatSpec
from vf.harness import HarnessConfig
from vf.runtime import RuntimeConfig, make_runtime
from vf.trace import Trace

pytestmark = needs_bwrap


async def open_rollout(tool_timeout: float = 10.0, **runtime) -> Rollout:
    """A bash-harness rollout with a real sandbox runtime (the engine is never called)."""
    spec = SeatSpec(engine=None, model="m", harness=make_harness(HarnessConfig(id="bash", tool_timeout=tool_timeout)),
                    runtime={"type": "sandbox", **runtime})
    rollout = Rollout(vf.Task(vf.TaskData(prompt="x")), Trace(), spec)
    assert await rollout.open(), rollout.trace.errors
    return rollout


async def call(rollout: Rollout, name: str, **arguments) -> str:
    """One tool call as the model makes it; the tool message's content."""
    await rollout.seat.run_tools(rollout, [{"id": "c", "function": {"name": name, "arguments": json.dumps(arguments)}}])
    return rollout.trace.nodes[-1].message["content"]


def processes_with(mark: str) -> list[int]:
    """Live (not zombie) host processes whose command line contains `mark`."""
    out = []
    for d in os.listdir("/proc"):
        try:
            if mark.encode() in Path(f"/proc/{d}/cmdline").read_bytes() and \
                    Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                out.append(int(d))
        except (OSError, ValueError, IndexError):
            continue
    return out


def du_kib(path: Path) -> int:
    return int(subprocess.run(["du", "-sk", str(path)], capture_output=True, text=True, check=True).stdout.split()[0])


@pytest.fixture
def host_files(tmp_path):
    """A 644 file and a 600 secret on the host (root's, as tests run in CI), outside any sandbox."""
    victim, secret = tmp_path / "host" / "victim.txt", tmp_path / "host" / "secret.txt"
    victim.parent.mkdir()
    victim.write_text("ROOT-OWNED ORIGINAL x = 1\n")
    victim.chmod(0o644)
    token = f"TOPSECRET-{uuid.uuid4().hex}"
    secret.write_text(f"{token} x = 1\n")
    secret.chmod(0o600)
    before = {p: (p.read_bytes(), p.stat().st_uid, p.stat().st_gid, stat.S_IMODE(p.stat().st_mode))
              for p in (victim, secret)}
    yield victim, secret, token
    after = {p: (p.read_bytes(), p.stat().st_uid, p.stat().st_gid, stat.S_IMODE(p.stat().st_mode))
             for p in (victim, secret)}
    assert after == before  # content, owner and mode of both host files untouched


SWAP = """
while :; do
  mv -f .stash/victim f; mv -f f .stash/victim      # f: a hard link to the host's 644 file
  ln -sfn {victim} f; rm -f f                       # f: a symlink to it
  mv -f .stash/secret f; mv -f f .stash/secret      # f: a hard link to the host's 600 secret
  ln -sfn {secret} f; rm -f f                       # f: a symlink to it
  mkdir -p d; ln -sfn {host} d/sub; rm -f d/sub     # a symlinked directory on the way
  printf 'x = 1\\n' > f                              # and sometimes a plain file
done
"""


def test_symlink_and_hard_link_race_against_edit_and_read(host_files):
    """A process in the sandbox swaps `f` between hard links and symlinks to host files while
    the model calls `edit` and a hook calls `read` on it, many times. Before: the host's 644
    file was rewritten and chowned to nobody and the secret was read; now every access that
    meets a link is refused, and the secret never reaches a tool result or a read."""
    victim, secret, token = host_files
    if victim.stat().st_dev != Path(tempfile.gettempdir()).stat().st_dev:
        pytest.skip("the work dir and the test's files lie on different filesystems (no hard links)")

    async def go():
        rollout = await open_rollout()
        rt = rollout.runtime
        try:
            stash = rt.workdir / ".stash"
            stash.mkdir()
            os.link(victim, stash / "victim")  # what a process could link while the names were inside
            os.link(secret, stash / "secret")
            if os.geteuid() == 0:  # the sandbox runs as nobody then
                os.chown(stash, 65534, 65534)
            script = SWAP.format(victim=victim, secret=secret, host=victim.parent)
            swapper = asyncio.ensure_future(rt.run(script, timeout=30))
            await asyncio.sleep(0.3)
            seen = []
            for i in range(150):
                for path in ("f", "d/sub/victim.txt", f"{rt.workdir}/f"):
                    seen.append(await call(rollout, "edit", path=path, old_str="x = 1", new_str=f"PWNED {i}"))
                try:
                    seen.append((await rt.read("f")).decode(errors="replace"))
                except Exception as e:  # noqa: BLE001 - a refused read is the point
                    seen.append(str(e))
                await asyncio.sleep(0)
            swapper.cancel()
            await asyncio.gather(swapper, return_exceptions=True)
            return seen, rollout.trace
        finally:
            await rollout.cleanup()

    seen, trace = asyncio.run(go())
    assert not any(token in s for s in seen)
    assert token not in trace.model_dump_json()
    assert any(s.startswith("error: could not read") and "refused" in s for s in seen)  # the links were met


def test_command_outliving_its_tool_timeout_is_gone_when_the_call_returns():
    """The harness's timeout (1 s) cancels the call: before, the command and what it left in the
    background (a `setsid` child, a double fork) lived on until the rollout closed."""
    mark = f"20.{uuid.uuid4().int % 10**8}"  # `sleep 20.<mark>1`: 20 s, a command line of its own

    async def go():
        rollout = await open_rollout(tool_timeout=1.0)
        try:
            t0 = time.monotonic()
            reply = await call(rollout, "bash", command=f"sleep {mark}1 & setsid sleep {mark}2 & "
                                                         f"(sleep {mark}3 &) ; sleep {mark}4")
            return reply, time.monotonic() - t0, processes_with(mark)
        finally:
            await rollout.cleanup()

    reply, took, left = asyncio.run(go())
    assert "timed out" in reply and took < 5
    assert left == []


def test_fork_bomb_past_its_timeout_is_gone_when_the_call_returns():
    mark = f"vfbomb{uuid.uuid4().hex[:8]}"

    async def go():
        rollout = await open_rollout(tool_timeout=1.0, max_processes=64)
        try:
            reply = await call(rollout, "bash", command=f"sh -c 'f() {{ f | f & }}; f; sleep 60' {mark}")
            return reply, processes_with(mark)
        finally:
            await rollout.cleanup()

    reply, left = asyncio.run(go())
    assert "timed out" in reply
    assert left == []


def test_edit_on_a_huge_sparse_file_does_not_load_it():
    """`truncate -s 256M` costs the sandbox nothing; before, `edit` read it whole into vf
    (and decoded it: twice its size in host memory)."""

    async def go():
        rollout = await open_rollout()
        try:
            made = await call(rollout, "bash", command="truncate -s 256M big && echo made")
            before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            reply = await call(rollout, "edit", path="big", old_str="a", new_str="b")
            grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
            return made, reply, grown_kib
        finally:
            await rollout.cleanup()

    made, reply, grown_kib = asyncio.run(go())
    assert made == "made\n"
    assert reply.startswith("error: could not read big") and "max_bytes" in reply
    assert grown_kib < 16 << 10


def test_edit_on_a_fifo_does_not_hang_vf(tmp_path):
    """A FIFO named like a file: before, `edit` blocked vf's event loop in open() until some
    writer came (forever: every rollout of the run stalled)."""
    rt = make_runtime(RuntimeConfig())
    result: list[str] = []

    def edit():
        async def go():
            await rt.run("mkfifo pipe")
            tool = make_harness(HarnessConfig(id="bash")).extra_tools(
                type("R", (), {"runtime": rt})())["edit"][1]
            result.append(await tool({"path": "pipe", "old_str": "a", "new_str": "b"}))
        asyncio.run(go())

    worker = threading.Thread(target=edit, daemon=True)
    worker.start()
    worker.join(5)
    hung = worker.is_alive()
    if hung:  # release the blocked open() so the test ends
        os.close(os.open(rt.workdir / "pipe", os.O_WRONLY | os.O_NONBLOCK))
        worker.join(5)
    asyncio.run(rt.close())
    assert not hung
    assert result and result[0].startswith("error: could not read pipe") and "not a regular file" in result[0]


FILL_WORKDIR = "for i in $(seq 300); do head -c 1048576 /dev/zero > f$i || exit; done; echo done"


@pytest.mark.parametrize("command", [FILL_WORKDIR, "head -c 300M /dev/zero > one-big-file; echo done"])
def test_disk_fill_of_the_work_dir_ends_the_rollout_with_a_limit(command):
    """Before: 300 MB written to host disk, no limit, the rollout went on."""

    async def go():
        rollout = await open_rollout(disk_mb=16)
        try:
            # a second call in the same reply: it must not run once the sandbox is full
            await rollout.seat.run_tools(rollout, [
                {"id": "a", "function": {"name": "bash", "arguments": json.dumps({"command": command})}},
                {"id": "b", "function": {"name": "bash", "arguments": json.dumps({"command": "touch later"})}}])
            tool_messages = [n.message for n in rollout.trace.nodes if n.message.get("role") == "tool"]
            assert [m["tool_call_id"] for m in tool_messages] == ["a"]
            assert not (rollout.runtime.workdir / "later").exists()
            return tool_messages[0]["content"], du_kib(rollout.runtime.workdir), rollout.trace
        finally:
            await rollout.cleanup()

    reply, used_kib, trace = asyncio.run(go())
    assert "disk limit reached" in reply
    assert [e.type for e in trace.errors] == ["RuntimeLimitError"] and "disk" in trace.errors[0].message
    assert trace.stop_condition == "limit" and trace.ok is False
    assert used_kib < 80 << 10  # stopped near the 16 MB cap, not at 300 MB


def test_disk_fill_of_tmp_ends_the_rollout_with_a_limit():
    """The sandbox's /tmp is host memory: before, 300 MB went into it with no limit."""

    async def go():
        rollout = await open_rollout(tmp_mb=8)
        try:
            reply = await call(rollout, "bash", command="head -c 300M /dev/zero > /tmp/x; du -k /tmp/x; exit 1")
            return reply, rollout.trace
        finally:
            await rollout.cleanup()

    reply, trace = asyncio.run(go())
    assert "disk limit reached" in reply
    assert int(reply.split("\n")[1].split()[0]) <= 8 << 10  # the file stopped at the cap
    assert trace.stop_condition == "limit" and [e.type for e in trace.errors] == ["RuntimeLimitError"]


def test_total_memory_of_many_processes_is_capped():
    """8 processes of 96 MB each stay under the per-process cap; together they pass 256 MB."""
    hog = "python3 -c 'import time; x = bytearray(96 << 20); x[::4096] = b\"x\" * len(x[::4096]); time.sleep(20)'"

    async def go():
        rollout = await open_rollout(total_memory_mb=256, tool_timeout=15)
        try:
            t0 = time.monotonic()
            reply = await call(rollout, "bash", command=" & ".join([hog] * 8) + "; wait; echo done")
            return reply, time.monotonic() - t0, rollout.trace
        finally:
            await rollout.cleanup()

    reply, took, trace = asyncio.run(go())
    assert "total_memory limit reached" in reply and took < 10
    assert trace.stop_condition == "limit"


# ---- issue 33: every writable filesystem counts against the limits ------------------------------

async def run_in(command: str, **runtime):
    """(tool reply, trace) of one bash call in a fresh sandboxed rollout."""
    rollout = await open_rollout(tool_timeout=20, **runtime)
    try:
        return await call(rollout, "bash", command=command), rollout.trace
    finally:
        await rollout.cleanup()


def test_the_sandboxes_root_etc_run_and_dev_are_read_only():
    """Before: / , /etc, /run and /dev were bwrap's own tmpfs, 12 GB of host memory each, outside
    tmp_mb and total_memory_mb: 20 MB went into each with limits of 256/8 MB and `limit=None`."""
    command = ("for d in / /etc /run /dev; do head -c 20M /dev/zero > $d/fill 2>/dev/null && echo \"held $d\"; done; "
               "echo x > /dev/null && echo devnull-ok; echo ok > ~/home.txt && cat ~/home.txt")
    reply, trace = asyncio.run(run_in(command, tmp_mb=8, total_memory_mb=256))
    assert "held" not in reply, reply
    assert "devnull-ok" in reply and "ok" in reply.splitlines()  # devices and the work dir still work
    assert trace.stop_condition is None and not trace.errors


def test_dev_shm_is_capped_and_a_fill_ends_the_rollout_with_a_limit():
    """Before: 20 MB went into /dev/shm with tmp_mb=8, and the result said limit=None."""
    reply, trace = asyncio.run(run_in("head -c 20M /dev/zero > /dev/shm/x; du -k /dev/shm/x; sleep 1; exit 1", tmp_mb=8))
    assert "disk limit reached" in reply
    assert trace.stop_condition == "limit" and [e.type for e in trace.errors] == ["RuntimeLimitError"]


def test_tmp_and_dev_shm_together_count_against_tmp_mb():
    """Each under its own 8 MB cap, 12 MB together: past tmp_mb, stopped while it holds them."""
    command = "head -c 6M /dev/zero > /tmp/a; head -c 6M /dev/zero > /dev/shm/b; echo wrote; sleep 5; echo survived"
    reply, trace = asyncio.run(run_in(command, tmp_mb=8))
    assert "wrote" in reply and "survived" not in reply and "disk limit reached" in reply, reply
    assert trace.stop_condition == "limit"


def test_tmpfs_counts_against_total_memory():
    """/tmp is host memory: 24 MB in it, with total_memory_mb=16 (and room in tmp_mb), is over the
    memory limit. Before: no limit at all."""
    reply, trace = asyncio.run(run_in("head -c 24M /dev/zero > /tmp/a; echo wrote; sleep 5; echo survived",
                                      tmp_mb=64, total_memory_mb=16))
    assert "total_memory limit reached" in reply and "survived" not in reply, reply
    assert trace.stop_condition == "limit"


def test_no_nested_user_namespace():
    """Before: `unshare -Ur` gave the command uid 0 in a namespace of its own, where it could mount
    filesystems that no limit sees. The refusal (ENOSPC) is not mistaken for a full disk."""
    reply, trace = asyncio.run(run_in("unshare -Ur id; unshare -Urm true && echo nested-ok; echo done"))
    assert "uid=0" not in reply and "nested-ok" not in reply and "done" in reply, reply
    assert trace.stop_condition is None and not trace.errors


LEAVER = """
import asyncio, sys
from vf.runtime import make_runtime, RuntimeConfig
async def main():
    rt = make_runtime(RuntimeConfig())
    await rt.write("notes.txt", "x")
    print(rt.workdir, flush=True)
    await rt.run("sleep {mark}", timeout=60)
asyncio.run(main())
"""


def test_kill_9_of_vf_leaves_no_work_dir_and_no_process():
    """Before: the work dir stayed in /tmp for good (and a sandbox started just before the kill
    could outlive vf: the reaper had not been told its group yet)."""
    mark = f"30.{uuid.uuid4().int % 10**8}"
    proc = subprocess.Popen([sys.executable, "-c", LEAVER.format(mark=mark)], stdout=subprocess.PIPE, text=True)
    workdir = Path(proc.stdout.readline().strip())

    def command() -> list[int]:  # the sandbox's processes (vf's own command line names the mark too)
        return [p for p in processes_with(mark) if p != proc.pid]

    deadline = time.time() + 10
    started: list[int] = []  # kept, not asked again: a launcher process carrying the mark may be gone
    while not started and time.time() < deadline:  # a moment later (exec'd into the command)
        started = command()
        time.sleep(0.01)
    assert workdir.is_dir() and started
    proc.send_signal(signal.SIGKILL)  # as soon as the command starts: vf may not have told its reaper
    proc.wait()
    for _ in range(50):
        if not workdir.exists() and not processes_with(mark):
            break
        time.sleep(0.1)
    assert not workdir.exists()
    assert processes_with(mark) == []
