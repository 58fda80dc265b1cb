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
        from vf.migrate.prime_rl import Refused, trainer_config

        notes = []
        try:
            cfg = trainer_config(data, notes)
        except Refused as e:  # it would run with another meaning: the TOML stays, the report says why
            report.add(path, 1, "CFG004", MANUAL, f"not converted: {e}")
            for status, message in notes:
                report.add(path, 1, "CFG004", status, message)
            return report
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
