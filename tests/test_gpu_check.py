"""`benchmarks/gpu_check.sh`, the GPU acceptance check, run for real on the CPU (`--cpu`), so it
cannot rot between the rare runs on a GPU: every step that needs no CUDA passes, the CUDA-only
ones are skipped with a reason, and a step that fails, raises or crashes (the VF_GPU_CHECK_INJECT
test hook) fails the run with that step marked failed, the steps after it still run."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"
CUDA_ONLY = {"gpu_pytest", "multi_gpu"}
ALL_STEPS = ["env", "train_parity", "bf16_learns", "gpu_pytest", "engine", "families", "perf", "multi_gpu"]


def gpu_check(*args: str, inject: str | None = None, timeout: float = 900) -> tuple[subprocess.CompletedProcess, dict]:
    """Run the script; (process, verdict). The verdict's path is the one line on stdout."""
    env = {**os.environ, "NO_COLOR": "1"}
    env.pop("VF_GPU_CHECK_INJECT", None)
    if inject:
        env["VF_GPU_CHECK_INJECT"] = inject
    p = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, check=False, timeout=timeout, env=env)
    lines = p.stdout.strip().splitlines()
    assert len(lines) == 1, f"stdout must be the verdict path alone:\n{p.stdout}\nstderr:\n{p.stderr}"
    return p, json.loads(Path(lines[0]).read_text())


def steps(verdict: dict) -> dict[str, dict]:
    return {s["name"]: s for s in verdict["steps"]}


@pytest.mark.slow
def test_cpu_run_passes_every_step_that_needs_no_cuda(tmp_path):
    """The whole --cpu run (a few minutes on 2 cores): the CPU stands in for the device."""
    p, verdict = gpu_check("--cpu", "--out", str(tmp_path / "check"))
    assert p.returncode == 0, p.stderr
    assert verdict["ok"] is True and verdict["mode"] == "cpu" and verdict["device"] == "cpu"
    got = steps(verdict)
    assert list(got) == ALL_STEPS
    for name, s in got.items():
        if name in CUDA_ONLY:
            assert s["status"] == "skipped" and s["reason"], (name, s)
        else:
            assert s["status"] == "pass", (name, s["reason"], s["numbers"])
    assert verdict["counts"] == {"pass": 6, "fail": 0, "skipped": 2}
    # the numbers each step is there for
    n = {k: v["numbers"] for k, v in got.items()}
    assert n["env"]["families"]["qwen3"]["native"] and n["env"]["commands"]["train"] == 0
    assert len(n["train_parity"]["losses_device"]) == 3 and n["train_parity"]["worst_rel"] <= 1e-4
    assert n["bf16_learns"]["checkpoint_dtypes"] == ["float32"] and n["bf16_learns"]["update_cosine"] >= 0.9
    assert n["bf16_learns"]["mem_bytes_per_param"]["bf16"] is not None
    assert n["engine"]["tokens_device"] == n["engine"]["tokens_transformers"]
    assert {c for c, v in n["families"]["cases"].items() if v["status"] == "pass"} == \
        {"glm4_moe", "deepseek_v3", "qwen3_next", "qwen3_vl"}
    assert n["perf"]["cases"]["trainer"]["numbers"]["ours"]["tokens_per_s"] > 0
    assert set(n["perf"]["cases"]["engine"]["numbers"]["cases"]) == {"batch 1", "batch 4"}
    assert "PASSED" in p.stderr


@pytest.mark.parametrize("mode", ["fail", "raise", "crash"])
def test_a_failing_or_crashing_step_fails_the_run(mode, tmp_path):
    """The injected step is marked failed, exit 1; the next step still runs (here: skipped, as
    gpu_pytest is on a machine without CUDA)."""
    p, verdict = gpu_check("--cpu", "--out", str(tmp_path / "check"), "--steps", "engine,gpu_pytest",
                           inject=f"engine:{mode}", timeout=300)
    assert p.returncode == 1, p.stderr
    got = steps(verdict)
    assert verdict["ok"] is False and verdict["counts"]["fail"] == 1
    assert got["engine"]["status"] == "fail"
    assert {"fail": "injected failure", "raise": "injected exception", "crash": "SIGABRT"}[mode] in got["engine"]["reason"]
    assert got["gpu_pytest"]["status"] == "skipped"
    assert "FAILED" in p.stderr


def test_a_crash_in_one_part_fails_its_step(tmp_path):
    """families runs each mechanism in its own child: every part that crashes is reported."""
    p, verdict = gpu_check("--cpu", "--out", str(tmp_path / "check"), "--steps", "families",
                           inject="families:crash", timeout=300)
    assert p.returncode == 1
    fam = steps(verdict)["families"]
    assert fam["status"] == "fail"
    assert all(c["status"] == "fail" and "crashed" in c["reason"] for c in fam["numbers"]["cases"].values())


def test_unknown_step_exits_2(tmp_path):
    p = subprocess.run(["bash", str(SCRIPT), "--cpu", "--out", str(tmp_path), "--steps", "env,warp"],
                       capture_output=True, text=True, check=False, timeout=60)
    assert p.returncode == 2 and "warp" in p.stderr and p.stdout == ""


# -- the wheel bundle (benchmarks/gpu_wheels.py): its list, without downloading anything ----------


def _load(name: str):
    """A script of benchmarks/ imported as a module by its name (benchmarks/ is no package)."""
    import importlib.util
    import sys

    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # its dataclasses look their module up
        spec.loader.exec_module(module)
    return sys.modules[name]


def _gpu_wheels():
    return _load("gpu_wheels")


def test_wheel_bundle_list_covers_pyproject_and_duplicates_nothing_in_the_image():
    """Every dependency in pyproject.toml (markers as on the GPU machines) is in the bundle or the
    image, and the bundle carries nothing the image has. (The script itself checks the whole
    closure, every wheel's Requires-Dist, when it builds the bundle.)"""
    import tomllib

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    gw = _gpu_wheels()
    spec = gw.load_spec()
    env = gw.target_env(spec)
    bundle = {canonicalize_name(n) for n in spec["bundle"]}
    image = {canonicalize_name(n) for n in spec["image"]["names"]}
    assert not bundle & image
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    reqs = [Requirement(d) for d in deps]
    missing = [str(r) for r in reqs if (not r.marker or r.marker.evaluate(env))
               and canonicalize_name(r.name) not in bundle | image]
    assert not missing, f"add to benchmarks/gpu_wheels.toml's [bundle]: {missing}"
    # the image's pinned versions satisfy pyproject's ranges (the stack floor: torch 2.11, transformers 5.17)
    versions = {canonicalize_name(k): v for k, v in spec["image"]["versions"].items()}
    for r in reqs:
        if canonicalize_name(r.name) in versions:
            assert r.specifier.contains(versions[canonicalize_name(r.name)]), (str(r), versions[canonicalize_name(r.name)])


def test_wheel_bundle_check_finds_a_gap_and_a_duplicate(tmp_path):
    """`check` on made-up wheels: a requirement nobody provides, a version the bundle does not
    meet, and a package the image already has are each reported."""
    import zipfile

    gw = _gpu_wheels()

    def wheel(name, version, *requires):
        path = tmp_path / f"{name}-{version}-py3-none-any.whl"
        meta = "".join(f"Requires-Dist: {r}\n" for r in requires)
        with zipfile.ZipFile(path, "w") as z:
            z.writestr(f"{name}-{version}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n{meta}")
        return path

    wheel("alpha", "1.0", "beta>=2", "gamma", "numpy>=99", "delta; sys_platform == 'win32'", "eps; extra == 'x'")
    wheel("beta", "1.5")
    wheel("tqdm", "4.0")
    spec = {"target": {"python": "3.12", "python_full": "3.12.3"},
            "image": {"names": ["numpy", "tqdm"], "versions": {"numpy": "2.5.2"}}}
    problems, _ = gw.check(spec, gw.wheels(tmp_path))
    text = "\n".join(problems)
    assert "alpha requires beta>=2, the bundle has 1.5" in text
    assert "alpha requires gamma: neither in the bundle nor in the image" in text
    assert "alpha requires numpy>=99, the image has 2.5.2" in text
    assert "tqdm: the image already has it" in text
    assert "delta" not in text and "eps" not in text  # not for this platform / not an asked-for extra


# -- device paths on the stand-in accelerator (tests/stand_in_device.py) --------------------------


def test_engine_step_and_bench_measurements_are_device_clean_on_the_stand_in():
    """The check's engine step and the trainer / engine bench measurements it runs on the GPU, with
    the device a stand-in that refuses host tensors mixed into device work as CUDA does: a tensor the
    code forgot to move fails here, not on the first GPU run. (transformers' reference models do not
    run on the stand-in: the trainer measurement is ours only.)"""
    from stand_in_device import stand_in_accelerator
    from vf.models.tiny import ensure_tiny_model

    from vf.bench import engine, trainer

    gc = _load("gpu_check")
    with stand_in_accelerator() as device:
        step = gc.step_engine(str(device))
        ours = trainer.measure("ours", str(ensure_tiny_model()), 2, 32, 0, device=str(device))
        decode = engine.measure("tiny", [2], 4, 8, 1, device=str(device))
    assert step["status"] == "pass", step
    assert ours["tokens_per_s"] > 0 and ours["device"] == str(device)
    assert decode["2"]["local"]["greedy_match"] == "2/2"
