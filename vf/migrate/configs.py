"""Config files: v0 eval TOML, verifiers v1 TOML generations, old trainer configs → our YAML.

Decision: TOML configs become our YAML config files (`vf-eval --config X.yaml`,
`vf-train X.yaml`): `X.toml` → `X.yaml` (several `[[eval]]` tables → `X.<name>.yaml` each) and
the TOML is removed (its `.bak` is kept on --write). The shape is sniffed, not named: a TOML that
is none of these (ruff.toml, a package's pyproject) is left alone; a pyproject's
`[tool.verifiers.eval]` is reported, never rewritten.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import yaml

from vf.migrate.report import INFO, MANUAL, MIGRATED, Report

SAMPLING_KEYS = {"temperature", "top_p", "top_k", "min_p", "max_tokens", "seed", "stop"}


def _strip_v1(taskset: str) -> str:
    return taskset[:-3] if isinstance(taskset, str) and taskset.endswith(("-v1", "_v1")) else taskset


def _sampling(src: dict[str, Any], notes: list) -> dict[str, Any]:
    out = {}
    for k, v in (src or {}).items():
        if k == "max_completion_tokens":
            k = "max_tokens"
        if k in SAMPLING_KEYS:
            out[k] = v
        else:
            notes.append((MANUAL, f"sampling key {k!r} has no vf equivalent (dropped)"))
    return out


def sniff(data: dict[str, Any], name: str) -> str | None:
    """'v0-eval' | 'v1-0.2' | 'v1-0.3' | 'v1-0.4' | 'trainer' | 'pyproject' | None."""
    if name == "pyproject.toml":
        return "pyproject" if data.get("tool", {}).get("verifiers") else None
    if "trainer" in data or "orchestrator" in data or ("env" in data and "model" in data and isinstance(data.get("env"), dict)
                             and "args" in data["env"] and "taskset" not in data["env"]):
        return "trainer"
    if "eval" in data or "num_examples" in data or "rollouts_per_example" in data or "env_id" in data:
        return "v0-eval"
    if "taskset" in data or "harness" in data or "legacy" in data:
        return "v1-0.2"
    if "num_tasks" in data or (isinstance(data.get("env"), dict) and "serve" in data):
        return "v1-0.3"
    if isinstance(data.get("env"), dict) or "client" in data or "select" in data:
        return "v1-0.4"
    return None


def _eval_from_v0(defaults: dict, ev: dict, notes: list) -> dict:
    merged = {**{k: v for k, v in defaults.items() if k not in ("eval", "ablation")}, **ev}
    out: dict[str, Any] = {"taskset": {"id": merged.get("id") or merged.get("env_id"), **(merged.get("args") or merged.get("env_args") or {})}}
    if "model" in merged:
        out["model"] = merged["model"]
    sel = {}
    if "num_examples" in merged:
        sel["limit"] = merged["num_examples"]
    if merged.get("shuffle"):
        sel["shuffle"] = True
    if "shuffle_seed" in merged:
        sel["seed"] = merged["shuffle_seed"]
    if sel:
        out["select"] = sel
    if "rollouts_per_example" in merged:
        out["num_rollouts"] = merged["rollouts_per_example"]
    if "max_concurrent" in merged:
        out["max_concurrent"] = merged["max_concurrent"]
    samp = _sampling({**(merged.get("sampling_args") or {}), **(merged.get("sampling") or {}),
                      **{k: merged[k] for k in ("max_tokens", "temperature") if k in merged}}, notes)
    if samp:
        out["sampling"] = samp
    extra = merged.get("extra_env_kwargs") or {}
    if "max_turns" in extra:
        out["max_turns"] = extra["max_turns"]
    if "timeout" in merged:
        out["episode_timeout"] = merged["timeout"]
    engine = {}
    for src, dst in (("api_base_url", "base_url"), ("base_url", "base_url"), ("api_key_var", "api_key_var")):
        if src in merged:
            engine[dst] = merged[src]
    if engine:
        out["engine"] = engine
    for k in ("endpoint_id", "endpoints_path", "resume", "resume_path", "state_columns", "provider"):
        if k in merged:
            notes.append((MANUAL, f"{k} has no vf config key (dropped); set engine.base_url / use --resume DIR"))
    return out


def _eval_from_v1(data: dict, gen: str, notes: list) -> dict:
    env = data.get("env") if isinstance(data.get("env"), dict) else {}
    taskset = dict(data.get("taskset") or env.get("taskset") or {})
    legacy = data.get("legacy") or {}
    if legacy:
        taskset = {"id": legacy.get("id"), **(legacy.get("args") or {})}
    if "id" in taskset:
        taskset["id"] = _strip_v1(taskset["id"])
    out: dict[str, Any] = {"taskset": {k.replace("-", "_"): v for k, v in taskset.items()}}
    if "model" in data:
        out["model"] = data["model"]
    sel = dict(data.get("select") or {})
    for k in ("num_tasks", "num_examples"):
        if k in data:
            sel["limit"] = data[k]
    if "shuffle" in data:
        sel["shuffle"] = data["shuffle"]
    for k in ("include", "exclude"):
        if isinstance(sel.get(k), dict):
            idx = sel[k].get("idx")
            notes.append((MANUAL if set(sel[k]) - {"idx"} else INFO, f"select.{k} keeps only idx"))
            sel[k] = idx
    if sel:
        out["select"] = sel
    for k in ("num_rollouts", "rollouts_per_example", "group_size"):
        if k in data:
            out["num_rollouts"] = data[k]
    if "max_concurrent" in data:
        out["max_concurrent"] = data["max_concurrent"]
    agent = env.get("agent") or {}
    mt = data.get("max_turns", agent.get("max_turns", (data.get("harness") or {}).get("max_turns")))
    if mt is not None:
        out["max_turns"] = mt
    client = data.get("client") or {}
    engine = {k: client[k] for k in ("base_url", "api_key_var") if k in client}
    if engine:
        out["engine"] = engine
    samp = _sampling(data.get("sampling") or {}, notes)
    if samp:
        out["sampling"] = samp
    for k in ("harness", "serve", "run", "rich", "push", "output_dir"):
        if k in data:
            notes.append((INFO if k in ("run", "rich", "push", "output_dir") else MANUAL,
                          f"[{k}] has no vf config section (dropped)"))
    if agent.get("runtime") or agent.get("harness"):
        notes.append((MANUAL, "[env.agent.harness]/[env.agent.runtime] have no vf equivalent (dropped)"))
    return out


# prime-rl TOML keys vf-train does not use: listed in one report entry, never dropped silently
PRIME_RL_IGNORED = ("wandb", "deployment", "inference", "slurm", "log", "weight_broadcast", "output_dir")


def _env_entry(env: dict) -> dict:
    """One prime-rl env table (`[[orchestrator.train.env]]`, `[[orchestrator.env]]`, `[[env]]`) →
    vf taskset fields: `taskset = {id, ...}` / `env.taskset = {...}` (v1 envs) or `id` + `args` (v0)."""
    inner = env.get("env") if isinstance(env.get("env"), dict) else {}
    taskset = env.get("taskset") or inner.get("taskset")
    if isinstance(taskset, dict):
        return {**taskset, "id": _strip_v1(taskset.get("id"))}
    return {"id": _strip_v1(env.get("id") or env.get("name")), **(env.get("args") or {})}


def _env_list(value: Any) -> list[dict]:
    return [e for e in (value if isinstance(value, list) else [value] if isinstance(value, dict) else [])
            if isinstance(e, dict)]


def _loss(loss: dict, notes: list) -> dict:
    """prime-rl `[trainer.loss]` → vf's {name, params}, keeping the meaning where vf has it."""
    kind = loss.get("type")
    extra = {k: v for k, v in loss.items() if k not in ("type",)}
    if not loss:
        notes.append((MANUAL, "no [trainer.loss]: the run relied on prime-rl's default loss (which changed over "
                      "releases: DPPO+KL, then IPO eps 0.1, then IPO eps 0.3); migrated to vf's default, IPO with "
                      "eps 0.3 (kl off): check this is the loss you want"))
        return {"name": "ipo", "params": {"eps": 0.3}}
    if kind == "icepop" or "icepop_ratio_low" in loss or "ratio_low" in loss:
        low = loss.get("ratio_low", loss.get("icepop_ratio_low", 0.2))
        high = loss.get("ratio_high", loss.get("icepop_ratio_high", 5.0))
        notes.append((MIGRATED, f"[trainer.loss] icepop → loss icepop (low {low}, high {high}: same ratio band)"))
        _unused(extra, {"ratio_low", "ratio_high", "icepop_ratio_low", "icepop_ratio_high"}, notes)
        return {"name": "icepop", "params": {"low": low, "high": high}}
    if kind == "custom":
        notes.append((MANUAL, f"[trainer.loss] custom ({loss.get('import_path') or loss.get('path') or '?'}) has no vf "
                      "equivalent: port it to a trainer/losses module; migrated to IPO eps 0.3 meanwhile"))
        return {"name": "ipo", "params": {"eps": 0.3}}
    params: dict[str, Any] = {}
    if kind == "ipo" or "ipo_threshold" in loss or "eps" in loss:
        eps = loss.get("eps", loss.get("ipo_threshold", 0.1))
        params["eps"] = eps
        notes.append((MIGRATED, f"[trainer.loss] ipo (ipo_threshold/eps {eps}) → loss ipo eps {eps} (same |p−q| mask)"))
        used = {"eps", "ipo_threshold"}
    elif "ipo_mask_low" in loss or "ipo_mask_high" in loss:
        low, high = loss.get("ipo_mask_low", 0.2), loss.get("ipo_mask_high", 0.2)
        params["eps"] = max(low, high)
        status = MIGRATED if low == high else MANUAL
        notes.append((status, f"[trainer.loss] ipo_mask_low {low} / ipo_mask_high {high} → loss ipo eps {params['eps']}"
                      + ("" if low == high else ": vf's IPO mask is symmetric, the wider bound is kept")))
        used = {"ipo_mask_low", "ipo_mask_high"}
    else:  # type = "default": DPPO, the mask side chosen by the advantage sign
        low, high = loss.get("dppo_mask_low", 0.2), loss.get("dppo_mask_high", 0.2)
        params["eps"] = max(low, high)
        notes.append((MANUAL, f"[trainer.loss] DPPO (dppo_mask_low {low}, dppo_mask_high {high}; mask side by advantage "
                      f"sign) has no vf loss: migrated to IPO eps {params['eps']} (masks both sides, so it masks at "
                      "least the tokens DPPO did): check this is the loss you want"))
        used = {"dppo_mask_low", "dppo_mask_high"}
    kl = loss.get("kl_tau", 1e-3)  # prime-rl's KL default before it was turned off (#3586)
    if kl:
        params["kl_tau"] = kl
        notes.append((MIGRATED if "kl_tau" in loss else MANUAL,
                      f"kl_tau {kl} → ipo kl_tau {kl}" + ("" if "kl_tau" in loss else " (prime-rl's default then; vf's is 0)")))
    _unused(extra, used | {"kl_tau"}, notes)
    return {"name": "ipo", "params": params}


def _unused(loss: dict, used: set, notes: list) -> None:
    for k, v in loss.items():
        if k in used:
            continue
        if k == "adv_tau" and v == 1.0:
            notes.append((INFO, "adv_tau 1.0 dropped: vf's losses scale advantages by 1"))
        else:
            notes.append((MANUAL, f"[trainer.loss] {k} = {v!r} has no vf-train key (dropped)"))


def _trainer(data: dict, notes: list) -> dict:
    """A v0 trainer TOML or a prime-rl rl.toml → a `vf-train --config` YAML with the same meaning."""
    out: dict[str, Any] = {}
    model = data.get("model")
    if isinstance(model, dict):
        model = model.get("name") or model.get("path")
    if model:
        out["model"] = {"path": model}
    orch = data.get("orchestrator") or {}
    trainer = data.get("trainer") or {}
    train = orch.get("train") or {}
    envs = _env_list(train.get("env") or orch.get("env") or data.get("env"))
    if envs:
        out["taskset"] = _env_entry(envs[0])
        if len(envs) > 1:
            notes.append((MANUAL, f"{len(envs)} training envs; vf-train trains on one taskset: kept "
                          f"{out['taskset']['id']!r}, run one vf-train per env for the others "
                          f"({', '.join(str(_env_entry(e)['id']) for e in envs[1:])})"))
    args = trainer.get("args") or {}
    old_loss = args.get("loss_type")
    loss = trainer.get("loss") if isinstance(trainer.get("loss"), dict) else {}
    if old_loss:
        out["loss"] = {"name": "ipo", "params": {"eps": 0.3}}
        notes.append((MANUAL, f"loss made explicit: ipo (eps 0.3), vf's default; the old trainer used {old_loss}: "
                      "check this is the loss you want"))
    elif "args" in trainer and not loss:
        out["loss"] = {"name": "ipo", "params": {"eps": 0.3}}
        notes.append((MANUAL, "loss made explicit: ipo (eps 0.3), vf's default; the old trainer used its own default "
                      "(GRPO-style clipping): check this is the loss you want"))
    else:
        out["loss"] = _loss(loss, notes)
    lr = args.get("learning_rate", (trainer.get("optim") or {}).get("lr", (data.get("optim") or {}).get("lr")))
    if lr is not None:
        out["optim"] = {"lr": lr}
    orch_out = {}
    if "per_device_train_batch_size" in args or "batch_size" in orch:
        orch_out["batch_size"] = args.get("per_device_train_batch_size", orch.get("batch_size"))
    group = args.get("num_generations", orch.get("group_size", orch.get("rollouts_per_example")))
    if group is not None:
        orch_out["group_size"] = group
    if orch_out:
        out["orchestrator"] = orch_out
    sampling = train.get("sampling") or orch.get("sampling") or {}
    if sampling:
        out["sampling"] = _sampling(sampling, notes)
    seq_len = (trainer.get("model") or {}).get("seq_len", data.get("seq_len", orch.get("seq_len")))
    max_tokens = (out.get("sampling") or {}).get("max_tokens")
    if seq_len is not None and max_tokens is not None and seq_len <= max_tokens:
        notes.append((MANUAL, f"seq_len {seq_len} leaves no room for the prompt next to max_completion_tokens "
                      f"{max_tokens} (prime-rl truncated such samples; vf-train refuses): trainer.seq_len set to "
                      f"{max_tokens + 2048}, lower sampling.max_tokens instead if memory is tight"))
        seq_len = max_tokens + 2048
    if seq_len is not None:
        out["trainer"] = {"seq_len": seq_len}
    if "max_off_policy_steps" in orch:
        out["async"] = {"max_off_policy_steps": orch["max_off_policy_steps"]}
    ckpt = data.get("ckpt")
    if isinstance(ckpt, dict) and "interval" in ckpt:
        out["ckpt"] = {"every": ckpt["interval"]}
    ev = orch.get("eval") or {}
    eval_envs = _env_list(ev.get("env"))
    if eval_envs:
        out["eval"] = {"taskset": _env_entry(eval_envs[0]), **({"every": ev["interval"]} if "interval" in ev else {})}
        if eval_envs[0].get("group_size"):
            out["eval"]["num_rollouts"] = eval_envs[0]["group_size"]
        if len(eval_envs) > 1:
            notes.append((MANUAL, f"{len(eval_envs)} eval envs; vf-train evaluates one: kept "
                          f"{out['eval']['taskset']['id']!r}; run vf-eval for the others"))
    steps = args.get("max_steps", data.get("max_steps"))
    if steps is not None:
        out["steps"] = steps
    known = {"learning_rate", "per_device_train_batch_size", "num_generations", "max_steps", "loss_type"}
    for k in sorted(set(args) - known):
        notes.append((MANUAL, f"trainer.args.{k} has no vf-train key (dropped)"))
    ignored = [k for k in PRIME_RL_IGNORED if k in data]
    ignored += [f"trainer.{k}" for k in trainer if k not in ("args", "loss", "optim")]
    ignored += [f"orchestrator.{k}" for k in orch if k not in ("train", "env", "eval", "batch_size", "group_size",
                                                               "rollouts_per_example", "sampling", "seq_len",
                                                               "max_off_policy_steps")]
    if ignored:
        notes.append((INFO, f"not used by vf-train (dropped; deployment/logging/inference settings are run flags "
                      f"or have no equivalent): {', '.join(ignored)}"))
    return out


def migrate_toml(path: Path, source: str) -> Report:
    report = Report()
    try:
        data = tomllib.loads(source)
    except tomllib.TOMLDecodeError:
        return report
    kind = sniff(data, path.name)
    if kind is None:
        return report
    if kind == "pyproject":
        report.add(path, 1, "CFG900", MANUAL, "[tool.verifiers.eval] defaults are not read by vf: pass -n/-r or a "
                   "--config YAML (pyproject left unchanged)")
        return report
    outputs: list[tuple[Path, dict, list]] = []
    if kind == "v0-eval":
        evals = data.get("eval") or [data]
        if data.get("ablation"):
            report.add(path, 1, "CFG001", MANUAL, "[[ablation]] sweeps are not supported: write one config per point")
        for ev in evals:
            notes: list = []
            cfg = _eval_from_v0(data, ev, notes)
            name = ev.get("name") or cfg["taskset"]["id"]
            target = path.with_suffix(".yaml") if len(evals) == 1 else path.with_name(f"{path.stem}.{name}.yaml")
            outputs.append((target, cfg, [("CFG001", MIGRATED, f"[[eval]] {name} → {target.name}"),
                                          *[("CFG001", s, m) for s, m in notes]]))
    elif kind == "trainer":
        notes = []
        cfg = _trainer(data, notes)
        outputs.append((path.with_suffix(".yaml"), cfg, [("CFG004", MIGRATED, f"trainer config → {path.stem}.yaml"),
                                                         *[("CFG004", s, m) for s, m in notes]]))
    else:
        notes = []
        cfg = _eval_from_v1(data, kind, notes)
        rule = "CFG003" if kind == "v1-0.4" else "CFG002"
        outputs.append((path.with_suffix(".yaml"), cfg, [(rule, MIGRATED, f"verifiers {kind} eval config → {path.stem}.yaml"),
                                                         *[(rule, s, m) for s, m in notes]]))
    for target, cfg, notes in outputs:
        text = f"# migrated by vf-migrate from {path.name}\n" + yaml.safe_dump(cfg, sort_keys=False)
        old = target.read_text() if target.exists() else None
        report.change(target, old, text)
        for rule, status, msg in notes:
            report.add(path, 1, rule, status, msg)
    report.change(path, source, None)
    return report
