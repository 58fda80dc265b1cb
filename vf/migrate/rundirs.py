"""Old run dirs → our run dir (`traces.jsonl` of Episodes + `config.yaml`), by sniffing shapes.

Shapes (the version number does not tell them apart, see reference §3.7):
  v0      results.jsonl rows with `example_id`, `prompt`, `completion` + metadata.json
  A       results.jsonl of bare Trace lines (`nodes`) + config.toml
  B       traces.jsonl of bare Trace lines + config.toml
  C       traces.jsonl of Episode lines (`traces`) + config.toml
  D       Episode lines + configs/eval.json
  E       Episode lines + configs/resolved/eval.json
  ours    config.yaml + Episode lines whose producer is vf: nothing to do
Converted lines are written to `traces.jsonl` (the old file keeps a `.bak` when it is replaced)
and `config.yaml` is derived from the old config. Old files with other names are left in place.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import yaml

from vf.migrate.report import INFO, MANUAL, MIGRATED, Report

# Task fields verifiers adds to every TaskData that vf's TaskData does not have.
VERIFIERS_TASK_FIELDS = {"network_allow", "artifact_max_bytes", "example_id", "src_id", "tools"}


def _read_lines(path: Path) -> list[dict[str, Any]]:
    rows = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # torn line: dropped, as resume would
        if isinstance(row, dict):
            rows.append(row)
    return rows


def sniff(run: Path) -> str | None:
    """The generation of a run dir, 'ours', or None when it is not a run dir."""
    traces, results = run / "traces.jsonl", run / "results.jsonl"
    if (run / "config.yaml").exists() and traces.exists():
        rows = _read_lines(traces)
        if all(r.get("producer", {}).get("name") == "vf" for r in rows):
            return "ours"
    if results.exists() and (run / "metadata.json").exists():
        return "v0"
    if results.exists() and (run / "config.toml").exists():
        return "A"
    if traces.exists():
        rows = _read_lines(traces)
        episode = bool(rows) and "traces" in rows[0]
        if (run / "configs" / "resolved" / "eval.json").exists():
            return "E"
        if (run / "configs" / "eval.json").exists():
            return "D"
        if (run / "config.toml").exists():
            return "C" if episode else "B"
    return None


def _nodes(prompt: list, completion: list | str) -> list[dict[str, Any]]:
    if isinstance(completion, str):
        completion = [{"role": "assistant", "content": completion}]
    nodes = []
    for m in [*prompt, *completion]:
        nodes.append({"parent": len(nodes) - 1 if nodes else None, "message": dict(m),
                      "sampled": m.get("role") == "assistant"})
    return nodes


def _task_data(example_id: int, prompt: list | str, answer: Any, info: Any) -> dict[str, Any]:
    """The TaskData a migrated v0 env's load() yields for this row (same hash, so resume matches)."""
    data: dict[str, Any] = {"idx": int(example_id)}
    msgs = [dict(m) for m in prompt] if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
    if msgs and msgs[0].get("role") == "system":
        data["system_prompt"] = msgs.pop(0).get("content")
    data["prompt"] = msgs[0]["content"] if len(msgs) == 1 and msgs[0].get("role") == "user" and \
        isinstance(msgs[0].get("content"), str) else msgs
    data["answer"] = "" if answer is None else str(answer)
    data["info"] = json.loads(info) if isinstance(info, str) else dict(info or {})
    return data


def stable_id(*parts: Any) -> str:
    """Ids derived from the source line, so converting the same run dir twice gives the same file."""
    import hashlib

    return hashlib.sha256(":".join(map(str, parts)).encode()).hexdigest()[:32]


def _episode(task: dict, trace: dict, env_id: str, rollout: int, run_name: str, n: int = 0) -> dict[str, Any]:
    from vf.trace import Episode

    trace.setdefault("id", stable_id(run_name, n, "trace"))
    ep = Episode.model_validate({"id": stable_id(run_name, n), "env": {"id": env_id, "name": env_id}, "task": task, "rollout": rollout,
                                 "run": {"type": "eval", "id": run_name, "name": run_name},
                                 "group": {"id": task.get("hash", "")[:16]}, "traces": [trace]})
    return json.loads(ep.finish().to_json())


def _trace_task(data: dict[str, Any], type_: str = "Task") -> dict[str, Any]:
    from vf.trace import task_hash

    h = task_hash(data)
    return {"type": type_, "data": data, "key": data.get("id") or h, "hash": h}


def convert_v0(run: Path) -> tuple[list[dict], dict, list]:
    meta = json.loads((run / "metadata.json").read_text())
    notes: list = []
    env_id = meta.get("env_id") or meta.get("name") or "unknown"
    episodes, seen = [], {}
    for row in _read_lines(run / "results.jsonl"):
        eid = row.get("example_id", 0)
        rollout = seen.get(eid, 0)
        seen[eid] = rollout + 1
        task = _trace_task(_task_data(eid, row.get("prompt") or [], row.get("answer"), row.get("info")))
        err = row.get("error")
        errors = [{"type": (err.get("error") if isinstance(err, dict) else None) or "Error",
                   "message": (err.get("message") if isinstance(err, dict) else str(err)) or ""}] if err else []
        usage = row.get("token_usage") or {}
        trace = {"task": task, "nodes": _nodes(row.get("prompt") or [], row.get("completion") or []),
                 "calls": [{"usage": {"prompt_tokens": int(usage.get("input_tokens", 0)),
                                      "completion_tokens": int(usage.get("output_tokens", 0))}}] if usage else [],
                 "rewards": {"reward": {"score": float(row.get("reward") or 0.0), "weight": 1.0}} if not err else {},
                 "metrics": {k: float(v) for k, v in (row.get("metrics") or {}).items() if isinstance(v, (int, float))},
                 "ok": not err, "is_completed": bool(row.get("is_completed", not err)), "errors": errors,
                 "stop_condition": row.get("stop_condition"),
                 "info": {"migrated_from": "v0", **({"is_truncated": row["is_truncated"]} if "is_truncated" in row else {})}}
        episodes.append(_episode(task, trace, env_id, rollout, run.name, len(episodes)))
    config = {"taskset": {"id": env_id, **(meta.get("env_args") or {})}, "model": meta.get("model", "tiny"),
              "num_rollouts": int(meta.get("rollouts_per_example", 1))}
    if meta.get("base_url"):
        config["engine"] = {"base_url": str(meta["base_url"]).split(",")[0]}
    sel = {"limit": meta.get("num_examples")}
    if meta.get("shuffle"):
        sel.update(shuffle=True, seed=int(meta.get("shuffle_seed") or 0))
    config["select"] = sel
    samp = {k: v for k, v in (meta.get("sampling_args") or {}).items()
            if k in ("temperature", "top_p", "top_k", "min_p", "max_tokens", "seed")}
    if samp:
        config["sampling"] = samp
    notes.append((INFO, "v0 rewards are kept as one 'reward' (the weighted total); per-function scores are in "
                  "metrics. vf-eval --score with the migrated env recomputes them per function."))
    return episodes, config, notes


def _fix_trace(t: dict[str, Any]) -> dict[str, Any]:
    """A verifiers v1 trace (any generation) → a dict our Trace model validates."""
    t = dict(t)
    t.pop("version", None)
    t.pop("producer", None)
    info = dict(t.get("info") or {})
    if "verifiers" in t:
        info["verifiers"] = t.pop("verifiers")
    rewards = {}
    for k, v in (t.get("rewards") or {}).items():
        if isinstance(v, (int, float)):
            rewards[k] = {"score": float(v), "weight": 1.0}
        elif isinstance(v, dict) and "score" in v:
            rewards[k] = {"score": float(v["score"]), "weight": float(v.get("weight", 1.0))}
        else:
            rewards[k] = None
    t["rewards"] = rewards
    t["metrics"] = {k: (float(v) if isinstance(v, (int, float)) else None) for k, v in (t.get("metrics") or {}).items()}
    if "runtime" in t:  # older: trace-level runtime moved to agent.runtime
        t["agent"] = {**(t.get("agent") or {}), "runtime": t.pop("runtime")}
    if "error" in t and "errors" not in t:
        err = t.pop("error")
        t["errors"] = [err if isinstance(err, dict) else {"type": "Error", "message": str(err)}] if err else []
    timing = {}

    def flat(prefix: str, obj: Any) -> None:
        if isinstance(obj, dict):
            for k, v in obj.items():
                flat(f"{prefix}.{k}" if prefix else k, v)
        elif isinstance(obj, (int, float)) and not isinstance(obj, bool):
            timing[prefix.replace("generation", "agent")] = float(obj)

    flat("", t.get("timing") or {})
    t["timing"] = timing
    calls = []
    for c in t.get("calls") or []:
        c = dict(c)
        usage = c.get("usage") or {}
        c["usage"] = {k: int(v) for k, v in usage.items() if isinstance(v, int) and not isinstance(v, bool)}
        if isinstance(usage.get("cost"), (int, float)):
            c["cost"] = usage["cost"]
        c["time"] = {k: float(v) for k, v in (c.get("time") or {}).items() if isinstance(v, (int, float))}
        if isinstance(c.get("sampling"), dict) is False:
            c["sampling"] = {}
        if c.get("error") is not None and not isinstance(c["error"], dict):
            c["error"] = {"type": "Error", "message": str(c["error"])}
        calls.append(c)
    t["calls"] = calls
    t["task"] = _fix_task(t.get("task"))
    info.setdefault("migrated_from", "verifiers-v1")
    t["info"] = info
    return t


def _fix_task(task: Any) -> dict[str, Any]:
    if not isinstance(task, dict):
        return _trace_task({})
    data = dict(task.get("data") if isinstance(task.get("data"), dict) else
                {k: v for k, v in task.items() if k not in ("type", "key", "hash")})
    for k in VERIFIERS_TASK_FIELDS & set(data):
        data.pop(k)
    if "idx" not in data and "index" in data:
        data["idx"] = data.pop("index")
    return _trace_task({k: v for k, v in data.items() if v is not None}, task.get("type", "Task"))


def _v1_config(run: Path, gen: str, notes: list) -> dict:
    from vf.migrate.configs import _eval_from_v1

    if gen in ("A", "B", "C"):
        data = tomllib.loads((run / "config.toml").read_text())
    else:
        p = run / "configs" / ("resolved/eval.json" if gen == "E" else "eval.json")
        data = json.loads(p.read_text())
    local: list = []
    cfg = _eval_from_v1(data, gen, local)
    cfg.setdefault("model", data.get("model") or "tiny")
    for k in ("sampling",):
        if k in cfg:
            cfg[k] = {kk: v for kk, v in cfg[k].items() if v is not None}
    if isinstance(cfg.get("select"), dict):
        cfg["select"] = {k: v for k, v in cfg["select"].items() if v is not None and k in
                         ("limit", "shuffle", "seed", "skip", "include", "exclude")}
    cfg["taskset"] = {k: v for k, v in cfg["taskset"].items() if v is not None and not isinstance(v, dict)
                      and k not in ("system_prompt",)}
    notes.extend(local)
    return cfg


def convert_v1(run: Path, gen: str) -> tuple[list[dict], dict, list]:
    notes: list = []
    cfg = _v1_config(run, gen, notes)
    src = run / ("results.jsonl" if gen == "A" else "traces.jsonl")
    env_id = cfg["taskset"].get("id", "unknown")
    episodes, seen = [], {}
    for row in _read_lines(src):
        if "traces" in row:
            traces = [_fix_trace(t) for t in row["traces"]]
            task = _fix_task(row.get("task")) if row.get("task") else traces[0]["task"]
        else:
            traces = [_fix_trace(row)]
            task = traces[0]["task"]
        for k, t in enumerate(traces):
            t["task"] = task
            t.setdefault("id", stable_id(run.name, len(episodes), k))
        rollout = seen.get(task["hash"], 0)
        seen[task["hash"]] = rollout + 1
        from vf.trace import Episode

        ep = Episode.model_validate({"env": row.get("env") if isinstance(row.get("env"), dict) else {"id": env_id},
                                     "task": task, "rollout": rollout, "traces": traces,
                                     "run": {"type": "eval", "id": run.name, "name": run.name},
                                     "group": {"id": task["hash"][:16]},
                                     "errors": row.get("errors") if "traces" in row and isinstance(row.get("errors"), list) else []})
        ep.id = row.get("id") or stable_id(run.name, len(episodes))
        episodes.append(json.loads(ep.finish().to_json()))
    return episodes, cfg, notes


def migrate_rundir(run: Path) -> Report:
    report = Report()
    gen = sniff(run)
    if gen in (None, "ours"):
        return report
    episodes, cfg, notes = convert_v0(run) if gen == "v0" else convert_v1(run, gen)
    from vf.config import EvalConfig

    try:
        cfg_full = EvalConfig.model_validate(cfg).model_dump(mode="json")
    except Exception as e:  # noqa: BLE001 - a config we cannot validate is still written, flagged
        cfg_full = cfg
        report.add(run, 0, "RUN001" if gen == "v0" else "RUN002", MANUAL, f"config.yaml does not validate: {e}")
    rule = "RUN001" if gen == "v0" else "RUN002"
    traces = run / "traces.jsonl"
    new_traces = "".join(json.dumps(e) + "\n" for e in episodes)
    old = traces.read_text() if traces.exists() else None
    report.change(traces, old, new_traces)
    report.change(run / "config.yaml", None, f"# migrated by vf-migrate from a {gen} run dir\n"
                  + yaml.safe_dump(cfg_full, sort_keys=False))
    report.add(run, 0, rule, MIGRATED, f"run dir generation {gen}: {len(episodes)} episode(s) → traces.jsonl + config.yaml")
    for status, msg in notes:
        report.add(run, 0, rule, status, msg)
    return report
