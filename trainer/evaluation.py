"""Evaluation of the current policy during training, written as a normal v1 run dir.

    RUN/evals/step_N/      config.yaml (an EvalConfig whose `model` is model/), traces.jsonl,
                           summary.json, model/ (the HF weights evaluated, with the tokenizer)

so `vf-eval --score RUN/evals/step_N` re-scores it and `vf-eval --resume RUN/evals/step_N` can
finish an interrupted one without the trainer. Task selection uses vf-eval's rules (`select`:
-n, shuffle, seed, include/exclude, via `vf.runner.make_plan`); episodes run through the harness.
Rollout r of task i samples with seed f(seed, i, r) at every evaluation, so evaluations at
different steps are paired (common random numbers) and their difference is less noisy.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path
from typing import Any

from vf.trainer.config import TrainConfig
from vf.trainer.orchestrator import derive_seed

from vf.config import EvalConfig, SamplingConfig
from vf.loading import load_taskset
from vf.rundir import RunDir
from vf.runner import make_plan, make_spec, run_plan
from vf.summary import summarize


def eval_config(config: TrainConfig, model_dir: str) -> EvalConfig:
    e = config.eval
    sampling = e.sampling or SamplingConfig(**config.sampling.model_dump(exclude={"replay_mask"}))
    return EvalConfig(taskset=dict(e.taskset or config.taskset), model=model_dir, sampling=sampling,
                      select=e.select, num_rollouts=e.num_rollouts, max_turns=config.orchestrator.max_turns,
                      command="eval")


def evaluate(step: int, run_dir: Path, config: TrainConfig, engine, model=None, tokenizer=None,
             label: str | None = None) -> dict[str, Any]:
    """Evaluate with `engine` (already holding the weights to evaluate); returns the summary."""
    out = RunDir(Path(run_dir) / "evals" / (label or f"step_{step}"))
    if out.path.exists():  # a re-run of the same step after resume: start that eval afresh
        import shutil

        shutil.rmtree(out.path)
    out.create()
    model_dir = out.path / "model"
    if model is not None:
        from vf.models import save_hf

        save_hf(model, model_dir)
        if tokenizer is not None:
            tokenizer.save_pretrained(str(model_dir))
    cfg = eval_config(config, str(model_dir.resolve()))
    out.save_config(cfg.model_dump(mode="json"))
    loaded = load_taskset(cfg.taskset.get("id", ""), cfg.taskset, cfg.env)
    plan = make_plan(loaded, cfg)
    spec = make_spec(engine, loaded, cfg, {"type": "eval", "id": out.path.name, "name": out.path.name,
                                           "train_step": step})
    spec.require_tokens = False
    episodes = []
    t0 = time.time()

    def seeded(i, task, r):
        sampling = dataclasses.replace(spec.sampling, seed=derive_seed(config.seed, "eval", task.data.idx, r))
        return dataclasses.replace(spec, sampling=sampling)

    asyncio.run(run_plan(plan.owed, spec, cfg.max_concurrent, [out.append, episodes.append], spec_for=seeded))
    summary = summarize(episodes, cfg.num_rollouts, wall_time=time.time() - t0, taskset=loaded.id,
                        model=cfg.model, command="eval", num_owed=len(plan.owed), num_resumed=0,
                        run_dir=str(out.path), train_step=step)
    out.write_summary(summary)
    return summary
