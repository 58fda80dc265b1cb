"""`stability` suite: the same short RL run (`vf.trainer.loop.run`, the built-in tiny model on
reverse-text) under each loss, once with inference drifted on purpose and once not.

Drift (`vf.trainer.drift`): rollouts up to `async.level + stale_steps` = 8 policy versions behind
the trainer, and Gaussian noise on the engine's copy of the weights at every push (μ ≠ π even at
staleness 0). Losses: ipo at eps 0.1 / 0.2 / 0.3, icepop, ppo, cispo, and "no masking" (ipo with
eps 1e9, so its trust region never masks). Every run starts from the same SFT-warmed checkpoint
(built once and cached: the tiny model is random-init), same seed, same tasks.

Per run: final reward (an evaluation of the trained policy at the end, on the training tasks,
without drift), mean masked fraction, mean mismatch KL, and whether it diverged (a non-finite loss
or grad norm, or a final reward below half the start reward: the same evaluation before RL). Ratio per loss: `reward_vs_nomask` = its
final reward ÷ the no-masking run's (same drift). Checks: IPO eps 0.3 masks < 1% of tokens
undrifted; it does not diverge drifted. Also writes a PNG (reward and masked fraction per step).
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Any

from vf.bench.common import Case, Ratio, ratio, run_child, suite_result

LOSSES: list[tuple[str, str, dict[str, Any]]] = [
    ("ipo eps0.1", "ipo", {"eps": 0.1}),
    ("ipo eps0.2", "ipo", {"eps": 0.2}),
    ("ipo eps0.3", "ipo", {"eps": 0.3}),
    ("icepop", "icepop", {}),
    ("ppo", "ppo", {}),
    ("cispo", "cispo", {}),
    ("no masking", "ipo", {"eps": 1e9}),
]
NOMASK = "no masking"
DRIFT = {"stale_steps": 7, "weight_noise": 0.1}
RL_LR = 2e-4
"""RL learning rate. At the trainer's embedded default (1e-3) this batch size degrades the warmed
policy under every loss, drift or not (measured: reward 0.5 → 0.2–0.35), which says nothing about
the masks; 2e-4 keeps the undrifted runs level so drift is what differs."""

SIZES = {
    "full": {"warmup_steps": 40, "rl_steps": 24, "batch_size": 32, "group_size": 8, "max_tokens": 16,
             "eval_tasks": 40, "eval_rollouts": 2,
             "losses": [n for n, _, _ in LOSSES], "undrifted": [n for n, _, _ in LOSSES]},
    "quick": {"warmup_steps": 30, "rl_steps": 6, "batch_size": 16, "group_size": 4, "max_tokens": 12,
              "eval_tasks": 16, "eval_rollouts": 2,
              "losses": [n for n, _, _ in LOSSES], "undrifted": ["ipo eps0.3"]},
    "tiny": {"warmup_steps": 2, "rl_steps": 1, "batch_size": 4, "group_size": 2, "max_tokens": 4,
             "eval_tasks": 2, "eval_rollouts": 1, "losses": ["ipo eps0.3", NOMASK], "undrifted": ["ipo eps0.3"]},
}
WARMUP = {"lr": 3e-3, "batch_size": 32}


def _base(cfg: dict[str, Any]) -> dict[str, Any]:
    return {"steps": cfg["rl_steps"], "seed": 0, "optim": {"lr": RL_LR},
            "sampling": {"max_tokens": cfg["max_tokens"]},
            "orchestrator": {"batch_size": cfg["batch_size"], "group_size": cfg["group_size"]},
            # drift.stale_steps replays older policies: the fixed-lag mode
            "async": {"deterministic": True, "level": 1, "max_off_policy_steps": 8},
            # the final reward is an evaluation of the trained policy (drift-free), not the train reward
            # of rollouts that a stale engine generated
            "eval": {"at_start": True, "at_end": True, "every": 0, "select": {"limit": cfg["eval_tasks"]},
                     "num_rollouts": cfg["eval_rollouts"]},
            "ckpt": {"every": 0, "keep_last": 1}}


def warm_model(warmup_steps: int, batch_size: int) -> dict[str, Any]:
    """(child) An HF dir of the tiny model after `warmup_steps` SFT steps on reverse-text (cached)."""
    import shutil
    import tempfile

    from vf.bench.common import config_hash
    from vf.models.tiny import ensure_tiny_model

    tiny = ensure_tiny_model()
    key = config_hash({"tiny": tiny.name, "steps": warmup_steps, "batch": batch_size, **WARMUP})
    root = Path(os.environ.get("VF_CACHE_DIR") or Path.home() / ".cache" / "vf") / "bench"
    out = root / f"stability-warm-{key}"
    if (out / "config.json").exists():
        return {"path": str(out)}
    import torch

    from vf.models import load_model, save_hf
    from vf.trainer import checkpoint
    from vf.trainer.config import resolve
    from vf.trainer.loop import run as train

    with tempfile.TemporaryDirectory() as tmp:
        config = resolve({"steps": 0, "warmup": {"steps": warmup_steps, **WARMUP, "batch_size": batch_size},
                          "eval": {"at_start": False, "at_end": False}, "seed": 0}, base={})
        (Path(tmp) / "run").mkdir()
        train(config, Path(tmp) / "run")
        state = checkpoint.load(checkpoint.latest(Path(tmp) / "run"))["model"]
        model = load_model(tiny, dtype=torch.float32)
        model.load_state_dict(state)
        staging = out.with_name(out.name + f".tmp{os.getpid()}")
        save_hf(model, staging)
        for f in tiny.iterdir():  # tokenizer and generation config travel with the weights
            if not (staging / f.name).exists() and f.is_file():
                shutil.copy(f, staging / f.name)
        staging.rename(out)
    return {"path": str(out)}


def measure(path: str, cfg: dict[str, Any], runs: list[dict[str, Any]]) -> dict[str, Any]:
    """(child) Every run in turn from the warmed checkpoint; {run name: figures + per-step curves}."""
    import tempfile

    from vf.config import deep_merge
    from vf.trainer.config import resolve
    from vf.trainer.loop import run as train

    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in runs:
            over = _base(cfg)
            over.update(model={"path": path}, loss={"name": r["loss"], "params": r["params"]},
                        drift=r["drift"], warmup={"steps": 0})
            config = resolve(deep_merge(over, r.get("over", {})), base={})  # a setup's own keys on top
            rows: list[dict[str, Any]] = []
            t = time.perf_counter()
            run_dir = Path(tmp) / r["name"].replace(" ", "_").replace("[", "").replace("]", "")
            run_dir.mkdir()
            summary = train(config, run_dir, on_step=rows.append)
            rl = [x for x in rows if x.get("phase") == "rl"]
            out[r["name"]] = {**summarize(rl, summary.get("reward_before"), summary.get("reward_after")),
                              "seconds": round(time.perf_counter() - t, 1),
                              "off_policy_hist": summary.get("off_policy_hist"), "dropped": summary.get("dropped"),
                              "curve": {k: [x.get(k) for x in rl] for k in ("reward", "masked_fraction", "mismatch_kl",
                                                                            "staleness")}}
    return out


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None


def summarize(rl: list[dict[str, Any]], reward_before: float | None, reward_after: float | None) -> dict[str, Any]:
    def mean(key, rows=rl):
        vals = [_num(x.get(key)) for x in rows]
        vals = [v for v in vals if v is not None]
        return round(sum(vals) / len(vals), 5) if vals else None

    tail = rl[-max(1, len(rl) // 3):]
    final, first = _num(reward_after), _num(reward_before)
    nonfinite = any(x.get(k) is None or not math.isfinite(x.get(k)) for x in rl for k in ("loss", "grad_norm")
                    if k in x)
    collapsed = final is not None and first is not None and first > 0.05 and final < 0.5 * first
    return {"final_reward": final, "start_reward": first, "train_reward_last": mean("reward", tail),
            "masked_fraction": mean("masked_fraction"),
            "mismatch_kl": mean("mismatch_kl"), "staleness": mean("staleness"),
            "diverged": bool(nonfinite or collapsed), "steps": len(rl)}


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("reward", "train reward (rollouts)"), ("masked_fraction", "masked fraction"),
              ("mismatch_kl", "mismatch KL (trainer vs inference)")]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    losses = [n for n, _, _ in LOSSES]
    for name, r in results.items():
        style = "--" if "undrifted" in name else "-"  # one colour per loss, dashed when undrifted
        loss = name.split(" [")[0]
        color = f"C{losses.index(loss) % 10}" if loss in losses else "k"
        for ax, (key, _) in zip(axes, panels):
            ys = [x if isinstance(x, (int, float)) else float("nan") for x in r["curve"].get(key, [])]
            label = f"{name} (final {r['final_reward']:.2f})" if r.get("final_reward") is not None else name
            ax.plot(range(1, len(ys) + 1), ys, style, color=color, label=label)
    for ax, (_, title) in zip(axes, panels):
        ax.set(title=title, xlabel="RL step")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def study(suite: str, cfg: dict[str, Any], runs: list[dict[str, Any]], checks, notes: list[str],
          plot_path: str | None, t0: float) -> dict[str, Any]:
    """Run `runs` (each {name: "LOSS [SETUP]", loss, params, drift, over?}) from the warmed
    checkpoint and tabulate them: figures, the ratio to the same setup's no-masking run, and
    `checks(loss_name, setup, figures)` -> {check: passed}."""
    try:
        import vf.trainer.loop  # noqa: F401  (the trainer must be present)
    except ImportError as e:
        return suite_result(suite, cfg, [], skipped=f"the trainer is not available ({e})")
    path = run_child("vf.bench.stability:warm_model", {"warmup_steps": cfg["warmup_steps"],
                                                        "batch_size": WARMUP["batch_size"]}, timeout=3600)["path"]
    res = run_child("vf.bench.stability:measure", {"path": path, "cfg": cfg, "runs": runs}, timeout=7200)
    res.pop("_child_peak_rss_mib", None)
    cases = []
    for r in runs:
        n, drift = r["name"][:-1].split(" [")
        fig = {k: v for k, v in res[r["name"]].items() if k != "curve"}
        ref = {k: v for k, v in res.get(f"{NOMASK} [{drift}]", {}).items() if k != "curve"} if n != NOMASK else {}
        ratios = {}
        if ref:
            ratios["reward_vs_nomask"] = Ratio(ratio(fig["final_reward"], ref.get("final_reward")), "higher")
        cases.append(Case(name=r["name"], ours=fig, ref=ref, ours_label=f"{r['loss']} {r['params'] or ''}".strip(),
                          ref_label=f"no masking ({drift})" if ref else "—", ratios=ratios,
                          checks=checks(n, drift, fig)))
    extra: dict[str, Any] = {"curves": {k: v["curve"] for k, v in res.items()}}  # per-step, to re-plot
    if plot_path:
        plot(res, Path(plot_path))
        extra["plot"] = plot_path
    return suite_result(suite, cfg, cases, notes=notes, wall_s=round(time.perf_counter() - t0, 1), **extra)


def run(size: str = "full", plot_path: str | None = None, **_: Any) -> dict[str, Any]:
    t0 = time.perf_counter()
    cfg = {**SIZES[size], "size": size, "drift": DRIFT, "taskset": "reverse-text (trainer default)"}
    by_name = {n: (loss, params) for n, loss, params in LOSSES}
    runs = [{"name": f"{n} [drifted]", "loss": by_name[n][0], "params": by_name[n][1], "drift": DRIFT}
            for n in cfg["losses"]]
    runs += [{"name": f"{n} [undrifted]", "loss": by_name[n][0], "params": by_name[n][1],
              "drift": {"stale_steps": 0, "weight_noise": 0.0}} for n in cfg["undrifted"]]

    def checks(n: str, drift: str, fig: dict[str, Any]) -> dict[str, bool]:
        if n == "ipo eps0.3" and drift == "undrifted":
            return {"masked_fraction < 1%": fig["masked_fraction"] is not None and fig["masked_fraction"] < 0.01}
        if n == "ipo eps0.3" and drift == "drifted":
            return {"stable (not diverged)": not fig["diverged"]}
        return {}

    notes = [(f"drifted = stale_steps {DRIFT['stale_steps']} + async.level 1 (rollouts up to 8 versions old) and "
              f"weight noise {DRIFT['weight_noise']}; {cfg['rl_steps']} RL steps of {cfg['batch_size']} rollouts "
              f"after a {cfg['warmup_steps']}-step SFT warm-up; no masking = ipo eps 1e9")]
    return study("stability", cfg, runs, checks, notes, plot_path, t0)
