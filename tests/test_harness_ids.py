"""All 13 of verifiers 0.4.0's harness ids resolve in vf: each runs, or is refused when named
(exit 2, before any rollout or model call) with a message saying what is missing; verifiers'
harness and config class names import from `vf.harnesses` as from `verifiers.v1.harnesses`."""

from __future__ import annotations

import ast
import glob
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_peer_harnesses import ENVS, pythonpath

import vf.harnesses
from vf.configs.harness import HarnessConfig
from vf.episode.harnesses import make_harness
from vf.errors import UsageError
from vf.program import Harness, harness_class

PEER_INIT = glob.glob("/work/venvs/v04/lib/python3*/site-packages/verifiers/v1/harnesses/__init__.py")
RUNS = {"null", "bash", "mini_swe_agent", "terminus_2", "claude_code", "codex"}
REFUSED = {"browser_use": "Chromium", "hermes_agent": "GitHub source tarball", "kimi_code": "code.kimi.com",
           "openclaw": "openclaw.ai", "pi": "Agent Client Protocol", "prime_agent": "GitHub release tarballs",
           "rlm": "git clone"}


def peer_names() -> list[str]:
    """verifiers 0.4.0's `verifiers.v1.harnesses.__all__`, read from its source (no import)."""
    if not PEER_INIT:
        pytest.skip("verifiers 0.4.0 is not installed in /work/venvs/v04")
    tree = ast.parse(Path(PEER_INIT[0]).read_text())
    (names,) = [node.value for node in tree.body if isinstance(node, ast.Assign)
                and any(getattr(t, "id", None) == "__all__" for t in node.targets)]
    return [elt.value for elt in names.elts]


def test_the_thirteen_ids_are_verifiers_own():
    ids = {p.name for p in Path(PEER_INIT[0]).parent.iterdir() if (p / "harness.py").exists()} if PEER_INIT else None
    if ids is None:
        pytest.skip("verifiers 0.4.0 is not installed in /work/venvs/v04")
    assert ids == RUNS | set(REFUSED) and len(ids) == 13


@pytest.mark.parametrize("harness_id", sorted(RUNS))
def test_a_runnable_id_builds_its_harness(harness_id):
    harness = make_harness(HarnessConfig(id=harness_id))
    assert harness.config.id == harness_id


@pytest.mark.parametrize("harness_id, says", sorted(REFUSED.items()))
def test_an_id_vf_cannot_run_is_refused_saying_what_is_missing(harness_id, says):
    assert issubclass(harness_class(harness_id), Harness)  # it resolves: not "unknown harness"
    with pytest.raises(UsageError, match=says) as refused:
        make_harness(HarnessConfig(id=harness_id, some_verifiers_knob=1))  # its knobs are no obstacle
    assert f"harness {harness_id!r}" in str(refused.value) and "mini_swe_agent" in refused.value.hint


def test_verifiers_class_names_import_from_vf_harnesses():
    names = peer_names()
    assert len(names) == 26
    for name in names:
        assert isinstance(getattr(vf.harnesses, name), type), name
    for harness_id in RUNS - {"null", "bash"}:
        cls = harness_class(harness_id)
        peer = {c: n for n in names if isinstance(c := getattr(vf.harnesses, n), type)}
        assert peer[cls].endswith("Harness") and peer[cls.config_class()] == peer[cls] + "Config"
    assert vf.harnesses.CodexHarnessConfig is vf.harnesses.codex.CodexConfig
    with pytest.raises(AttributeError):
        vf.harnesses.NoSuchHarness  # noqa: B018


@pytest.mark.parametrize("harness_id, says", [("pi", "Agent Client Protocol"), ("browser_use", "Chromium")])
def test_naming_one_on_the_command_line_exits_2_before_the_run(harness_id, says, stub, tmp_path):
    before = len(stub.requests)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([pythonpath(ENVS), os.environ.get("PYTHONPATH", "")]), "FAKE_KEY": "sk-test", "NO_COLOR": "1"}
    proc = subprocess.run([str(Path(sys.executable).parent / "vf-eval"), str(ENVS / "compact_v1.py"),
                           "-m", "bash:cat note.txt", "--base-url", stub.url, "--api-key-var", "FAKE_KEY",
                           "--env.agent.harness.id", harness_id, "-o", str(tmp_path / "run")],
                          env=env, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2 and says in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "run").exists() and len(stub.requests) == before
