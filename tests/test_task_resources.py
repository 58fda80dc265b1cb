"""A task's `TaskData.resources` (verifiers 0.4.0's TaskResources: cpu cores, memory GB, gpu, disk GB)
applied to its rollout's runtime (vf.runtime.resources): less than the run allows is enforced by
the sandbox, more is capped at the run's limit with a warning, what a runtime cannot enforce is
ignored with verifiers' warning. Real sandboxed commands, driven by the stub's `bash:CMD` model.
"""

from __future__ import annotations

import sys

import pytest

import vf
from vf.episode.rollout import runtime_for_task
from vf.errors import TaskError
from vf.runtime import RuntimeConfig
from vf.runtime import resources as resources_mod
from vf.runtime.resources import with_resources
from vf.trace import read_episodes

RESOURCES_ENV = '''
import vf

__all__ = ["SizedTaskset"]


class SizedTask(vf.Task):
    @vf.reward
    async def one(self, trace) -> float:
        return 1.0


class SizedTaskset(vf.Taskset[SizedTask]):
    def load(self):
        yield SizedTask(vf.TaskData(prompt="small", resources=vf.TaskResources({kind}=0.001 if "{kind}" == "disk"
                                                                                  else 0.125)))
        yield SizedTask(vf.TaskData(prompt="default"))
'''


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.setenv("FAKE_KEY", "sk-test")
    monkeypatch.setattr(resources_mod, "_warned", set())  # each test sees its own warnings


def run_env(tmp_path, stub, kind: str, command: str):
    from vf.config import deep_merge
    from vf.evaluate import execute, open_run, resolve_config

    path = tmp_path / f"sized_{kind}.py"
    path.write_text(RESOURCES_ENV.replace("{kind}", kind))
    sys.modules.pop(path.stem, None)
    over = deep_merge({"taskset": {"id": str(path)}, "model": f"bash:{command}",
                       "engine": {"base_url": stub.url, "api_key_var": "FAKE_KEY"}},
                      {"env": {"agent": {"harness": {"id": "bash"}, "runtime": {"type": "sandbox"}}}})
    config, run, kept, _ = open_run(resolve_config({"command": "eval"}, over), over, str(tmp_path / kind), None)
    execute(config, run, kept)
    return {e.traces[0].task.data.prompt: e.traces[0] for e in read_episodes(tmp_path / kind / "traces.jsonl")}


def test_a_tasks_resources_become_its_runtime_limits(capsys):
    run = RuntimeConfig()  # the sandbox
    assert with_resources(run, vf.TaskResources()) is run  # the default task: the run's limits
    small = with_resources(run, vf.TaskResources(memory=0.25, disk=0.001))
    assert (small.total_memory_mb, small.disk_mb) == (256, 2)  # GB → MiB, rounded up
    # the per-process address space, processes and time stay the run's
    assert (small.memory_mb, small.max_processes, small.timeout) == (run.memory_mb, run.max_processes, run.timeout)
    big = with_resources(run, vf.TaskResources(memory=64, disk=100))  # more than the run allows: capped
    assert (big.total_memory_mb, big.disk_mb) == (4096, 4096)
    err = capsys.readouterr().err
    assert "a task asks for memory 64 GB; total_memory_mb is capped at the run's 4096 MiB" in err
    assert "--env.agent.runtime.total-memory-mb" in err and "disk_mb is capped at the run's 4096 MiB" in err
    tight = with_resources(RuntimeConfig(total_memory_mb=100), vf.TaskResources(memory=0.5))
    assert tight.total_memory_mb == 100  # the operator's lower limit holds
    with_resources(run, vf.TaskResources(memory=64))
    assert capsys.readouterr().err == ""  # once per run, not per rollout


def test_resources_a_runtime_cannot_enforce_are_ignored_with_verifiers_warning(capsys):
    run = RuntimeConfig(type="sandbox")
    assert with_resources(run, vf.TaskResources(cpu=2, gpu="A100:2")) == run
    err = capsys.readouterr().err
    assert "runtime 'sandbox' doesn't support resource 'cpu'; ignoring it" in err
    assert "runtime 'sandbox' doesn't support resource 'gpu'; ignoring it" in err
    host = with_resources(RuntimeConfig(type="subprocess"), vf.TaskResources(memory=0.25, disk=0.5))
    assert (host.total_memory_mb, host.disk_mb) == (4096, 512)  # the host enforces disk only
    assert "runtime 'subprocess' doesn't support resource 'memory'" in capsys.readouterr().err


@pytest.mark.parametrize("value", [0, -1.0, float("nan"), float("inf")])
def test_a_resource_that_is_not_a_positive_size_is_the_tasks_error(value):
    with pytest.raises(TaskError, match="not a positive number of GB"):
        runtime_for_task(RuntimeConfig(), vf.TaskData(resources=vf.TaskResources(disk=value)))


def test_a_task_with_a_tiny_disk_that_writes_5_mb_ends_at_the_disk_limit(tmp_path, stub):
    traces = run_env(tmp_path, stub, "disk", "dd if=/dev/zero of=big bs=1M count=5 2>&1; echo wrote")
    small = traces["small"]
    assert (small.stop_condition, small.ok) == ("limit", False)
    assert [e.type for e in small.errors] == ["RuntimeLimitError"]  # a SandboxError
    assert "disk limit reached" in small.errors[0].message and small.rewards == {}
    default = traces["default"]  # 5 MB is nothing to the run's 4096 MiB
    assert default.ok and default.reward == 1.0 and default.tool_messages[0].content.endswith("wrote\n")


def test_a_memory_limited_tasks_allocation_fails(tmp_path, stub):
    command = "python3 -c \"import time; b = b'x' * (300 << 20); time.sleep(2); print('allocated', len(b) >> 20)\""
    traces = run_env(tmp_path, stub, "memory", command)
    small = traces["small"]  # 128 MiB in all: the command holding 300 MiB is killed, the rollout ends
    assert (small.stop_condition, [e.type for e in small.errors]) == ("limit", ["RuntimeLimitError"])
    assert "total_memory limit reached" in small.errors[0].message
    assert "allocated" not in small.tool_messages[0].content
    assert traces["default"].tool_messages[0].content == "allocated 300\n" and traces["default"].ok
