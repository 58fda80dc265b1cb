"""Artifacts: files a task declares are collected from the runtime after the agent stops, written
beside the traces and referenced from them, and restored into another runtime only after the
host has checked every archive member (the agent made them)."""

from __future__ import annotations

import asyncio
import hashlib
import io
import tarfile
from pathlib import Path

import pytest

import vf
from vf.artifacts import collect, restore, safe_members
from vf.errors import SandboxError
from vf.runtime import RuntimeConfig, make_runtime
from vf.trace import Episode

TASKSET = '''
import vf


class T(vf.Task[vf.TaskData]):
    @vf.reward
    def ran(self, trace) -> float:
        return float(len(trace.calls) > 0)


class S(vf.Taskset[T]):
    def load(self):
        return [T(vf.TaskData(prompt="make files", artifacts=ARTIFACTS, artifact_max_bytes=LIMIT))]
'''


def run_eval(tmp_path: Path, stub, command: str, artifacts, limit: int = 1 << 20) -> Episode:
    from vf.evaluate import execute, open_run, resolve_config

    tmp_path.mkdir(parents=True, exist_ok=True)
    env = tmp_path / "arts.py"
    env.write_text(TASKSET.replace("ARTIFACTS", repr(artifacts)).replace("LIMIT", str(limit)))
    over = {"taskset": {"id": str(env)}, "model": f"bash:{command}",
            "engine": {"base_url": stub.url, "api_key_var": "FAKE_KEY"},
            "env": {"agent": {"harness": {"id": "bash"}, "runtime": {"type": "subprocess"}}}}
    config, run, kept, _ = open_run(resolve_config({"command": "eval"}, over), over, str(tmp_path / "run"), None)
    execute(config, run, kept)
    return Episode.model_validate_json((tmp_path / "run" / "traces.jsonl").read_text())


@pytest.fixture(autouse=True)
def key(monkeypatch):
    monkeypatch.setenv("FAKE_KEY", "sk-test")


def names(archive: bytes) -> dict[str, bytes | None]:
    return dict(safe_members(archive))


def test_declared_artifacts_land_in_the_run_dir_referenced_from_the_trace(stub, tmp_path):
    episode = run_eval(tmp_path, stub, "mkdir -p logs && echo hi > out.txt && echo x > logs/a.log",
                       ["out.txt", {"source": "logs", "exclude": ["*.tmp"]},
                        {"source": "missing.txt", "required": False}])
    trace = episode.traces[0]
    assert trace.ok, trace.errors
    refs = trace.info["artifacts"]
    assert [r["source"] for r in refs] == ["out.txt", "logs", "missing.txt"]
    assert refs[2]["file"] is None  # optional and absent: recorded as such
    for ref in refs[:2]:
        data = (tmp_path / "run" / ref["file"]).read_bytes()
        assert len(data) == ref["bytes"] and hashlib.sha256(data).hexdigest() == ref["sha256"]
    assert names((tmp_path / "run" / refs[0]["file"]).read_bytes()) == {"out.txt": b"hi\n"}
    assert names((tmp_path / "run" / refs[1]["file"]).read_bytes()) == {"logs": None, "logs/a.log": b"x\n"}
    assert "ustar" not in (tmp_path / "run" / "traces.jsonl").read_text()  # no archive inline


def test_a_missing_required_artifact_or_one_over_the_limit_fails_the_rollout(stub, tmp_path):
    trace = run_eval(tmp_path / "a", stub, "echo hi > out.txt", ["nope.txt"]).traces[0]
    assert not trace.ok and trace.errors[0].type == "SandboxError" and "nope.txt" in trace.errors[0].message
    trace = run_eval(tmp_path / "b", stub, "head -c 200000 /dev/zero > big.bin", ["big.bin"], limit=50_000).traces[0]
    assert not trace.ok and trace.errors[0].type == "SandboxError"


def _archive(*members: tarfile.TarInfo, data: bytes = b"x") -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for m in members:
            tar.addfile(m, io.BytesIO(data) if m.isfile() else None)
    return out.getvalue()


def _member(name: str, kind=tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.size = kind, link, 1 if kind == tarfile.REGTYPE else 0
    return info


@pytest.mark.parametrize("member", [
    _member("../escape.txt"), _member("/etc/escape.txt"), _member("a/../../escape.txt"),
    _member("link", tarfile.SYMTYPE, "/etc/passwd"), _member("hard", tarfile.LNKTYPE, "/etc/passwd"),
    _member("fifo", tarfile.FIFOTYPE)])
def test_restore_refuses_a_hostile_archive_before_writing_anything(tmp_path, member):
    async def go():
        async with make_runtime(RuntimeConfig(type="subprocess"), tmp_path / "box") as box:
            archive = _archive(_member("ok.txt"), member)
            with pytest.raises(SandboxError):
                await restore(box, {"x": archive})
            return sorted(p.name for p in (tmp_path / "box").iterdir())
    assert asyncio.run(go()) == []  # not even the good member was written
    assert not (tmp_path / "escape.txt").exists()


def test_collected_files_restore_into_another_runtime_at_the_same_relative_place(tmp_path):
    async def go():
        async with make_runtime(RuntimeConfig(type="subprocess")) as agent, \
                make_runtime(RuntimeConfig(type="subprocess")) as grader:
            await agent.run("mkdir -p src && printf 'def f():\\n    return 1\\n' > src/m.py")
            collected = await collect(agent, [vf.Artifact(source=str(agent.workdir / "src"))])
            written = await restore(grader, collected)
            return written, (await grader.read("src/m.py")).decode()
    written, text = asyncio.run(go())
    assert written == ["src/m.py"] and text == "def f():\n    return 1\n"


SPARSE_RESTORE = """
import asyncio, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))  # a restore that reads the 2 GiB fails loudly
from vf.artifacts import restore, safe_members
from vf.errors import SandboxError
from vf.runtime import make_runtime
archive = open(sys.argv[1], "rb").read()
for attempt in (lambda: safe_members(archive), lambda: asyncio.run(restore(make_runtime({"type": "subprocess"}),
                                                                             {"big": archive}))):
    try:
        attempt()
        print("read")
    except SandboxError as e:
        print("refused:", e)
"""


def test_restore_refuses_a_sparse_archive_by_its_expanded_size(tmp_path):
    """A 10 KB archive (GNU sparse) of a 2 GiB file: before, restore read all 2 GiB into memory;
    now its members' declared sizes are summed from their headers and refused past the budget
    (MAX_ARTIFACT_BYTES, 32 MiB) before anything is read."""
    import subprocess
    import sys

    big = tmp_path / "src" / "big"
    big.parent.mkdir()
    with open(big, "wb") as f:
        f.truncate(2 << 30)
    archive = tmp_path / "sparse.tar"
    subprocess.run(["tar", "--sparse", "-cf", str(archive), "-C", str(big.parent), "big"], check=True)
    assert archive.stat().st_size < 64 << 10
    proc = subprocess.run([sys.executable, "-c", SPARSE_RESTORE, str(archive)], capture_output=True, text=True,
                          timeout=120, check=False)
    lines = proc.stdout.splitlines()
    assert len(lines) == 2 and all(line.startswith("refused:") for line in lines), proc.stdout + proc.stderr[-2000:]
    assert "expands to 2147483648 bytes" in lines[0]


def test_collect_counts_what_an_archive_expands_to():
    """The collected archive's expanded size counts against `artifact_max_bytes` too."""
    from vf.artifacts import expanded_size

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("f")
        info.size = 1000
        tar.addfile(info, io.BytesIO(b"x" * 1000))
    assert expanded_size(buf.getvalue(), 1000) == 1000
    with pytest.raises(SandboxError, match="expands to 1000 bytes"):
        expanded_size(buf.getvalue(), 999)
