"""Build the built-in agent model (`tiny-agent`) with vf's own commands.

    python -m vf.models.build_agent [--out models/tiny_agent_trained] [--run-dir DIR]

The recipe (RECIPE below; seeded, CPU, fp32):

    base    a random-init Qwen3 of AGENT_MODEL's shape (8192-token context) whose byte-level BPE
            tokenizer is trained on swe-gen code, unittest output and the bash harness's prompt
            and tool schema (`corpus_lines`): ~2 characters a token, a gold episode ~1,100 tokens
    gold    `vf-rollout swe-gen` with the bash harness against the scripted gold policy
            (vf.environments.swe_gen.gold_server) answering with the base model's token ids: the
            trajectories are exactly what the harness sends and gets back
    sft     `vf-train --loss sft --data <gold run dir>` from the base until the success rate on
            validation swe-gen tasks (a third seed) reaches the recipe's 0.1, or `--sft-stop-at R`
            (`vf-train --eval.stop-at`, checked every 10 steps, at most 400; `gated_sft` says why)
    ipo     `vf-train --taskset swe-gen --env.agent.harness.id bash` from the SFT model, evaluated
            before and after on held-out swe-gen tasks (another `--taskset.seed`)

Each step's run dir is kept under `--run-dir` (default: a temp dir); the output is an HF
directory plus `build.json`: the recipe, the package version/commit, the held-out success rate
after SFT and after IPO (solved counts, Wilson 95% intervals and a one-sided two-proportion test
on the same held-out episodes: `held_out`), where SFT stopped, and each phase's wall time. As with
`tiny`, the IPO phase batches rollouts as they arrive, so a rebuild matches in behaviour, not in
bytes.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml
from vf.environments.swe_gen.generate import KINDS as ALL_KINDS
from vf.environments.swe_gen.generate import generate
from vf.environments.swe_gen.gold_server import start
from vf.models import tiny

from vf.episode.harnesses import BashHarness
from vf.version import version_info

OUT = Path(__file__).parent / "tiny_agent_trained"
BIN = Path(sys.executable).parent
AGENT_MODEL = {**tiny.MODEL, "max_position_embeddings": 8192}
AGENT_VOCAB = 2048
KINDS = ["import"]
"""The bug kind it trains on: the one whose whole fix the traceback spells out (`NameError: name
'json' is not defined` -> `sed -i '1i import json' m.py`), which a 2-layer model learns to copy
within minutes of CPU. `name` is not: the sandbox's Python 3.11 prints no `Did you mean` for a
local, so the right spelling is not in the output (0/48 solved in the first build)."""
TRAIN = {"seed": 1, "size": 256, "kinds": KINDS}
VALIDATION = {"id": "swe-gen", "seed": 3, "size": 32, "kinds": KINDS}
"""Where the SFT phase checks its success rate (`sft.stop_at`): neither trained on nor reported."""
HELD_OUT = {"id": "swe-gen", "seed": 2, "size": 64, "kinds": KINDS}

RECIPE: dict = {
    "base": {"model": AGENT_MODEL, "vocab": AGENT_VOCAB, "seed": tiny.SEED, "corpus_seeds": 40},
    "gold": {"taskset": TRAIN},
    "sft": {"lr": 3e-3, "batch_size": 8, "max_steps": 400, "check_every": 10, "stop_at": 0.1,
            "validation": VALIDATION},
    "ipo": {"steps": 40, "lr": 3e-4, "batch_size": 64, "group_size": 8, "max_tokens": 80,
            "taskset": TRAIN, "max_turns": 6, "refill": True},
    "eval": {"taskset": HELD_OUT, "limit": 64, "num_rollouts": 2},
    "seq_len": 2048,
    "seed": 0,
}


def corpus_lines(seeds: int) -> list[str]:
    """Tokenizer training text: what an episode is made of (see the module doc)."""
    lines = [BashHarness.PROMPT, BashHarness.EDIT_PROMPT, json.dumps(BashHarness.BASH), json.dumps(BashHarness.EDIT)] * 4
    lines += ["Traceback (most recent call last):", "AssertionError", "NameError: name", "is not defined",
              "AttributeError: module 'helpers' has no attribute", "Did you mean:", "Ran 1 test in 0.000s",
              "FAILED (failures=1)", "FAILED (errors=1)", "OK", "=" * 70, "-" * 70, '{"command": "python3 ',
              '{"name": "bash", "arguments": ']
    for kind in ALL_KINDS:
        for seed in range(seeds):
            gen = generate(kind, seed)
            lines += [gen.fix_command, json.dumps({"command": gen.fix_command}), gen.repo.symptom,
                      *gen.repo.files.values(), *gen.repo.hidden.values()]
    return lines + tiny.corpus()


def ensure_base(run_dir: Path) -> Path:
    """The random-init base model (tokenizer included), built once per recipe into the vf cache."""
    base = RECIPE["base"]
    lines = corpus_lines(base["corpus_seeds"])
    digest = hashlib.sha256(json.dumps([base, lines, tiny.CHAT_TEMPLATE]).encode()).hexdigest()[:12]
    root = Path(os.environ.get("VF_CACHE_DIR") or Path.home() / ".cache" / "vf")
    return tiny.build_once(root / f"tiny-agent-random-{digest}",
                           lambda out: tiny.build_into(out, AGENT_MODEL, lines, AGENT_VOCAB), tiny._complete)


def vf_command(name: str, *args: str, log: Path) -> None:
    """Run one of vf's commands (`vf-train`, ...) under `nice`, its output into `log`."""
    with open(log, "w") as f:
        proc = subprocess.run(["nice", str(BIN / name), *args], stdout=f, stderr=subprocess.STDOUT, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{name} {' '.join(args)} exited {proc.returncode}; see {log}")


def record_gold(base: Path, out: Path) -> None:
    """`vf-rollout` through the bash harness against the gold policy server (token ids from `base`)."""
    fields = RECIPE["gold"]["taskset"]
    loop, ready, box = asyncio.new_event_loop(), threading.Event(), {}

    async def serve() -> None:
        box["server"], _ = await start(fields, tokenizer=str(base))
        ready.set()

    thread = threading.Thread(target=lambda: (loop.run_until_complete(serve()), loop.run_forever()), daemon=True)
    thread.start()
    if not ready.wait(120):
        raise SystemExit("the gold policy server did not start (its error is above)")
    url = f"http://127.0.0.1:{box['server'].sockets[0].getsockname()[1]}/v1"
    try:
        vf_command("vf-rollout", "swe-gen", "--base-url", url, "-m", "swe-gen-gold", "-n", str(fields["size"]),
                   "-r", "1", "--taskset.seed", str(fields["seed"]), "--taskset.size", str(fields["size"]),
                   "--taskset.kinds", json.dumps(fields["kinds"]),
                   "-o", str(out), "--no-push", log=out.parent / "gold.log")
    finally:
        loop.call_soon_threadsafe(box["server"].close)
        loop.call_soon_threadsafe(loop.stop)


def train(config: dict, out: Path) -> dict:
    """`vf-train CONFIG.yaml -o out`; its summary.json."""
    path = out.parent / f"{out.name}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=True))
    vf_command("vf-train", str(path), "-o", str(out), log=out.parent / f"{out.name}.log")
    return json.loads((out / "summary.json").read_text())


def export(run: Path, base: Path, out: Path) -> Path:
    """The run's latest checkpoint as an HF directory (the base's tokenizer files beside it)."""
    import torch
    from vf.models import load_model
    from vf.models.checkpoint import save_hf
    from vf.trainer import checkpoint

    model = load_model(base, dtype=torch.float32)
    model.load_state_dict(checkpoint.load(checkpoint.latest(run))["model"])
    out.mkdir(parents=True, exist_ok=True)
    save_hf(model, out)
    for name in tiny.TOKENIZER_FILES:
        shutil.copy(base / name, out / name)
    return out


def wilson(solved: int, n: int, z: float = 1.96) -> list[float]:
    """The 95% Wilson score interval of a success rate (sound near 0 and 1, unlike p ± 2σ)."""
    if n == 0:
        return [0.0, 1.0]
    p, d = solved / n, 1 + z * z / n
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    centre = (p + z * z / (2 * n)) / d
    return [round(max(0.0, centre - half), 4), round(min(1.0, centre + half), 4)]


def two_proportion_p(a: int, n: int, b: int, m: int) -> float:
    """One-sided p-value that rate b/m exceeds a/n by chance (pooled two-proportion z test)."""
    pooled = (a + b) / (n + m) if n + m else 0.0
    se = math.sqrt(pooled * (1 - pooled) * (1 / n + 1 / m)) if n and m else 0.0
    if se == 0:
        return 1.0
    return 0.5 * math.erfc((b / m - a / n) / se / math.sqrt(2))


def held_out(run: Path) -> dict:
    """Solved counts before (the SFT model) and after IPO on the same held-out episodes, their
    intervals and the test that says whether the gain is more than noise."""
    out = {}
    for when in ("before", "after"):
        s = json.loads((run / "evals" / when / "summary.json").read_text())
        n = s["num_episodes"]
        solved = round(s["mean_reward"] * n)
        out[when] = {"solved": solved, "episodes": n, "rate": round(solved / n, 4) if n else 0.0,
                     "wilson95": wilson(solved, n), "pass_at_k": s.get("pass_at_k")}
    b, a = out["before"], out["after"]
    out["p_one_sided"] = round(two_proportion_p(b["solved"], b["episodes"], a["solved"], a["episodes"]), 5)
    return out


def evaluation() -> dict:
    ev = RECIPE["eval"]
    return {"taskset": ev["taskset"], "select": {"limit": ev["limit"]}, "num_rollouts": ev["num_rollouts"]}


def agent_env() -> dict:
    """The harness every phase runs the model through (the gold recording has its own)."""
    return {"agent": {"harness": {"id": "bash"}, "max_turns": RECIPE["ipo"]["max_turns"]}}


def gated_sft(stop_at: float) -> dict:
    """The recipe's SFT section with another success rate to stop at (`--sft-stop-at`).

    Why SFT stops on measured success rather than after a fixed number of steps: the tiny model
    leaves a loss plateau (~0.08: it has learnt the moves but not yet to copy the missing name from
    the traceback) anywhere between step 120 and past 200, depending on the recording (each
    episode's sandbox path is in its tracebacks), and a fixed 200 steps gave held-out starts from
    6% to 66%. Why 0.1: IPO needs room above the start; gated at 0.3, two builds started at 41% and
    51% held-out and gained only 5 points in 20 steps. From 0.1 (14% held out) 20 IPO steps gained
    7 points, 40 gained 21 (benchmarks/RESULTS.md), hence the recipe's 40."""
    return {**RECIPE["sft"], "stop_at": stop_at}


def sft_config(base: Path, gold: Path, sft: dict | None = None) -> dict:
    """`vf-train --loss sft --data <gold>` from `base`, evaluated on the validation tasks every
    `check_every` steps and stopped once their success rate reaches `stop_at` (`gated_sft`)."""
    s = sft or RECIPE["sft"]
    v = s["validation"]
    return {"model": {"path": str(base)}, "loss": {"name": "sft"},
            "data": {"path": str(gold), "batch_size": s["batch_size"]},
            "steps": s["max_steps"], "optim": {"lr": s["lr"]}, "trainer": {"seq_len": RECIPE["seq_len"]},
            "seed": RECIPE["seed"], "env": agent_env(), "sampling": {"max_tokens": RECIPE["ipo"]["max_tokens"]},
            "ckpt": {"every": 0},
            "eval": {"at_start": False, "at_end": False, "every": s["check_every"], "stop_at": s["stop_at"],
                     "taskset": v, "select": {"limit": v["size"]}, "num_rollouts": 1}}


def ipo_config(start: Path) -> dict:
    p = RECIPE["ipo"]
    return {"model": {"path": str(start)}, "taskset": {"id": "swe-gen", **p["taskset"]}, "env": agent_env(),
            "warmup": {"steps": 0}, "steps": p["steps"], "optim": {"lr": p["lr"]},
            "orchestrator": {"batch_size": p["batch_size"], "group_size": p["group_size"], "refill": p["refill"]},
            "sampling": {"max_tokens": p["max_tokens"]}, "trainer": {"seq_len": RECIPE["seq_len"]},
            "eval": evaluation(), "seed": RECIPE["seed"]}


def build(out: Path = OUT, run_dir: Path | None = None, sft_stop_at: float | None = None) -> dict:
    """Run the recipe (module doc) and write the model into `out`; returns build.json's content.
    A model that solves no held-out task is not written (exit 1): it would be worse than none."""
    tmp, sft = None, gated_sft(sft_stop_at) if sft_stop_at is not None else RECIPE["sft"]
    if run_dir is None:
        run_dir = Path(tmp := tempfile.mkdtemp(prefix="vf-build-agent-"))
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        clock = {"start": time.monotonic()}
        base = ensure_base(run_dir)
        if not (run_dir / "gold" / "summary.json").exists():  # a kept run dir: finished phases stay
            record_gold(base, run_dir / "gold")
        clock["gold"] = time.monotonic()
        if not (run_dir / "sft" / "summary.json").exists():
            train(sft_config(base, run_dir / "gold", sft), run_dir / "sft")
        sft_summary = json.loads((run_dir / "sft" / "summary.json").read_text())
        sft_model = export(run_dir / "sft", base, run_dir / "sft-hf")
        clock["sft"] = time.monotonic()
        summary = train(ipo_config(sft_model), run_dir / "ipo")
        clock["ipo"] = time.monotonic()
        info = {
            "recipe": {**RECIPE, "sft": sft}, "base": base.name, "built_by": version_info(),
            "held_out_success_after_sft": summary.get("reward_before"),
            "held_out_success_after_ipo": summary.get("reward_after"),
            "held_out": held_out(run_dir / "ipo"),
            "sft": {"steps": sft_summary.get("stopped_at") or sft_summary["steps"],
                    "validation_success": sft_summary.get("reward_after"),
                    "reached_stop_at": sft_summary.get("stopped_at") is not None},
            "ipo_train": {k: summary.get(k) for k in ("train_reward_first", "train_reward_last", "groups_sampled",
                                                      "groups_refilled", "zero_variance_groups", "wall_time")},
            "minutes": {k: round((clock[k] - clock[prev]) / 60, 1)
                        for prev, k in (("start", "gold"), ("gold", "sft"), ("sft", "ipo"))},
        }
        if not info["held_out_success_after_ipo"]:
            raise SystemExit(f"the model solves no held-out task; not written to {out}. Runs: {run_dir}\n"
                             + json.dumps(info, indent=2))

        def write(folder: Path) -> None:
            export(run_dir / "ipo", base, folder)
            (folder / "build.json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
            shutil.copy(run_dir / "ipo" / "metrics.png", folder / "metrics.png")

        shutil.rmtree(out, ignore_errors=True)  # a rebuild replaces it (build_once keeps a complete one)
        tiny.build_once(Path(out), write, tiny._complete)
        return info
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m vf.models.build_agent", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=OUT, help=f"output HF dir (default {OUT})")
    p.add_argument("--run-dir", type=Path, default=None,
                   help="keep the phases' run dirs here (default: temp); phases finished there are kept")
    p.add_argument("--sft-stop-at", type=float, default=None, metavar="R",
                   help="SFT until the validation success rate reaches R instead of the recipe's "
                        f"{RECIPE['sft']['stop_at']} (checked every 10 steps, at most 400; gated_sft)")
    args = p.parse_args(argv)
    info = build(args.out, args.run_dir, args.sft_stop_at)
    print(json.dumps(info, indent=2))  # stdout is data: build.json's content


if __name__ == "__main__":
    main()
