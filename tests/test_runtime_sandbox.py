"""The sandbox runtime stops what the subprocess runtime lets through.

Every threat is run twice with the same command: under `subprocess` it succeeds (so the test
would fail without the sandbox), under `sandbox` it is stopped and recorded on the result.
"""

import asyncio
import os
import socket
import threading

import pytest

from vf.errors import UsageError
from vf.runtime import RuntimeConfig, make_runtime
from vf.runtime import sandbox as sandbox_mod
from vf.runtime import subprocess as subprocess_mod
from vf.runtime.base import RuntimeLimitError
from vf.runtime.docker import docker_available


def _bwrap_works() -> bool:
    if sandbox_mod.find_bwrap() is None:
        return False
    try:
        return asyncio.run(_run("sandbox", "true")).ok
    except Exception:  # noqa: BLE001 - e.g. user namespaces disabled on this host
        return False


async def _run(kind, command, after=None, **config):
    async with make_runtime(RuntimeConfig(type=kind, **config)) as rt:
        result = await rt.run(command)
        if after is not None:
            return result, await after(rt)
        return result


# CI sets VF_REQUIRE_SANDBOX=1: there a sandbox that cannot start fails these tests, not skips them
needs_bwrap = pytest.mark.skipif(not os.environ.get("VF_REQUIRE_SANDBOX") and not _bwrap_works(),
                                 reason="bubblewrap cannot start sandboxes here")


def both(command, after=None, **config):
    return (asyncio.run(_run("subprocess", command, after, **config)),
            asyncio.run(_run("sandbox", command, after, **config)))


def test_sandbox_is_the_default_and_subprocess_warns_once(monkeypatch, capsys):
    assert RuntimeConfig().type == "sandbox"
    monkeypatch.setattr(subprocess_mod, "_warned", False)
    asyncio.run(_run("subprocess", "true"))
    asyncio.run(_run("subprocess", "true"))
    err = capsys.readouterr().err
    assert err.count("no sandbox") == 1 and len(err.strip().splitlines()) == 1


def test_missing_bwrap_is_a_usage_error_saying_how_to_install(monkeypatch):
    monkeypatch.setattr(sandbox_mod, "find_bwrap", lambda: None)
    with pytest.raises(UsageError) as e:
        make_runtime(RuntimeConfig())
    assert e.value.exit_code == 2
    assert "apt-get install bubblewrap" in e.value.hint and "runtime.type subprocess" in e.value.hint


@needs_bwrap
@pytest.mark.skipif(os.geteuid() != 0, reason="commands drop to nobody only when vf runs as root")
def test_root_venv_in_a_private_directory_still_sandboxes(tmp_path, monkeypatch):
    """CI's venv is under `mktemp -d` (0700): nobody, who runs bwrap, could not execute the
    wheel's bwrap there, and every sandboxed command failed with a PermissionError."""
    wheel = sandbox_mod.Path(sandbox_mod.find_bwrap()).resolve()
    site = tmp_path / "private" / "site-packages"
    for path in (wheel, *wheel.parents[2].glob("*.libs/*")):
        copy = site / path.relative_to(wheel.parents[2])
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_bytes(path.read_bytes())
        copy.chmod(0o755)
    (tmp_path / "private").chmod(0o700)
    private = str(site / wheel.relative_to(wheel.parents[2]))
    assert not sandbox_mod.others_can_reach(private)
    monkeypatch.setattr(sandbox_mod, "find_bwrap", lambda: private)
    result = asyncio.run(_run("sandbox", "echo $((40 + 2)); id -u"))
    assert result.ok and result.stdout.split() == ["42", str(sandbox_mod.NOBODY)]


@pytest.mark.skipif(os.geteuid() != 0, reason="commands drop to nobody only when vf runs as root")
def test_a_work_dir_nobody_cannot_reach_is_a_usage_error(tmp_path):
    (tmp_path / "private").mkdir(mode=0o700)
    with pytest.raises(UsageError) as e:
        make_runtime(RuntimeConfig(), tmp_path / "private" / "work")
    assert e.value.exit_code == 2 and "nobody cannot reach" in str(e.value) and "TMPDIR" in e.value.hint


@needs_bwrap
def test_cannot_read_a_file_planted_in_home(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    (home / ".netrc").write_text("machine example.com password hunter2\n")
    monkeypatch.setenv("HOME", str(home))
    command = f"cat {home / '.netrc'}; cat $HOME/.netrc"
    host, boxed = both(command)
    assert "hunter2" in host.stdout and host.ok
    assert "hunter2" not in boxed.stdout + boxed.stderr and not boxed.ok


@needs_bwrap
def test_environment_secrets_do_not_reach_the_sandbox(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-planted-secret")
    host, boxed = both("echo key=$OPENAI_API_KEY")
    assert "sk-planted-secret" in host.stdout
    assert boxed.ok and boxed.stdout.strip() == "key="


@pytest.fixture
def loopback_server():
    srv = socket.create_server(("127.0.0.1", 0))
    srv.settimeout(0.2)
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            conn.sendall(b"pong")
            conn.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield srv.getsockname()[1]
    stop.set()
    t.join(2)
    srv.close()


@needs_bwrap
def test_cannot_connect_to_a_loopback_server_unless_network_is_allowed(loopback_server):
    command = (f"python3 -c \"import socket; s = socket.create_connection(('127.0.0.1', {loopback_server}), 2); "
               f"print(s.recv(4).decode())\"")
    host, boxed = both(command)
    assert host.stdout.strip() == "pong"
    assert boxed.exit_code != 0 and "pong" not in boxed.stdout
    allowed = asyncio.run(_run("sandbox", command, network_allow=["*"]))
    assert allowed.stdout.strip() == "pong"  # the task's network_allow opts in


@needs_bwrap
def test_cannot_outlive_its_time_limit():
    # a detached grandchild (own session) escapes a process-group kill on the host, not the sandbox
    command = "setsid sh -c 'sleep 1; echo late > marker' </dev/null >/dev/null 2>&1 & sleep 30"

    async def later(rt):
        await asyncio.sleep(1.2)
        return (rt.workdir / "marker").exists()

    (host, host_marker), (boxed, boxed_marker) = both(command, later, timeout=0.5)
    assert host.timed_out and boxed.timed_out and boxed.limit == "wall_time"
    assert host_marker is True
    assert boxed_marker is False


@needs_bwrap
def test_process_and_memory_limits_are_recorded_and_the_runtime_goes_on():
    spawn = "for i in $(seq 100); do sleep 1 & done; wait"
    host, boxed = both(spawn, max_processes=32)
    assert host.ok and host.limit is None
    assert boxed.limit == "processes" and not boxed.ok

    hog = "python3 -c 'x = bytearray(512 << 20); print(len(x))'"
    host, boxed = both(hog, memory_mb=256)
    assert host.ok and host.stdout.strip() == str(512 << 20)
    assert boxed.limit == "memory" and boxed.exit_code != 0
    with pytest.raises(RuntimeLimitError, match="memory"):
        boxed.raise_for_limit()


@needs_bwrap
def test_fork_bomb_ends_and_the_same_runtime_still_answers():
    async def go():
        async with make_runtime(RuntimeConfig(max_processes=64, timeout=5)) as rt:
            bomb = await rt.run("f() { f | f & }; f; sleep 1")
            after = await rt.run("echo still here")
            return bomb, after

    bomb, after = asyncio.run(go())
    assert bomb.limit == "processes" and not bomb.ok
    assert after.ok and after.stdout == "still here\n"


@needs_bwrap
def test_cpu_time_and_output_limits():
    cpu = asyncio.run(_run("sandbox", "python3 -c 'while True: pass'", cpu_time=1, timeout=20))
    assert cpu.limit == "cpu_time" and not cpu.timed_out
    out = asyncio.run(_run("sandbox", "yes", max_output_bytes=1000, timeout=20))
    assert out.limit == "output" and len(out.stdout) < 1100


@needs_bwrap
def test_files_written_by_hooks_are_editable_inside_and_paths_stay_inside():
    async def go():
        async with make_runtime(RuntimeConfig()) as rt:
            await rt.write("src/a.txt", "one\n")
            r = await rt.run("echo two >> src/a.txt && cat src/a.txt && touch made")
            with pytest.raises(UsageError):
                await rt.read("../../etc/passwd")
            return r, await rt.read("src/a.txt"), (rt.workdir / "made").exists()

    r, text, made = asyncio.run(go())
    assert r.ok and text == b"one\ntwo\n" and made


@pytest.mark.skipif(not docker_available(), reason="no docker daemon answers")
def test_docker_runtime_isolates_network_and_workdir(loopback_server):
    async def go():
        async with make_runtime(RuntimeConfig(type="docker", timeout=60)) as rt:
            await rt.write("in.txt", "hi")
            r = await rt.run("cat in.txt && echo out > out.txt")
            net = await rt.run(f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', "
                               f"{loopback_server}), 2)\"")
            return r, await rt.read("out.txt"), net

    r, out, net = asyncio.run(go())
    assert r.stdout == "hi" and out == b"out\n" and net.exit_code != 0


def test_task_network_allow_reaches_the_runtime_only_when_set():
    import vf
    from vf.episode.rollout import runtime_for_task

    assert runtime_for_task(None, vf.TaskData(prompt="x")).network_allow == []  # default ["*"] is not a request
    assert runtime_for_task(None, vf.TaskData(prompt="x", network_allow=["pypi.org"])).network_allow == ["pypi.org"]
    assert runtime_for_task({"type": "subprocess"}, vf.TaskData(prompt="x")).type == "subprocess"


@needs_bwrap
def test_host_side_reads_and_writes_follow_no_link(tmp_path):
    """What `read`/`write` do when a command left links in the working directory: a symlink
    (to a file or a directory on the way) or a hard link to a host file is refused on read and
    replaced, never written through, on write; the host file keeps its content and owner."""
    host = tmp_path / "host.txt"
    host.write_text("host\n")

    async def go():
        async with make_runtime(RuntimeConfig()) as rt:
            r = await rt.run(f"ln -s {host} f && ln -s {tmp_path} d && echo x > plain")
            assert r.ok, r.stderr
            refused = []
            for path in ("f", "d/host.txt", "../host.txt", str(host)):
                with pytest.raises(UsageError) as e:
                    await rt.read(path)
                refused.append(str(e.value))
            with pytest.raises(UsageError, match="symbolic link or not a directory"):
                await rt.write("d/host.txt", "pwned")
            if host.stat().st_dev == rt.workdir.stat().st_dev:
                os.link(host, rt.workdir / "hard")
                with pytest.raises(UsageError, match="hard link"):
                    await rt.read("hard")
                await rt.write("hard", "mine")  # replaces the name, not the host file's content
                assert (rt.workdir / "hard").stat().st_ino != host.stat().st_ino
            await rt.write("f", "mine")
            return refused, await rt.read("f"), await rt.read(str(rt.workdir / "plain")), (rt.workdir / "f").is_symlink()

    refused, f, plain, still_link = asyncio.run(go())
    assert "symbolic link" in refused[0] and "not a directory" in refused[1] and "outside" in refused[2]
    assert "outside" in refused[3]
    assert f == b"mine" and plain == b"x\n" and not still_link
    assert host.read_text() == "host\n" and host.stat().st_uid == os.geteuid()


def test_read_without_max_bytes_is_capped_by_max_read_mb():
    async def go():
        async with make_runtime(RuntimeConfig(type="subprocess", max_read_mb=1)) as rt:
            await rt.run("truncate -s 2M big && head -c 1000 /dev/zero > small")
            with pytest.raises(UsageError, match="larger than max_bytes=1048576"):
                await rt.read("big")
            return len(await rt.read("small")), len(await rt.read("big", max_bytes=3 << 20))

    assert asyncio.run(go()) == (1000, 2 << 20)


def test_a_task_s_image_reaches_the_runtime():
    import vf
    from vf.episode.rollout import runtime_for_task

    assert runtime_for_task({"type": "docker"}, vf.TaskData(prompt="x", image="harbor/task:1")).image == "harbor/task:1"
    assert runtime_for_task(None, vf.TaskData(prompt="x")).image == RuntimeConfig().image


@needs_bwrap
def test_an_added_directory_is_a_fresh_folder_at_its_own_path():
    """`add_directory` (a Harbor task's /app, /logs/verifier): commands see a writable directory at
    that path, the host reaches it by the same path, adding it again empties it (what the agent
    left is gone before the verifier runs), and close() removes the folders."""
    async def go():
        async with make_runtime(RuntimeConfig()) as rt:
            rt.add_directory("/app")
            rt.add_directory("/logs/verifier")
            await rt.write("/app/given.txt", "from the host")
            first = await rt.run("pwd; cat given.txt; echo forged > /logs/verifier/reward.txt; echo left > kept.txt",
                                 cwd="/app")
            host_read = await rt.read("/logs/verifier/reward.txt")
            rt.add_directory("/logs/verifier")
            again = await rt.run("ls -A /logs/verifier; ls -A /app")
            folders = rt._folders
        return first, host_read, again, folders.exists()

    first, host_read, again, left = asyncio.run(go())
    assert first.ok and first.stdout.splitlines() == ["/app", "from the host"]
    assert host_read == b"forged\n"
    assert again.ok and again.stdout.split() == ["given.txt", "kept.txt"]  # /logs/verifier empty, /app kept
    assert not left


@needs_bwrap
def test_a_command_cannot_reach_or_redirect_the_folders_behind_added_directories():
    """The folders live outside the working directory, in a directory no command sees: a command
    cannot swap one for a link to a host path (the next command would get that path bound
    writable), and a link it leaves inside is refused by the host's reads."""
    async def go():
        async with make_runtime(RuntimeConfig()) as rt:
            rt.add_directory("/tests")
            folder = rt.binds()[0][0]
            seen = await rt.run(f"ls {folder} || ls {rt._folders}; ln -s /etc/passwd /tests/reward.txt")
            with pytest.raises(UsageError):
                await rt.read("/tests/reward.txt")
            with pytest.raises(UsageError):
                await rt.read("/tests/../etc/passwd")
            return seen, folder, str(rt.workdir)

    seen, folder, work = asyncio.run(go())
    assert "No such file" in seen.stderr and not seen.stdout
    assert not folder.startswith(work + "/")


@needs_bwrap
def test_added_directories_count_against_the_disk_limit():
    async def go():
        async with make_runtime(RuntimeConfig(disk_mb=5, max_file_mb=4)) as rt:
            rt.add_directory("/app")
            return await rt.run("for i in 1 2 3 4; do head -c 2000000 /dev/zero > /app/f$i; done; sleep 0.5")

    assert asyncio.run(go()).limit == "disk"


@pytest.mark.parametrize("path", ["/", "app", "/app/../etc", "/usr/local", "/tmp/x", "/etc", "/dev/shm/y"])
def test_add_directory_refuses_system_paths(path):
    async def go():
        async with make_runtime(RuntimeConfig(type="subprocess")) as rt:
            rt.add_directory(path)

    with pytest.raises(UsageError):
        asyncio.run(go())


def test_a_host_runtime_cannot_add_a_directory():
    from vf.runtime import SandboxUnavailable

    async def go():
        async with make_runtime(RuntimeConfig(type="subprocess")) as rt:
            rt.add_directory("/app")

    with pytest.raises(SandboxUnavailable, match="sandbox"):
        asyncio.run(go())
