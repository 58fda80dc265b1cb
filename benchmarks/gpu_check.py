"""The GPU acceptance check behind `benchmarks/gpu_check.sh`: one GPU, about ten minutes, and a
JSON verdict in which every step says pass, fail or skipped, why, and its numbers.

    bash benchmarks/gpu_check.sh [--cpu] [--out DIR] [--steps env,train_parity,...]

Why a driver and not a bash script: the old script ran under `set -e`, where `run … && same …`
reported success when a torchrun case crashed. Here every step runs in its own child process
(`vf.bench.common.run_child`), so a crash, a CUDA error or a hang (the step's timeout) becomes that
step's failure and the next step still runs; nothing is a pass unless the step returned one.

Steps (each a function below, run in a child; `--steps` picks some):

  env           GPU, torch / CUDA / NCCL, bf16, TF32, transformers, flash-attn, which model families
                import (native model code and transformers' class), `--help` of every command, and
                `pip check` (failed only on vf's own dependencies: the wheel bundle's packages)
  train_parity  tiny-random, 3 deterministic vf-train steps (SFT on gold replies: the batches do not
                depend on sampling) on the device vs on the CPU, fp32, TF32 off:
                per-step |Δloss| ≤ 1e-4 · max(|loss|, 1)
  bf16_learns   the same 3 steps at lr 1e-6 in bf16 compute (fp32 master weights) and in fp32: the
                checkpoint keeps fp32 weights, the bf16 run moves ≥ 90% of the weights the fp32 run
                moves, its update has cosine ≥ 0.9 with the fp32 update, its losses are within
                1e-2 · |loss| of the fp32 losses; `mem_bytes_per_param` is recorded
  gpu_pytest    `pytest -m gpu` over the test files that mark tests gpu (skipped with no CUDA)
  engine        the embedded engine's greedy decode on the device equals the CPU engine's and
                transformers' `generate` on the device; the trainer's log-probs of those tokens
                (packed by the trainer's own `micro_batches`) equal the engine's within 1e-4 on CUDA
                (fp32, TF32 off), 1e-5 on the CPU
  families      one family per mechanism against transformers on the device, fp32 logits within 1e-4:
                MoE grouped GEMM (glm4_moe, both MoE paths), MLA (deepseek_v3), recurrent hybrid
                (qwen3_next), VL (qwen3_vl, with images); tiny configs from the tests' builders; a
                family whose transformers class is missing is skipped with that reason
  perf          the trainer suite's Qwen3-0.6B shape (bf16, tokens/s, MFU, peak memory) and the engine
                suite at batch 16 and 64 (bf16), each against transformers on the same device
                (`vf.bench.trainer` / `vf.bench.engine` with device=); the issue's goals are
                recorded with `met`, not failed on (they are goals, not correctness). With --cpu:
                the suites' tiny sizes in fp32
  multi_gpu     ≥ 2 GPUs only: vf-train under torchrun at FSDP data parallel 2, ep 2, cp 2 ring and
                Ulysses, cp 2 × ep 2, each against one process, per-step |Δloss| ≤ 1e-4 · max(|loss|, 1)

`--cpu`: every step with device=cpu standing in for the GPU, so the code paths run on a machine
without CUDA (CI runs it: tests/test_gpu_check.py); the steps that need CUDA (gpu_pytest,
multi_gpu) are skipped with the reason. Without --cpu and without CUDA, `env` fails and the device
steps are skipped: a GPU check on no GPU is not a pass.

Verdict: DIR/verdict.json (default DIR: runs/gpu_check/<UTC time>), its path the only line on
stdout; progress on stderr. Exit 0 when no step failed, 1 when one did, 2 on bad usage.

Test hook: VF_GPU_CHECK_INJECT=STEP[:MODE] makes that step misbehave inside its child, MODE
`fail` (returns a failed check, the default), `raise` (an exception) or `crash` (the process
aborts, as a segfault would); tests/test_gpu_check.py checks each is reported as a failure.

Importing this module does not import torch: only the children do.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

SCHEMA = "vf-gpu-check/1"
INJECT_VAR = "VF_GPU_CHECK_INJECT"

# tolerances, stated once (docstring above; the verdict repeats them per step)
LOSS_REL = 1e-4          # train_parity, multi_gpu: |Δloss| ≤ LOSS_REL · max(|loss|, 1)
BF16_LOSS_REL = 1e-2     # bf16_learns: |loss_bf16 − loss_fp32| ≤ BF16_LOSS_REL · |loss_fp32|
BF16_MOVED = 0.9         # bf16_learns: moved weights (of those the fp32 run moves)
BF16_COSINE = 0.9        # bf16_learns: cosine of the bf16 update with the fp32 update
LOGPROB_TOL = {"cuda": 1e-4, "cpu": 1e-5}  # engine: |trainer − engine| log-prob
LOGIT_TOL = 1e-4         # families: max |native − transformers| fp32 logit
BF16_LR = 1e-6

# 3 SFT steps on the reverse-text gold replies (no rollouts: the batches do not depend on sampling,
# so the device and the CPU train on the same tokens)
TRAIN_ARGS = ["-m", "tiny-random", "--warmup.steps", "3", "--steps", "0", "--warmup.batch-size", "8",
              "--batch-size", "8", "--group-size", "4", "--eval.at-start", "false", "--eval.at-end", "false",
              "--seed", "7", "--trainer.micro-batch-size", "2", "--trainer.seq-len", "96", "--async.deterministic"]


@dataclass
class Step:
    name: str
    title: str
    timeout: float  # seconds
    needs_cuda: str | None = None  # the skip reason where CUDA (or several GPUs) is missing


STEPS = [
    Step("env", "environment record", 180),
    Step("train_parity", "3 deterministic vf-train steps: device vs CPU (fp32)", 300),
    Step("bf16_learns", "bf16 compute with fp32 master weights learns at lr 1e-6", 300),
    Step("gpu_pytest", "pytest -m gpu", 420, needs_cuda="no CUDA device: the gpu-marked tests need one"),
    Step("engine", "engine greedy decode and trainer log-probs: device vs CPU vs transformers", 300),
    Step("families", "one family per mechanism vs transformers on the device", 420),
    Step("perf", "trainer step and engine decode vs transformers on the same device", 600),
    Step("multi_gpu", "FSDP / ep / cp / cp×ep under torchrun vs one process", 600,
         needs_cuda="needs >= 2 CUDA devices"),
]
BY_NAME = {s.name: s for s in STEPS}


# -- results --------------------------------------------------------------------------------


def result(status: str, reason: str = "", **numbers: Any) -> dict[str, Any]:
    """A step's (or case's) outcome: status pass | fail | skipped, a reason, its numbers."""
    assert status in ("pass", "fail", "skipped"), status
    return {"status": status, "reason": reason, "numbers": numbers}


def checks_result(checks: dict[str, bool], reason_ok: str = "", **numbers: Any) -> dict[str, Any]:
    """pass when every named check holds, else fail naming the ones that did not."""
    bad = [k for k, ok in checks.items() if not ok]
    reason = ("failed: " + ", ".join(bad)) if bad else reason_ok
    return result("fail" if bad else "pass", reason, checks=checks, **numbers)


# -- child entry ----------------------------------------------------------------------------


def run_step(name: str, kw: dict[str, Any], step: str | None = None) -> dict[str, Any]:
    """(child) Run `step_<name>(**kw)`, a part of step `step` (default: the step `name`); honours
    the VF_GPU_CHECK_INJECT test hook first."""
    step = step or name
    target, _, mode = os.environ.get(INJECT_VAR, "").partition(":")
    if target == step:
        mode = mode or "fail"
        if mode == "crash":
            sys.stderr.write(f"{INJECT_VAR}: aborting step {step}\n")
            sys.stderr.flush()
            os.abort()
        if mode == "raise":
            raise RuntimeError(f"{INJECT_VAR}: injected exception in step {step}")
        return result("fail", f"{INJECT_VAR}: injected failure")
    return globals()[f"step_{name}"](**kw)


def _torch_setup(device: str):
    """fp32 parity needs full fp32 matmuls: TF32 off in this child (the env step records the default)."""
    import torch

    if device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    return torch


def _tail(text: str, n: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-n:])


# -- 1. environment -------------------------------------------------------------------------


def step_env(device: str, cpu_mode: bool) -> dict[str, Any]:
    import importlib
    import importlib.util
    import pkgutil
    import platform

    import torch
    import transformers
    import vf.models
    from vf.models.families import _registry

    import vf
    from vf.bench.common import _version

    cuda = torch.cuda.is_available()
    info: dict[str, Any] = {
        "python": platform.python_version(), "torch": torch.__version__, "cuda_runtime": torch.version.cuda,
        "cuda_available": cuda, "device_count": torch.cuda.device_count() if cuda else 0,
        "transformers": transformers.__version__, "vf": getattr(vf, "__version__", None),
        "vf_path": str(Path(vf.__file__).parent), "flash_attn": _version("flash-attn") or _version("flash_attn"),
        "torch_varlen_attention": importlib.util.find_spec("torch.nn.attention.varlen") is not None,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
    }
    try:
        from vf.version import __version__ as vf_version

        info["vf"] = vf_version
    except ImportError:
        pass
    if cuda:
        info["gpus"] = [{"name": torch.cuda.get_device_name(i),
                         "capability": ".".join(map(str, torch.cuda.get_device_capability(i))),
                         "memory_gib": round(torch.cuda.get_device_properties(i).total_memory / 2**30, 1)}
                        for i in range(torch.cuda.device_count())]
        nccl = torch.cuda.nccl.version() if torch.distributed.is_nccl_available() else None
        info["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else nccl
        info["bf16_supported"] = torch.cuda.is_bf16_supported()
        info["tf32_default"] = {"matmul": torch.backends.cuda.matmul.allow_tf32, "cudnn": torch.backends.cudnn.allow_tf32}
    else:
        a = torch.ones(4, 4, dtype=torch.bfloat16)
        info["bf16_supported"] = bool((a @ a).float().eq(4).all())  # CPU bf16 matmul works
        info["tf32_default"] = None  # CUDA only
    # which model families import: every vf.models module, each family's model code, transformers' class
    broken_modules = {}
    for m in pkgutil.iter_modules(vf.models.__path__):
        try:
            importlib.import_module(f"vf.models.{m.name}")
        except Exception as e:  # noqa: BLE001 (any import error is the finding)
            broken_modules[m.name] = f"{type(e).__name__}: {e}"
    families: dict[str, dict[str, Any]] = {}
    texts, vls = _registry()
    for key, spec in [*texts.items(), *((f"vl:{t}", v) for t, v in vls.items())]:
        row: dict[str, Any] = {"hf_class": spec.hf_class, "transformers_class": hasattr(transformers, spec.hf_class)}
        for field_name in ("linear_attention", "layer", "model", "processor"):
            path = getattr(spec, field_name, None)
            if isinstance(path, str) and ":" in path:
                try:
                    from vf.models.families import resolve

                    resolve(path)
                except Exception as e:  # noqa: BLE001
                    row.setdefault("native_errors", []).append(f"{path}: {type(e).__name__}: {e}")
        row["native"] = "native_errors" not in row
        families[key] = row
    info["families"] = families
    info["broken_model_modules"] = broken_modules
    info["commands"] = _commands_help()
    info["pip_check"], ours_broken = _pip_check()
    checks = {
        "device available": cpu_mode or cuda,
        "every vf.models module imports": not broken_modules,
        "every family's model code imports": all(r["native"] for r in families.values()),
        "every command's --help exits 0": all(v == 0 for v in info["commands"].values()),
        "pip check: vf's dependencies are met": not ours_broken,
    }
    missing = sorted(k for k, r in families.items() if not r["transformers_class"])
    note = f"transformers {transformers.__version__} lacks {', '.join(missing)} (their parity checks skip)" if missing else ""
    out = checks_result(checks, note, **info)
    if not cuda and not cpu_mode:
        out["reason"] = "no CUDA device (torch.cuda.is_available() is False): run with --cpu for the CPU stand-in"
    return out


def _pip_check() -> tuple[list[str], list[str]]:
    """`pip check`'s complaints, and those about vf or a package of the wheel bundle (the image's
    own inconsistencies are recorded, not failed on)."""
    import tomllib

    from packaging.utils import canonicalize_name

    p = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True, check=False, timeout=120)
    lines = [x for x in p.stdout.splitlines() if x.strip() and not x.startswith("No broken")]
    spec = tomllib.loads((ROOT / "benchmarks" / "gpu_wheels.toml").read_text())
    ours = {canonicalize_name(n) for n in spec["bundle"]} | {"vf"}
    return lines, [x for x in lines if canonicalize_name(x.split()[0]) in ours]


COMMANDS = ("bench", "eval", "init", "migrate", "rollout", "serve", "train", "validate", "vf")


def _commands_help() -> dict[str, int]:
    """Exit status of `python -m vf.commands.X --help` for every console script (in parallel)."""
    env = {**os.environ, "NO_COLOR": "1"}
    procs = {c: subprocess.Popen([sys.executable, "-m", f"vf.commands.{c}", "--help"], stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, env=env) for c in COMMANDS}
    out = {}
    for c, p in procs.items():
        try:
            p.communicate(timeout=120)
            out[c] = p.returncode
        except subprocess.TimeoutExpired:
            p.kill()
            out[c] = -1
    return out


# -- 2. / 3. vf-train on the device -----------------------------------------------------------


def _train(*runs: tuple[Path, str, list[str]], timeout: float = 240) -> list[tuple[list[float], dict[str, Any]]]:
    """vf-train runs (run dir, device, extra flags), all at once (each is mostly start-up: on a
    2-core machine two side by side take little more than one); per run (per-step losses, first
    metrics row). Raises with the tail of a failed run's stderr."""
    env = {**os.environ, "NO_COLOR": "1", "PYTHONUNBUFFERED": "1"}
    procs = []
    for out, device, extra in runs:
        cmd = [sys.executable, "-m", "vf.commands.train", "-o", str(out), *TRAIN_ARGS, "--model.device", device, *extra]
        if device.startswith("cuda"):
            cmd += ["--model.tf32", "false"]  # parity with the CPU needs full fp32 matmuls
        procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env))
    errors = []
    for p, (out, device, extra) in zip(procs, runs):
        try:
            _, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            _, err = p.communicate()
            err += f"\n(killed after {timeout:.0f} s)"
        if p.returncode != 0:
            errors.append(f"vf-train {' '.join(extra)} on {device} exited {p.returncode}:\n{_tail(err)}")
    if errors:
        raise RuntimeError("\n".join(errors))
    out = []
    for run_dir, _, _ in runs:
        rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
        out.append(([r["loss"] for r in rows], rows[0] if rows else {}))
    return out


def _same_losses(a: list[float], b: list[float], rel: float) -> tuple[bool, float]:
    """(a and b agree per step within rel · max(|a|, 1), the worst such relative difference)."""
    if len(a) != len(b) or not a:
        return False, float("inf")
    worst = max(abs(x - y) / max(abs(x), 1.0) for x, y in zip(a, b))
    return worst <= rel, worst


def step_train_parity(device: str, out: str) -> dict[str, Any]:
    out_dir = Path(out)
    fp32 = ["--model.dtype", "float32"]
    (cpu, _), (dev, _) = _train((out_dir / "cpu", "cpu", fp32), (out_dir / "device", device, fp32))
    ok, worst = _same_losses(cpu, dev, LOSS_REL)
    return checks_result({"3 steps each": len(cpu) == len(dev) == 3, f"per-step loss rel <= {LOSS_REL:g}": ok},
                         tolerance=f"|dloss| <= {LOSS_REL:g} * max(|loss|, 1)", losses_cpu=cpu,
                         losses_device=dev, worst_rel=worst, device=device)


def _weights(path: Path):
    """The model tensors of a checkpoint dir (trainer's `model` state), or of an HF model dir."""
    from vf.models import load_model

    if (path / "trainer.json").exists():
        from vf.trainer.checkpoint import load

        return load(path)["model"]
    return load_model(path).state_dict()


def step_bf16_learns(device: str, out: str) -> dict[str, Any]:
    torch = _torch_setup(device)
    from vf.trainer.checkpoint import latest

    out_dir = Path(out)
    lr = ["--optim.lr", str(BF16_LR), "--warmup.lr", str(BF16_LR)]
    (fp32, row32), (bf16, row16) = _train(
        (out_dir / "fp32", device, ["--model.dtype", "float32", *lr]),
        (out_dir / "bf16", device, ["--model.dtype", "bfloat16", "--model.master-dtype", "float32", *lr]))
    from vf.models.tiny import builtin_model_path

    init = _weights(builtin_model_path("tiny-random"))
    w32 = _weights(latest(out_dir / "fp32"))
    w16 = _weights(latest(out_dir / "bf16"))
    d32, d16, dtypes = [], [], set()
    for k, w0 in init.items():
        if k not in w16 or k not in w32:
            continue
        dtypes.add(str(w16[k].dtype).replace("torch.", ""))
        # against the start as the checkpoint's dtype holds it: rounding is not learning
        d32.append((w32[k].cpu().double() - w0.to(w32[k].dtype).double()).flatten())
        d16.append((w16[k].cpu().double() - w0.to(w16[k].dtype).double()).flatten())
    u32, u16 = torch.cat(d32), torch.cat(d16)
    moved32 = u32 != 0
    moved_frac = float((u16[moved32] != 0).double().mean()) if moved32.any() else 0.0
    cosine = float(torch.nn.functional.cosine_similarity(u16, u32, dim=0)) if moved32.any() else 0.0
    rel = [abs(a - b) / max(abs(a), 1e-12) for a, b in zip(fp32, bf16)]
    checks = {
        "checkpoint holds fp32 master weights": dtypes == {"float32"},
        "the fp32 run moves weights": bool(moved32.any()),
        f"bf16 moves >= {BF16_MOVED:.0%} of the weights fp32 moves": moved_frac >= BF16_MOVED,
        f"update cosine with fp32 >= {BF16_COSINE}": cosine >= BF16_COSINE,
        f"loss within {BF16_LOSS_REL:g} relative of fp32": len(rel) == len(fp32) == 3 and max(rel) <= BF16_LOSS_REL,
    }
    return checks_result(checks, lr=BF16_LR, losses_fp32=fp32, losses_bf16=bf16, loss_rel=rel,
                         moved_fraction=moved_frac, update_cosine=cosine,
                         update_norm_ratio=float(u16.norm() / u32.norm()) if u32.norm() > 0 else None,
                         checkpoint_dtypes=sorted(dtypes), fp32_moved_elements=int(moved32.sum()),
                         mem_bytes_per_param={"fp32": row32.get("mem_bytes_per_param"),
                                              "bf16": row16.get("mem_bytes_per_param")},
                         tolerance=f"moved >= {BF16_MOVED}, cosine >= {BF16_COSINE}, loss rel <= {BF16_LOSS_REL:g}")


# -- 4. pytest -m gpu ------------------------------------------------------------------------


def step_gpu_pytest(out: str) -> dict[str, Any]:
    """The test files that mark something gpu (module or test level), run with `-m gpu`."""
    import xml.etree.ElementTree as ET

    files = sorted(str(f.relative_to(ROOT)) for f in (ROOT / "tests").glob("test_*.py")
                   if "mark.gpu" in f.read_text(errors="replace"))
    if not files:
        return result("fail", "no test file marks tests gpu")
    xml = Path(out) / "pytest-gpu.xml"
    xml.parent.mkdir(parents=True, exist_ok=True)
    try:
        p = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider",
                            f"--junitxml={xml}", *files], capture_output=True, text=True, check=False,
                           cwd=ROOT, timeout=400)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        return result("fail", f"pytest ran past 400 s:\n{_tail(out, 20)}", files=files)
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    if xml.exists():
        for suite in ET.parse(xml).getroot().iter("testsuite"):
            for k in counts:
                counts[k] += int(suite.get(k, 0))
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    ok = p.returncode == 0 and counts["passed"] > 0
    reason = "" if ok else (f"pytest exited {p.returncode}; " if p.returncode else "") + (
        "no gpu test passed" if counts["passed"] == 0 else "") + "\n" + _tail(p.stdout, 20)
    return result("pass" if ok else "fail", reason.strip(), files=files, exit_code=p.returncode, **counts)


# -- 5. engine -------------------------------------------------------------------------------


PROMPTS = [[5, 17, 45, 300, 2, 9, 11, 80, 7], [99, 7, 8, 9], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]]
NEW_TOKENS = 16


def _engine_greedy(model: str, device: str):
    import asyncio

    from vf.engines.base import Sampling
    from vf.engines.local import LocalEngine

    engine = LocalEngine.from_model(model, device=device, max_batch=4)

    async def go():
        try:
            return await asyncio.gather(*[engine.generate_ids(p, Sampling(temperature=0.0, max_tokens=NEW_TOKENS),
                                                              ignore_eos=True) for p in PROMPTS])
        finally:
            await engine.close()

    return engine, asyncio.run(go())


def step_engine(device: str) -> dict[str, Any]:
    torch = _torch_setup(device)
    from transformers import AutoModelForCausalLM
    from vf.models.tiny import builtin_model_path
    from vf.trainer.samples import Sample, micro_batches
    from vf.trainer.step import PolicyLogprobs

    path = builtin_model_path("tiny")
    engine, dev_seqs = _engine_greedy("tiny", device)
    _, cpu_seqs = _engine_greedy("tiny", "cpu")
    hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).to(device).eval()
    hf.generation_config.eos_token_id = None  # all new tokens, as the engine with ignore_eos
    hf_tokens = []
    with torch.no_grad():
        for p in PROMPTS:
            g = hf.generate(torch.tensor([p], device=device), attention_mask=torch.ones(1, len(p), dtype=torch.long,
                            device=device), max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)
            hf_tokens.append(g[0, len(p):].tolist())
    dev_tokens = [s.token_ids for s in dev_seqs]
    cpu_tokens = [s.token_ids for s in cpu_seqs]
    # the trainer's log-probs of the device engine's tokens, packed as the trainer packs them
    samples = [Sample(p + s.token_ids, [0] * len(p) + [1] * len(s.token_ids), [0.0] * len(p) + list(s.logprobs))
               for p, s in zip(PROMPTS, dev_seqs)]
    (mb,) = micro_batches(samples, seq_len=128, micro_batch_size=1)
    with torch.no_grad():
        logp = PolicyLogprobs(engine.model)(mb.input_ids.to(device), mb.position_ids.to(device),
                                            mb.targets.to(device), 1.0).float().cpu()
    mask = mb.loss_mask.reshape(-1).bool()
    err = (logp[mask] - mb.inference_logprobs.reshape(-1)[mask].float()).abs().max().item()
    tol = LOGPROB_TOL["cuda" if device.startswith("cuda") else "cpu"]
    return checks_result(
        {"device engine == CPU engine": dev_tokens == cpu_tokens,
         "device engine == transformers generate": dev_tokens == hf_tokens,
         "every sampled token scored": int(mask.sum()) == sum(map(len, dev_tokens)),
         f"trainer log-probs == engine's within {tol:g}": err <= tol},
        device=device, new_tokens=NEW_TOKENS, prompts=len(PROMPTS), logprob_max_abs_diff=err, tolerance=tol,
        tokens_device=dev_tokens, tokens_cpu=cpu_tokens, tokens_transformers=hf_tokens)


# -- 6. families -----------------------------------------------------------------------------

# case -> (mechanism, transformers class it needs)
FAMILY_CASES = {
    "glm4_moe": ("MoE grouped GEMM", "Glm4MoeForCausalLM"),
    "deepseek_v3": ("MLA", "DeepseekV3ForCausalLM"),
    "qwen3_next": ("recurrent hybrid (gated DeltaNet)", "Qwen3NextForCausalLM"),
    "qwen3_vl": ("VL (images through the vision tower)", "Qwen3VLForConditionalGeneration"),
}


def step_family(device: str, case: str, out: str) -> dict[str, Any]:
    """(child) One family against transformers on `device`, fp32 logits."""
    torch = _torch_setup(device)
    import transformers

    mechanism, cls = FAMILY_CASES[case]
    if not hasattr(transformers, cls):
        return result("skipped", f"transformers {transformers.__version__} has no {cls}", mechanism=mechanism)
    sys.path.insert(0, str(ROOT / "tests"))  # the tests' tiny-config builders
    from vf.models import load_model

    d = Path(out) / case
    d.mkdir(parents=True, exist_ok=True)
    diffs: dict[str, float] = {}
    if case == "qwen3_vl":
        return _vl_case(torch, device, d, mechanism)
    if case == "qwen3_next":
        from test_models_hybrid import IDS, build_hybrid

        hf = build_hybrid(case, d)
    else:
        from test_models_families import IDS, build_family

        hf = build_family(case, d)
    hf = hf.to(device)
    native = load_model(d, device=device)
    ids = IDS.to(device)
    impls = ("loop", "grouped") if native.config.num_experts else (None,)
    with torch.no_grad():
        ref = hf(input_ids=ids).logits.float()
        for impl in impls:
            if impl:
                native.set_moe_impl(impl)
            diffs[impl or "native"] = (native.compute_logits(ids).float() - ref).abs().max().item()
    return checks_result({f"{k} logits within {LOGIT_TOL:g}": v <= LOGIT_TOL for k, v in diffs.items()},
                         mechanism=mechanism, device=device, max_abs_logit_diff=diffs, tolerance=LOGIT_TOL,
                         architecture=native.config.architecture)


def _vl_case(torch, device: str, d: Path, mechanism: str) -> dict[str, Any]:
    """tests/test_vl.py's tiny Qwen3-VL: a two-image prompt and a text-only prompt."""
    from test_vl import END, IMAGE_TOKEN, START, TEXT, TOKENS, VISION, pixels, prompt
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration
    from vf.models import load_model

    cfg = Qwen3VLConfig(text_config=TEXT, vision_config=VISION, image_token_id=IMAGE_TOKEN, video_token_id=291,
                        vision_start_token_id=START, vision_end_token_id=END)
    torch.manual_seed(0)
    Qwen3VLForConditionalGeneration(cfg).save_pretrained(d)
    hf = Qwen3VLForConditionalGeneration.from_pretrained(d, dtype=torch.float32).to(device).eval()
    ours = load_model(d, device=device)
    grids = [(1, 8, 8), (1, 4, 6)]
    ids = torch.tensor([prompt(grids, tokens=TOKENS)], device=device)
    kw = {"pixel_values": pixels(grids).to(device), "image_grid_thw": torch.tensor(grids, device=device),
          "mm_token_type_ids": (ids == IMAGE_TOKEN).int()}
    text = torch.tensor([[1, 2, 3, 4, 5, 6]], device=device)
    with torch.no_grad():
        img = (hf(input_ids=ids, **kw).logits - ours.compute_logits(ids, **kw)).abs().max().item()
        txt = (hf(input_ids=text).logits - ours.compute_logits(text)).abs().max().item()
        matters = (ours.compute_logits(ids) - ours.compute_logits(ids, **kw)).abs().max().item()
    return checks_result({f"image prompt logits within {LOGIT_TOL:g}": img <= LOGIT_TOL,
                          f"text prompt logits within {LOGIT_TOL:g}": txt <= LOGIT_TOL,
                          "the images change the logits": matters > 1e-3},
                         mechanism=mechanism, device=device, tolerance=LOGIT_TOL,
                         max_abs_logit_diff={"images": img, "text": txt}, image_effect=matters)


# -- 7. performance --------------------------------------------------------------------------

# (trainer case, engine sizes) per mode: the issue's shapes on a GPU, the suites' tiny sizes with --cpu
PERF = {
    "cuda": {"trainer": {"shape": "qwen3-0.6b", "batch": 4, "seq": 2048, "steps": 3, "dtype": "bfloat16"},
             "engine": {"shape": "qwen3-0.6b", "batches": [16, 64], "tokens": 128, "prompt_len": 32, "repeats": 3,
                        "dtype": "bfloat16"}},
    "cpu": {"trainer": {"shape": "tiny", "batch": 2, "seq": 64, "steps": 1, "dtype": "float32"},
            "engine": {"shape": "tiny", "batches": [1, 4], "tokens": 8, "prompt_len": 8, "repeats": 1,
                       "dtype": "float32"}},
}
GOALS = {"trainer_speedup": 1.0, "trainer_mfu_pct": 40.0, "engine_b16_speedup": 1.5}


def step_perf_trainer(device: str) -> dict[str, Any]:
    """(child, parent of its own children) trainer suite: ours vs transformers, one child each."""
    from vf.models import read_config

    from vf.bench.common import measure_peak_flops, run_child
    from vf.bench.trainer import flops_per_token, prepare

    spec = PERF["cuda" if device.startswith("cuda") else "cpu"]["trainer"]
    path = prepare(spec["shape"], None)["path"]
    kw = {"path": path, "batch": spec["batch"], "seq": spec["seq"], "steps": spec["steps"], "device": device,
          "dtype": spec["dtype"]}
    # each side in its own process: its peak memory is its own
    ours = run_child("vf.bench.trainer:measure", {"variant": "ours", **kw}, timeout=600)
    ref = run_child("vf.bench.trainer:measure", {"variant": "ref", **kw}, timeout=600)
    peak = measure_peak_flops()  # the datasheet figure on a known GPU, else this CPU's best fp32 matmul
    fpt = flops_per_token(read_config(path), spec["seq"])
    for side in (ours, ref):
        side["mfu_pct"] = round(100 * fpt * side["tokens_per_s"] / peak["peak_flops"], 2) if fpt else None
    speedup = ours["tokens_per_s"] / ref["tokens_per_s"]
    loss_rel = abs(ours["loss"] - ref["loss"]) / max(abs(ref["loss"]), 1.0)
    loss_tol = 2e-2 if spec["dtype"] == "bfloat16" else 1e-4
    goals = {"speedup >= 1": speedup >= GOALS["trainer_speedup"]}
    if device.startswith("cuda"):
        goals["MFU >= 40%"] = (ours["mfu_pct"] or 0) >= GOALS["trainer_mfu_pct"]
    return checks_result({f"same loss as transformers (rel <= {loss_tol:g})": loss_rel <= loss_tol},
                         case=spec, ours=ours, ref=ref, speedup=round(speedup, 3), peak=peak, goals_met=goals,
                         loss_rel=loss_rel)


def step_perf_engine(device: str) -> dict[str, Any]:
    from vf.bench.engine import family_model, measure

    spec = dict(PERF["cuda" if device.startswith("cuda") else "cpu"]["engine"])
    shape = spec.pop("shape")  # the trainer case's checkpoint (built once) with the tiny tokenizer
    model = "tiny" if shape == "tiny" else family_model(shape)["path"]
    res = measure(model=model, device=device, **spec)  # this child is the suite's measuring child
    cases, matched = {}, True
    for B in spec["batches"]:
        r = res[str(B)]
        lo, hf = r["local"], r["hf"]
        same, total = map(int, lo["greedy_match"].split("/"))
        matched &= same == total
        cases[f"batch {B}"] = {"ours_tokens_per_s": lo["tokens_per_s"], "ref_tokens_per_s": hf["tokens_per_s"],
                               "speedup": round(lo["tokens_per_s"] / hf["tokens_per_s"], 3),
                               "decode_speedup": round(lo["decode_tok_s"] / hf["decode_tok_s"], 3),
                               "greedy_match": lo["greedy_match"]}
    goals = {}
    if "batch 16" in cases:
        goals["decode at batch 16 >= 1.5x transformers"] = cases["batch 16"]["speedup"] >= GOALS["engine_b16_speedup"]
    # greedy rows agreeing is a canary, not a pass condition in bf16 (near-ties flip on rounding)
    checks = {"measured every batch size": all(f"batch {B}" in cases for B in spec["batches"])}
    if spec["dtype"] == "float32":
        checks["greedy tokens equal transformers'"] = matched
    return checks_result(checks, model=model, spec=spec, cases=cases, goals_met=goals, params=res.get("params"))


# -- 8. multi-GPU ----------------------------------------------------------------------------

MULTI_ARGS = ["--warmup.steps", "1", "--warmup.batch-size", "8", "--batch-size", "8", "--group-size", "4",
              "--eval.at-start", "false", "--eval.at-end", "false", "--seed", "7", "--trainer.micro-batch-size", "2",
              "--trainer.seq-len", "96", "--steps", "2", "--async.deterministic", "--model.tf32", "false"]
# case -> (reference case, model, extra args); nproc 2 unless the case is a reference
MULTI_CASES = {
    "one-dense": (None, "dense", []),
    "fsdp-dp2": ("one-dense", "dense", []),
    "ring-cp2": ("one-dense", "dense", ["--parallel.cp", "2"]),
    "ulysses-cp2": ("one-dense", "dense", ["--parallel.cp", "2", "--parallel.cp-style", "ulysses"]),
    "one-moe": (None, "moe", []),
    "ep2": ("one-moe", "moe", ["--parallel.ep", "2"]),
    "cp2-ep2": ("one-moe", "moe", ["--parallel.ep", "2", "--parallel.cp", "2"]),
}


def step_multi_gpu(device: str, out: str) -> dict[str, Any]:
    import torch

    sys.path.insert(0, str(ROOT / "tests"))
    from test_router_replay import build_moe

    out_dir = Path(out)
    models = {"dense": "tiny-random", "moe": str(build_moe(out_dir / "moe-model"))}
    env = {**os.environ, "NO_COLOR": "1", "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    losses: dict[str, list[float] | None] = {}
    cases: dict[str, Any] = {}
    for name, (ref, model, extra) in MULTI_CASES.items():
        run_dir = out_dir / name
        launch = ([sys.executable, "-m", "vf.commands.train"] if ref is None else
                  [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                   "-m", "vf.commands.train"])
        cmd = [*launch, "-o", str(run_dir), "-m", models[model], "--model.device", device, *MULTI_ARGS, *extra]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=240, env=env)
            code, err = p.returncode, p.stderr
        except subprocess.TimeoutExpired:
            code, err = None, "timed out after 240 s"
        if code != 0:
            losses[name] = None
            cases[name] = result("fail", f"exited {code}: {_tail(err)}")
            continue
        losses[name] = [json.loads(x)["loss"] for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
        if ref is None:
            cases[name] = result("pass", "reference", losses=losses[name])
        elif losses.get(ref) is None:
            cases[name] = result("fail", f"its reference {ref} failed", losses=losses[name])
        else:
            ok, worst = _same_losses(losses[ref], losses[name], LOSS_REL)
            cases[name] = result("pass" if ok else "fail", "" if ok else f"losses differ from {ref}",
                                 losses=losses[name], reference=losses[ref], worst_rel=worst)
    bad = [k for k, v in cases.items() if v["status"] != "pass"]
    return result("fail" if bad else "pass", ("failed: " + ", ".join(bad)) if bad else "",
                  tolerance=f"|dloss| <= {LOSS_REL:g} * max(|loss|, 1)", gpus=torch.cuda.device_count(),
                  not_covered="kill -9 and resume at another ep, NCCL weight push to vLLM (tests/test_vllm_train.py "
                              "on CPU; no vLLM here)", cases=cases)


# -- driver ---------------------------------------------------------------------------------


def _child_env() -> dict[str, str]:
    """The children import this module as `gpu_check` and the tests' builders from tests/."""
    paths = [str(ROOT / "benchmarks"), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]
    # PYTHONSAFEPATH: `python -m` in the checkout's root must not put its `vf/` folder (the top-level
    # package alone) in front of an installed vf (a wheel on the GPU machines)
    return {"PYTHONPATH": os.pathsep.join(p for p in paths if p), "PYTHONUNBUFFERED": "1", "PYTHONSAFEPATH": "1"}


def _probe() -> dict[str, Any]:
    """CUDA devices, asked in a child (the driver never initialises CUDA itself)."""
    code = ("import json,torch;c=torch.cuda.is_available();"
            "print(json.dumps({'cuda':c,'count':torch.cuda.device_count() if c else 0}))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=120)
    if p.returncode != 0:
        raise SystemExit(f"gpu_check: cannot import torch: {_tail(p.stderr, 5)}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def plan(cpu_mode: bool, cuda: bool, gpus: int, device: str, out: Path) -> list[tuple[Step, str | None, dict]]:
    """(step, skip reason or None, child kwargs) in order."""
    kwargs = {
        "env": {"device": device, "cpu_mode": cpu_mode},
        "train_parity": {"device": device, "out": str(out / "train_parity")},
        "bf16_learns": {"device": device, "out": str(out / "bf16_learns")},
        "gpu_pytest": {"out": str(out)},
        "engine": {"device": device},
        "families": {"device": device, "out": str(out / "families")},
        "perf": {"device": device},
        "multi_gpu": {"device": device, "out": str(out / "multi_gpu")},
    }
    rows = []
    for s in STEPS:
        skip = None
        if s.name == "gpu_pytest" and not cuda:
            skip = s.needs_cuda
        elif s.name == "multi_gpu" and gpus < 2:
            skip = f"{s.needs_cuda} (found {gpus}); tests/test_parallel_train.py covers the layouts on CPU/gloo"
        elif not cpu_mode and not cuda and s.name != "env":
            skip = "no CUDA device (run with --cpu for the CPU stand-in)"
        rows.append((s, skip, kwargs[s.name]))
    return rows


# steps made of parts, each part in its own child (a crash in one does not hide the others):
# step -> (child step name, {part: extra kwargs})
PARTS = {
    "families": ("family", {case: {"case": case} for case in FAMILY_CASES}),
    "perf": (None, {"trainer": {}, "engine": {}}),  # children perf_trainer, perf_engine
}


def run_parts(step: str, kw: dict[str, Any], deadline: float) -> dict[str, Any]:
    """A PARTS step: fail if a part failed, pass if one passed, else skipped."""
    from vf.bench.common import ChildFailed, run_child

    child, parts = PARTS[step]
    cases = {}
    for part, extra in parts.items():
        left = deadline - time.monotonic()
        if left <= 5:
            cases[part] = result("fail", "not run: the step's time was spent")
            continue
        try:
            cases[part] = run_child("gpu_check:run_step", {"name": child or f"{step}_{part}", "kw": {**kw, **extra},
                                                           "step": step}, timeout=left, env=_child_env())
        except ChildFailed as e:
            cases[part] = result("fail", f"crashed: {e}")
    statuses = {v["status"] for v in cases.values()}
    bad = [k for k, v in cases.items() if v["status"] == "fail"]
    status = "fail" if bad else ("pass" if "pass" in statuses else "skipped")
    reason = ("failed: " + ", ".join(bad)) if bad else "; ".join(
        f"{k} skipped: {v['reason']}" for k, v in cases.items() if v["status"] == "skipped")
    return result(status, reason, cases=cases)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="gpu_check", description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpu", action="store_true", help="run the device steps on the CPU (no CUDA needed)")
    ap.add_argument("--out", help="output directory (default runs/gpu_check/<UTC time>)")
    ap.add_argument("--steps", help=f"comma-separated subset of: {','.join(BY_NAME)}")
    ap.add_argument("--budget-s", type=float, default=900,
                    help="wall-clock budget: a step that cannot start inside it fails (default 900)")
    args = ap.parse_args(argv)
    wanted = [s.strip() for s in args.steps.split(",")] if args.steps else list(BY_NAME)
    unknown = [s for s in wanted if s not in BY_NAME]
    if unknown:
        print(f"gpu_check: unknown step(s) {', '.join(unknown)}; choose from {', '.join(BY_NAME)}", file=sys.stderr)
        return 2
    out = Path(args.out or ROOT / "runs" / "gpu_check" / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())).resolve()
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from vf.bench.common import ChildFailed, run_child

    t0 = time.monotonic()
    probe = _probe()
    cuda, gpus = probe["cuda"], probe["count"]
    device = "cpu" if args.cpu else "cuda"
    verdict: dict[str, Any] = {"schema": SCHEMA, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                               "mode": "cpu" if args.cpu else "device", "device": device, "cuda": cuda,
                               "gpus": gpus, "out": str(out), "steps": []}
    path = out / "verdict.json"
    for step, skip, kw in plan(args.cpu, cuda, gpus, device, out):
        if step.name not in wanted:
            continue
        started = time.monotonic()
        left = args.budget_s - (started - t0)
        if skip:
            res = result("skipped", skip)
        elif left <= 5:
            res = result("fail", f"not run: the {args.budget_s:.0f} s budget was spent")
        else:
            print(f"gpu_check: {step.name}: {step.title} ...", file=sys.stderr, flush=True)
            timeout = min(step.timeout, left)
            try:
                if step.name in PARTS:
                    res = run_parts(step.name, kw, time.monotonic() + timeout)
                else:
                    res = run_child("gpu_check:run_step", {"name": step.name, "kw": kw}, timeout=timeout,
                                    env=_child_env())
            except ChildFailed as e:
                res = result("fail", f"crashed: {e}")
        res = {"name": step.name, "title": step.title, **res, "wall_s": round(time.monotonic() - started, 1)}
        verdict["steps"].append(res)
        mark = {"pass": "ok  ", "fail": "FAIL", "skipped": "skip"}[res["status"]]
        print(f"gpu_check: {mark} {step.name} ({res['wall_s']} s){': ' + res['reason'].splitlines()[0] if res['reason'] else ''}",
              file=sys.stderr, flush=True)
        verdict["wall_s"] = round(time.monotonic() - t0, 1)
        _write(path, verdict)  # after every step: a killed run still leaves what it checked
    counts = {k: sum(s["status"] == k for s in verdict["steps"]) for k in ("pass", "fail", "skipped")}
    verdict.update(ok=counts["fail"] == 0, counts=counts, wall_s=round(time.monotonic() - t0, 1))
    _write(path, verdict)
    print(f"gpu_check: {'PASSED' if verdict['ok'] else 'FAILED'}: {counts['pass']} passed, {counts['fail']} failed, "
          f"{counts['skipped']} skipped in {verdict['wall_s']} s; verdict:", file=sys.stderr)
    print(path)
    return 0 if verdict["ok"] else 1


def _write(path: Path, verdict: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(verdict, indent=1, default=str) + "\n")
    tmp.replace(path)


if __name__ == "__main__":
    sys.exit(main())
