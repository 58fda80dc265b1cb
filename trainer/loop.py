"""The training loop: a linear read of what one `vf-train` run does.

    setup:   model (+ FSDP2 under torchrun), optimizer, scheduler; resume from the last checkpoint
    eval 0:  reward before training (RUN/evals/before)
    for step in start .. warmup.steps + steps:
        batch  ← SFT warm-up on gold replies | SFT on --data traces | RL batch from the orchestrator
        step   ← forward/backward over this rank's packed micro-batches, optimizer step
        publish the new weights to the orchestrator (which pushes them into the engine)
        write the rollouts (RUN/traces.jsonl) and one metrics.jsonl line; eval / checkpoint when due
    eval end: reward after training (RUN/evals/after); plot; summary.json

Step indices: step s consumes batch s and produces policy version s + 1 (versions count
optimizer steps). Warm-up steps come first (0 .. W−1), RL steps after.

Server mode (`engine.base_url`): rollouts and evaluations share one server, which holds one
policy at a time. An evaluation pushes the version it evaluates (`HttpPush`, a no-op when the
server already holds it), so it runs only where no rollout from another version can be in flight:
before training, after the warm-up (the first RL batch uses that same version), at the end, and
at `eval.every` steps only with `async_level` 0; other evaluations are skipped and said so. The
final weights are pushed at the end, so the server serves the trained policy afterwards.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vf.trainer import checkpoint, distributed
from vf.trainer.config import TrainConfig
from vf.trainer.metrics import MetricsLog, plot
from vf.trainer.orchestrator import Batch, TaskSource, derive_seed
from vf.trainer.samples import Sample, count_loss_tokens, micro_batches, trace_samples

from vf.errors import UsageError

SUMMARY_FILE = "summary.json"


@dataclass
class Progress:
    """Orchestrator progress, saved in checkpoints."""

    reward_before: float | None = None
    reward_after_warmup: float | None = None
    counters: dict[str, float] = field(default_factory=dict)


def resolve_model_path(path: str) -> Path:
    from vf.models.tiny import builtin_model_path

    builtin = builtin_model_path(path)
    if builtin is not None:
        return builtin
    p = Path(path).expanduser()
    if not (p / "config.json").is_file():
        raise UsageError(f"model {path!r} is not an HF model directory (no config.json)",
                         hint="pass 'tiny-random' or 'tiny' (built-in) or a local directory with config.json + safetensors + tokenizer")
    return p


def load_tasks(config: TrainConfig):
    from vf.config import SelectConfig
    from vf.loading import load_taskset
    from vf.selection import select_tasks

    loaded = load_taskset(config.taskset.get("id", ""), config.taskset)
    limit = 10_000 if loaded.taskset.INFINITE else None
    return loaded, select_tasks(loaded.taskset, SelectConfig(limit=limit))


# ---- batches that need no engine ------------------------------------------------------------


def gold_samples(tasks, tokenizer, model=None) -> list[Sample]:
    """SFT samples from the tasks' gold replies (`Task.validate()` returning a string)."""
    from vf.engines.chat import image_refs, render_multimodal, render_prompt

    out = []
    for task in tasks:
        gold = task.validate()
        if not isinstance(gold, str):
            raise UsageError(f"task {task.data.key} has no gold reply (validate() returned {type(gold).__name__})",
                             hint="set --warmup.steps 0 for tasksets without gold replies")
        multimodal = getattr(model, "is_multimodal", False)
        prompt = render_multimodal(tokenizer, model, task.messages())[0] if multimodal \
            else render_prompt(tokenizer, task.messages())
        reply = list(tokenizer.encode(gold, add_special_tokens=False)) + [tokenizer.eos_token_id]
        out.append(Sample(prompt + reply, [0] * len(prompt) + [1] * len(reply), [0.0] * (len(prompt) + len(reply)),
                          images=image_refs(task.messages()) if multimodal else []))
    return out


def load_data(path: str, min_reward: float | None) -> list[Sample]:
    from vf.trace import load_traces, read_episodes

    file = load_traces(path)
    if not file.exists():
        raise UsageError(f"--data {path}: no traces at {file}", hint="pass a run dir written by vf-rollout/vf-eval -o")
    samples = []
    for ep in read_episodes(file):
        if not ep.ok or (min_reward is not None and ep.reward < min_reward):
            continue
        for trace in ep.traces:
            samples.extend(trace_samples(trace, 0.0, {"reward": ep.reward}))
    if not samples:
        raise UsageError(f"--data {path}: no usable samples (token ids on assistant nodes"
                         + (f", reward ≥ {min_reward}" if min_reward is not None else "") + ")",
                         hint="traces need token ids: write them with vf-rollout")
    return samples


def pick(items: list, step: int, n: int, seed: int, tag: str) -> list:
    """Items for `step`: epoch permutations seeded by (seed, tag, epoch) — a function of (seed, step)."""
    import random

    out = []
    for pos in range(step * n, step * n + n):
        epoch, i = divmod(pos, len(items))
        order = list(range(len(items)))
        random.Random(derive_seed(seed, tag, epoch)).shuffle(order)
        out.append(items[order[i]])
    return out


# ---- the run ----------------------------------------------------------------------------------


def run(config: TrainConfig, run_dir: Path, *, resume: bool = False,
        on_step: Callable[[dict[str, Any]], None] | None = None,
        on_event: Callable[[str], None] | None = None) -> dict[str, Any]:
    import torch
    from transformers import AutoTokenizer
    from vf.models import load_model
    from vf.trainer import engine as engines
    from vf.trainer import losses
    from vf.trainer.evaluation import evaluate
    from vf.trainer.step import (
        PolicyLogprobs,
        compile_blocks,
        embedding_grad_in_place,
        make_optimizer,
        make_scheduler,
        train_step,
    )

    from vf.rundir import RunDir

    say = on_event or (lambda _msg: None)
    wall0 = time.time()
    d = distributed.init(config.model.device)
    if config.trainer.threads:
        torch.set_num_threads(config.trainer.threads)
    torch.manual_seed(config.seed)
    run_dir = Path(run_dir)
    W, total = config.warmup.steps, config.total_steps
    sft_data = config.data.path is not None
    rl = not sft_data and config.steps > 0

    # -- model, tokenizer, optimizer ------------------------------------------------------------
    path = resolve_model_path(config.model.path)
    dtype = getattr(torch, config.model.dtype)
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    model = load_model(path, dtype=dtype, device=d.device, moe_impl=config.model.moe.impl, impl=config.model.impl)
    model.activation_checkpointing = config.trainer.activation_checkpointing
    start, progress, snapshots = 0, Progress(), {}
    state = None
    if resume:
        ck = checkpoint.latest(run_dir)
        if ck is not None:
            state = checkpoint.load(ck)
            start = state["progress"]["step"]
            model.load_state_dict(state["model"])
            progress = Progress(state["progress"].get("reward_before"), state["progress"].get("reward_after_warmup"),
                                state["progress"].get("counters", {}))
            snapshots = state["snapshots"]
            say(f"resuming from {ck} (step {start})")
        else:
            say("no checkpoint yet: starting from step 0")
    embedding_grad_in_place(model, distributed=d.enabled)
    if config.model.compile:
        say(f"compiling {compile_blocks(model)} decoder blocks (the first steps are slower)")
    policy = distributed.shard(PolicyLogprobs(model, config.trainer.logprob_chunk), d)
    optimizer = make_optimizer(policy, config.optim.lr, config.optim.betas, config.optim.weight_decay)
    phases = [(0, config.warmup.lr or config.optim.lr), (W, config.optim.lr)] if W else None
    scheduler = make_scheduler(optimizer, config.optim.scheduler, config.optim.warmup_steps, total, phases)
    if state is not None:
        distributed.load_optimizer_state(policy, optimizer, state["optimizer"], d)
        scheduler.load_state_dict(state["scheduler"])
        checkpoint.set_rng_state(state["rng"])
    loss_rl = losses.get("sft" if sft_data else config.loss.name)
    loss_sft = losses.get("sft")
    params_rl = {} if sft_data else dict(config.loss.params)

    # -- run dir files (rank 0) -----------------------------------------------------------------
    log = MetricsLog(run_dir)
    traces = RunDir(run_dir)
    if d.is_main:
        log.truncate(start)
        if traces.traces.exists():  # drop rollouts of steps the checkpoint does not cover
            kept = [e for e in traces.read().kept if e.run.get("step", 0) < start]
            traces.rewrite(kept)

    loaded, tasks = load_tasks(config) if not sft_data or config.eval.at_start or config.eval.at_end else (None, [])
    data = load_data(config.data.path, config.data.min_reward) if sft_data else []
    gold = gold_samples(tasks, tokenizer, model) if W and not sft_data else []
    model_name = str(config.model.path)

    # -- engines (rank 0): rollouts, evaluation ---------------------------------------------------
    eval_engine = orch = http_push = None
    server = config.engine.resolved_type != "local"

    def full_state():
        return distributed.full_state_dict(policy, d)

    if d.is_main:
        need_eval = config.eval.at_start or config.eval.at_end or config.eval.every
        if server:
            from vf.trainer.weights import HttpPush

            # one pusher for the orchestrator and the evaluations (it skips re-pushing a version)
            http_push = HttpPush(config.engine.base_url, run_dir, model.config,
                                 api_key_var=config.engine.api_key_var)
            eval_engine = engines.server_for_eval(config) if need_eval else None
        elif need_eval:
            eval_engine = engines.embedded(path, tokenizer, config.model.dtype, "cpu" if d.device == "cpu" else d.device,
                                           config.engine.max_batch, config.model.impl)
    need_weights = eval_engine is not None or http_push is not None
    cur = full_state() if (d.enabled or rl or need_weights) else None

    def run_eval(step: int, label: str) -> dict[str, Any] | None:
        if eval_engine is None:
            return None
        if server:
            if not (step in (0, W, total) or config.orchestrator.async_level == 0):
                say(f"eval {label} skipped: the server would serve two policies at once "
                    "(server mode evaluates mid-run only with --orchestrator.async-level 0)")
                return None
            http_push.push(cur, step)
            evaluated = _hf_model(model.config, cur)  # saved as RUN/evals/LABEL/model
        else:
            eval_engine.update_weights(cur, step)
            evaluated = eval_engine.model
        say(f"evaluating ({label}) …")
        s = evaluate(step, run_dir, config, eval_engine, model=evaluated, tokenizer=tokenizer, label=label)
        say(f"eval {label}: reward {s['mean_reward']:.3f}  pass@k {s['pass_at_k']}")
        return s

    if d.is_main and start == 0 and config.eval.at_start:
        s = run_eval(0, "before")
        progress.reward_before = s["mean_reward"] if s else None

    if rl and d.is_main:
        from vf.trainer.orchestrator import Orchestrator
        from vf.trainer.weights import EmbeddedPush

        from vf.runner import EpisodeSpec, taskset_toolsets

        if server:
            rollout_engine, pusher = engines.server(config), http_push
        else:
            rollout_engine = engines.embedded(path, tokenizer, config.model.dtype,
                                              "cpu" if d.device == "cpu" else d.device, config.engine.max_batch,
                                              config.model.impl)
            pusher = EmbeddedPush(rollout_engine, config.drift.weight_noise, config.seed)
        spec = EpisodeSpec(engine=rollout_engine, model=model_name,
                           sampling=_sampling(config),
                           max_turns=config.orchestrator.max_turns, env=loaded.env, env_id=loaded.id,
                           run={"type": "train", "id": run_dir.name}, require_tokens=True,
                           shared_toolsets=taskset_toolsets(loaded))
        o = config.orchestrator
        orch = Orchestrator(source=TaskSource(tasks, config.seed), spec=spec, pusher=pusher,
                            group_size=o.group_size, groups_per_step=o.batch_size // o.group_size,
                            seed=config.seed, first=max(start, W), last=total, first_rl_step=W,
                            async_level=o.async_level, stale_steps=config.drift.stale_steps,
                            std_norm=o.std_norm, max_off_policy_steps=o.max_off_policy_steps,
                            max_concurrent=o.max_concurrent)
        for v, snap in snapshots.items():
            orch.publish(v, snap)
        orch.publish(start, cur)
        orch.start()

    # -- the loop ---------------------------------------------------------------------------------
    temperature = float(config.sampling.temperature)
    rows: list[dict[str, Any]] = log.read() if d.is_main else []
    after = None
    try:
        for step in range(start, total):
            t0 = time.perf_counter()
            wait = 0.0
            if sft_data:
                phase, bsz = "sft", config.data.batch_size or config.orchestrator.batch_size
                batch = Batch(step, pick(data, step, bsz, config.seed, "data"), [], {})
            elif step < W:
                phase, bsz = "warmup", config.warmup.batch_size or config.orchestrator.batch_size
                batch = Batch(step, pick(gold, step, bsz, config.seed, "gold"), [], {})
            else:
                phase = "rl"
                batch = None
                if d.is_main:
                    batch, wait = orch.get(step)
                batch = distributed.broadcast(batch, d)
            loss_fn, params = (loss_sft, {}) if phase == "warmup" else (loss_rl, params_rl)
            needs_lp = phase == "rl"
            n_tokens = count_loss_tokens(batch.samples, config.trainer.seq_len, needs_logprobs=needs_lp)
            mbs = micro_batches(batch.samples, config.trainer.seq_len, config.trainer.micro_batch_size,
                                pad_id=tokenizer.pad_token_id or 0, rank=d.rank, world_size=d.world_size,
                                image_token_id=getattr(model.config, "image_token_id", None))
            result = train_step(policy, optimizer, scheduler, mbs, loss_fn, params, n_tokens,
                                temperature=temperature if phase == "rl" else 1.0, grad_clip=config.optim.grad_clip,
                                world_size=d.world_size)
            if result.skipped:
                say(f"step {step}: non-finite logits ({int(result.metrics.get('nonfinite_logits', 0))} loss tokens) or "
                    f"gradient norm ({result.grad_norm}): update skipped, training continues")
            version = step + 1
            cur = full_state() if (d.enabled or orch is not None or need_weights) else None
            if orch is not None:
                orch.publish(version, cur)
                orch.forget_before(orch.version_for(version))
            step_time = time.perf_counter() - t0
            if d.is_main:
                row = _record(step, phase, result, batch, wait, step_time, n_tokens, scheduler, progress, d)
                for ep in batch.episodes:
                    traces.append(ep)
                evaluated = False
                if step == 0 and progress.reward_before is not None:
                    row["eval_reward_before"] = progress.reward_before
                if W and step == W - 1 and config.eval.at_start and rl:
                    s = run_eval(version, "after_warmup")
                    progress.reward_after_warmup = s["mean_reward"] if s else None
                    if s:
                        row["eval_reward"], evaluated = s["mean_reward"], True
                if version == total and config.eval.at_end:
                    after = run_eval(total, "after")
                    if after:
                        row["eval_reward"] = after["mean_reward"]
                        row.update({f"eval_pass@{k}": v for k, v in after["pass_at_k"].items()})
                elif config.eval.every and version % config.eval.every == 0 and not evaluated:
                    s = run_eval(version, f"step_{version}")
                    if s:
                        row["eval_reward"] = s["mean_reward"]
                        row.update({f"eval_pass@{k}": v for k, v in s["pass_at_k"].items()})
                log.append(row)
                rows.append(row)
                if on_step:
                    on_step(row)
            if config.ckpt.every and version % config.ckpt.every == 0 and version < total:
                _save(run_dir, version, policy, optimizer, scheduler, orch, progress, config, d, cur)
        # final checkpoint (every rank joins the collectives)
        if total > start:
            _save(run_dir, total, policy, optimizer, scheduler, orch, progress, config, d, cur)
    finally:
        if orch is not None:
            orch.close()
    if http_push is not None and cur is not None:
        http_push.push(cur, total)  # the server serves the trained policy (no-op after the final eval)
    summary: dict[str, Any] = {}
    if d.is_main:
        if after is None and config.eval.at_end and start >= total:  # nothing left to train
            after = run_eval(total, "after")
        plot(run_dir)
        rl_rows = [r for r in rows if r.get("phase") == "rl"]

        def mean(key, rs=rl_rows):
            vals = [r[key] for r in rs if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
            return sum(vals) / len(vals) if vals else None

        summary = {
            "steps": total, "warmup_steps": W, "rl_steps": 0 if sft_data else config.steps,
            "loss_name": "sft" if sft_data else config.loss.name,
            "reward_before": progress.reward_before,
            "reward_after_warmup": progress.reward_after_warmup,
            "reward_after": after["mean_reward"] if after else None,
            "pass_at_k_after": after["pass_at_k"] if after else None,
            "masked_fraction": mean("masked_fraction"), "mismatch_kl": mean("mismatch_kl"),
            "train_reward_first": rl_rows[0]["reward"] if rl_rows else None,
            "train_reward_last": rl_rows[-1]["reward"] if rl_rows else None,
            "step_time": mean("step_time", rows), "rl_step_time": mean("step_time"),
            "tokens_per_s": mean("tokens_per_s", rows),
            **{k: int(v) for k, v in progress.counters.items()},
            "wall_time": time.time() - wall0, "resumed_from": start if resume else None,
            "run_dir": str(run_dir), "world_size": d.world_size,
        }
        if http_push is not None:
            summary["weight_pushes"] = http_push.pushes
        import json

        (run_dir / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n")
    if eval_engine is not None:
        import asyncio

        asyncio.run(eval_engine.close())
    distributed.barrier(d)
    distributed.shutdown(d)
    return summary


def _record(step, phase, result, batch, wait, step_time, n_tokens, scheduler, progress: Progress, d) -> dict:
    """One metrics.jsonl row; also adds the batch's counts to the run's cumulative counters."""
    m = result.metrics
    row = {
        "step": step, "phase": phase, "loss": result.loss, "reward": batch.metrics.get("reward"),
        "masked_fraction": m.get("masked_fraction") if phase == "rl" else 0.0,
        "mismatch_kl": m.get("mismatch_kl") if phase == "rl" else None,
        "staleness": batch.metrics.get("staleness", 0.0),
        "tokens_per_s": result.num_tokens * d.world_size / max(step_time, 1e-9),
        "step_time": step_time, "train_time": result.seconds, "wait_time": wait,
        "lr": scheduler.get_last_lr()[0], "grad_norm": result.grad_norm, "num_loss_tokens": n_tokens,
        **{k: v for k, v in m.items() if k not in ("masked_fraction", "mismatch_kl")},
        **{k: v for k, v in batch.metrics.items() if k not in ("reward", "staleness")},
    }
    for k in ("dropped_stale_groups", "zero_variance_groups", "errored_rollouts"):
        progress.counters[k] = progress.counters.get(k, 0) + batch.metrics.get(k, 0)
    progress.counters["skipped_steps"] = progress.counters.get("skipped_steps", 0) + int(result.skipped)
    return row


def _hf_model(model_config, state: dict):
    """A plain NativeModel holding `state` (what an evaluation saves as its model/ dir)."""
    from vf.models import build_model

    m = build_model(model_config)
    m.load_state_dict(state)
    return m


def _sampling(config: TrainConfig):
    from vf.engines.base import Sampling

    s = config.sampling
    return Sampling(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, min_p=s.min_p,
                    max_tokens=s.max_tokens, seed=s.seed, stop=list(s.stop), logprobs=True)


def _save(run_dir, version, policy, optimizer, scheduler, orch, progress: Progress, config: TrainConfig, d, cur):
    """Checkpoint after `version` steps (collective under FSDP; rank 0 writes)."""
    opt_state = distributed.optimizer_state(policy, optimizer, d)
    model_state = cur if cur is not None else distributed.full_state_dict(policy, d)
    if not d.is_main:
        return
    snaps = orch.snapshots(orch.needed_versions(version)) if orch is not None else {}
    checkpoint.save(run_dir, version, model_state=model_state, optimizer_state=opt_state,
                    scheduler_state=scheduler.state_dict(), snapshots=snaps,
                    progress={"reward_before": progress.reward_before,
                              "reward_after_warmup": progress.reward_after_warmup,
                              "counters": progress.counters},
                    keep_last=config.ckpt.keep_last)
