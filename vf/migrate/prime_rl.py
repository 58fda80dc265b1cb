"""Trainer configs → a `vf-train` YAML with the same meaning (rule CFG004): the in-tree v0 trainer's
TOML (`model`, `[env]`, `[trainer.args]`) and prime-rl's `rl.toml` (`[model]`, `[orchestrator]`,
`[[orchestrator.train.env]]`, `[orchestrator.eval]`, `[trainer.model]`, `[trainer.optim]`,
`[trainer.loss]`, `max_steps`, `seq_len`, `max_async_level`, ...).

Every key of the TOML ends up in one of three places, never nowhere (`_Keys` tracks them):

- mapped onto the vf-train key with its meaning (`trainer.model.cp` → `parallel.cp`,
  `max_async_level` → `async.max_off_policy_steps`, `[[orchestrator.train.env]]` → `tasksets`, ...);
- listed as `manual` when vf-train has no key that keeps its meaning (`trainer.model.tp`, a cosine
  schedule, a DPPO loss), or `info` when it only says where or how the run is deployed (`wandb`,
  `deployment`, `inference`, `log`, ...; vf-train takes those as run flags, if at all);
- refused: a config vf-train would run with another meaning is not converted (`[trainer.model.lora]`
  while vf-train has no LoRA: it would fine-tune every weight); the TOML stays, the report says why.

Which vf-train keys exist is read from vf-train's own config (`TrainConfig`), so a LoRA section or a
taskset mixture is used once vf-train has it.
"""

from __future__ import annotations

from typing import Any

from vf.migrate.configs import _sampling, _strip_v1
from vf.migrate.report import INFO, MANUAL, MIGRATED
from vf.trainer.defaults import IPO_EPS, ipo_loss

OPERATIONAL = ("wandb", "deployment", "inference", "slurm", "log", "weight_broadcast", "output_dir", "clean", "bench",
               "env_vars", "monitor", "ckpt", "trainer.ckpt", "orchestrator.ckpt", "trainer.log", "orchestrator.log",
               "trainer.weights", "orchestrator.client", "orchestrator.renderer", "trainer.model.attn",
               "trainer.model.ac_offloading", "trainer.model.reshard_after_forward", "trainer.model.tp",
               "trainer.model.dp_replicate", "trainer.model.liger_kernel", "trainer.model.optimization_dtype",
               "trainer.model.reduce_dtype", "trainer.model.load_using_meta", "trainer.model.trust_remote_code",
               "trainer.model.log_signature", "trainer.memory_profiler_path", "trainer.trace_path",
               "trainer.dist_timeout_seconds", "trainer.heartbeat", "trainer.metrics_server", "orchestrator.heartbeat",
               "orchestrator.metrics_server", "max_model_len", "trainer.model.fsdp_cpu_offload", "orchestrator.seed",
               "orchestrator.oversampling_factor", "orchestrator.max_concurrent", "orchestrator.output_dir")
"""Keys that say where or how a run is deployed and logged, not what it trains: listed as info."""

LORA_TARGETS = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj", "o_proj": "o_proj",
                "gate_proj": "gate_up_proj", "up_proj": "gate_up_proj", "down_proj": "down_proj"}
"""Hugging Face projection names → vf's native (fused) module names."""


class Refused(Exception):
    """The config would run with another meaning on vf-train: not converted."""


class _Keys:
    """The TOML's keys, and which of them a mapping has used (a used key covers its subtree)."""

    def __init__(self, data: dict[str, Any]):
        self.data, self.used = data, set()

    def get(self, path: str, default: Any = None) -> Any:
        node: Any = self.data
        for part in path.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        self.used.add(path)
        return node

    def has(self, path: str) -> bool:
        return self.peek(path) is not None

    def peek(self, path: str) -> Any:
        node: Any = self.data
        for part in path.split("."):
            if not isinstance(node, dict) or part not in node:
                return None
            node = node[part]
        return node

    def left(self) -> list[tuple[str, Any]]:
        """(dotted key, value) of every leaf no mapping used."""
        out: list[tuple[str, Any]] = []

        def walk(node: Any, prefix: str) -> None:
            if prefix and any(prefix == u or prefix.startswith(u + ".") for u in self.used):
                return
            if isinstance(node, dict):  # an empty table (`[trainer]`) says nothing
                for k, v in node.items():
                    walk(v, f"{prefix}.{k}" if prefix else k)
            elif isinstance(node, list) and node and all(isinstance(e, dict) for e in node):
                for i, e in enumerate(node):
                    walk(e, f"{prefix}.{i}")
            else:
                out.append((prefix, node))

        walk(self.data, "")
        return out


def _vf_train_has(field: str) -> bool:
    from vf.trainer.config import TrainConfig

    return field in TrainConfig.model_fields


def trainer_config(data: dict[str, Any], notes: list) -> dict[str, Any]:
    """A v0 trainer TOML or a prime-rl rl.toml → a `vf-train --config` YAML with the same meaning.
    `notes` gets (status, message) per decision; raises Refused when it cannot keep the meaning."""
    keys, out = _Keys(data), {}
    _model(keys, out, notes)
    _tasksets(keys, out, notes)
    _loss_and_optim(keys, out, notes)
    _orchestrator(keys, out, notes)
    _parallel_and_memory(keys, out, notes)
    _lora(keys, out, notes)
    _eval(keys, out, notes)
    _run(keys, out, notes)
    _left(keys, notes)
    return out


# ---- model, tasksets ---------------------------------------------------------------------------


def _model(keys: _Keys, out: dict, notes: list) -> None:
    model = keys.get("model")
    if isinstance(model, dict):
        keys.used.discard("model")
        model = keys.get("model.name") or keys.get("model.path")
    model = model or keys.get("trainer.model.name")
    if model:
        out["model"] = {"path": model}
    impl = keys.get("trainer.model.impl")
    if impl is not None:
        mapped = {"auto": "auto", "hf": "hf", "custom": "auto", "liger_kernel": "auto"}.get(impl)
        if mapped is None:
            notes.append((MANUAL, f"trainer.model.impl = {impl!r} has no vf equivalent (dropped; vf's is auto)"))
        else:
            out.setdefault("model", {})["impl"] = mapped
            notes.append((MIGRATED if mapped == impl else INFO, f"trainer.model.impl {impl!r} → model.impl {mapped!r}"
                          + ("" if mapped == impl else " (vf runs its own implementation of the model when it has one)")))
    compile_ = keys.get("trainer.model.compile")
    if compile_ is not None and compile_ is not False:  # a table (even empty) or true turns it on
        out.setdefault("model", {})["compile"] = True
        notes.append((MIGRATED, "trainer.model.compile → model.compile true"))


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


def _runner(env: dict) -> dict[str, Any]:
    """A prime-rl env's harness/runtime (`harness = {id, runtime}`, `env.agent.harness`) → vf's
    `env.agent.*` (`--env.agent.harness.id`, `--env.agent.runtime.type`)."""
    inner = env.get("env") if isinstance(env.get("env"), dict) else {}
    agent = dict(inner.get("agent") or {})
    harness = dict(env.get("harness") or agent.pop("harness", None) or {})
    runtime = harness.pop("runtime", None) or agent.pop("runtime", None)
    out: dict[str, Any] = {}
    if harness:
        out["harness"] = harness
    if runtime:
        out["runtime"] = runtime
    out.update(agent)
    return {"agent": out} if out else {}


def _tasksets(keys: _Keys, out: dict, notes: list) -> None:
    for path in ("orchestrator.train.env", "orchestrator.env", "env"):
        if keys.has(path):
            envs = _env_list(keys.get(path))
            break
    else:
        return
    if not envs:
        return
    entries = [_env_entry(e) for e in envs]
    runners = [_runner(e) for e in envs]
    if runners[0]:
        out["env"] = runners[0]
    if any(r != runners[0] for r in runners[1:]):
        notes.append((MANUAL, "the training envs run under different harnesses/runtimes; vf-train runs every taskset "
                      f"under one (kept the first: {runners[0]})"))
    extra = [(i, k, v) for i, e in enumerate(envs) for k, v in e.items()
             if k not in ("name", "id", "args", "taskset", "env", "harness", "group_size", "weight", "ratio")]
    for i, k, v in extra:
        notes.append((MANUAL, f"{path}.{i}.{k} = {v!r} has no vf-train key (dropped)"))
    if len(envs) == 1:
        out["taskset"] = entries[0]
        if envs[0].get("group_size"):
            out.setdefault("orchestrator", {})["group_size"] = envs[0]["group_size"]
        return
    names = ", ".join(str(e["id"]) for e in entries)
    if not _vf_train_has("tasksets"):
        out["taskset"] = entries[0]
        notes.append((MANUAL, f"{len(envs)} training envs ({names}); this vf-train trains on one taskset: kept "
                      f"{entries[0]['id']!r}, run one vf-train per env for the others"))
        return
    mixture = []
    for env, entry in zip(envs, entries):
        item = {"id": entry["id"], **{k: v for k, v in entry.items() if k != "id"}}
        if env.get("name") and env["name"] != entry["id"]:
            item["name"] = env["name"]
        weight = env.get("weight", env.get("ratio"))
        if weight is not None:
            item["weight"] = weight
        if env.get("group_size"):
            item["group_size"] = env["group_size"]
        mixture.append(item)
    out["tasksets"] = mixture
    same = all(e.get("weight", e.get("ratio")) is None for e in envs)
    notes.append((MIGRATED if not same else INFO, f"{len(envs)} training envs → a vf-train mixture (tasksets: {names})"
                  + ("; none sets a weight: vf gives each an equal share of every batch, check that is what "
                     "prime-rl's buffer did" if same else "")))


# ---- loss, optimizer -----------------------------------------------------------------------------


def _loss_and_optim(keys: _Keys, out: dict, notes: list) -> None:
    args = keys.get("trainer.args") or {}
    loss = keys.get("trainer.loss")
    loss = loss if isinstance(loss, dict) else {}
    if args.get("loss_type"):
        out["loss"] = ipo_loss()
        notes.append((MANUAL, f"loss made explicit: ipo (eps {IPO_EPS:g}), vf's default; the old trainer used {args['loss_type']}: "
                      "check this is the loss you want"))
    elif keys.has("trainer.args") and not loss:
        out["loss"] = ipo_loss()
        notes.append((MANUAL, f"loss made explicit: ipo (eps {IPO_EPS:g}), vf's default; the old trainer used its own default "
                      "(GRPO-style clipping): check this is the loss you want"))
    else:
        out["loss"] = _loss(loss, notes)
    optim: dict[str, Any] = {}
    lr = args.get("learning_rate", keys.get("trainer.optim.lr", keys.get("optim.lr")))
    if lr is not None:
        optim["lr"] = lr
    kind = keys.get("trainer.optim.type")
    if kind is not None and str(kind).lower() != "adamw":
        notes.append((MANUAL, f"trainer.optim.type = {kind!r}: vf-train's optimizer is AdamW (kept AdamW)"))
    for src, dst in (("trainer.optim.weight_decay", "weight_decay"), ("trainer.optim.max_norm", "grad_clip"),
                     ("trainer.loss.max_norm", "grad_clip")):
        if keys.peek(src) is not None:
            optim[dst] = keys.get(src)
    b1, b2 = keys.get("trainer.optim.betas1"), keys.get("trainer.optim.betas2")
    if b1 is not None or b2 is not None:
        optim["betas"] = [b1 if b1 is not None else 0.9, b2 if b2 is not None else 0.99]
    scheduler = keys.get("trainer.scheduler") or keys.get("trainer.optim.scheduler")
    if isinstance(scheduler, dict):
        kind = scheduler.get("type", "constant")
        if scheduler.get("warmup_steps"):
            optim["warmup_steps"] = scheduler["warmup_steps"]
        if kind in ("constant", "linear") and not scheduler.get("decay_steps"):
            optim["scheduler"] = kind
        else:
            notes.append((MANUAL, f"LR scheduler {kind}" + (f" with decay_steps {scheduler['decay_steps']}"
                                                            if scheduler.get("decay_steps") else "")
                          + " has no vf equivalent: vf decays linearly to 0 at `steps` (optim.scheduler linear) or "
                          "keeps the LR constant; kept constant"))
    if optim:
        out["optim"] = optim


def _loss(loss: dict, notes: list) -> dict:
    """prime-rl `[trainer.loss]` → vf's {name, params}, keeping the meaning where vf has it."""
    kind = loss.get("type")
    extra = {k: v for k, v in loss.items() if k not in ("type", "max_norm")}
    if not loss:
        notes.append((MANUAL, "no [trainer.loss]: the run relied on prime-rl's default loss (which changed over "
                      "releases: DPPO+KL, then IPO eps 0.1, then IPO eps 0.3); migrated to vf's default, IPO with "
                      f"eps {IPO_EPS:g} (kl off): check this is the loss you want"))
        return ipo_loss()
    if kind == "icepop" or "icepop_ratio_low" in loss or "ratio_low" in loss:
        low = loss.get("ratio_low", loss.get("icepop_ratio_low", 0.2))
        high = loss.get("ratio_high", loss.get("icepop_ratio_high", 5.0))
        notes.append((MIGRATED, f"[trainer.loss] icepop → loss icepop (low {low}, high {high}: same ratio band)"))
        _unused(extra, {"ratio_low", "ratio_high", "icepop_ratio_low", "icepop_ratio_high"}, notes)
        return {"name": "icepop", "params": {"low": low, "high": high}}
    if kind == "custom":
        notes.append((MANUAL, f"[trainer.loss] custom ({loss.get('import_path') or loss.get('path') or '?'}) has no vf "
                      f"equivalent: port it to a trainer/losses module; migrated to IPO eps {IPO_EPS:g} meanwhile"))
        return ipo_loss()
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


# ---- orchestrator, async, parallelism ------------------------------------------------------------


def _orchestrator(keys: _Keys, out: dict, notes: list) -> None:
    args = keys.peek("trainer.args") or {}
    orch = out.setdefault("orchestrator", {})
    batch = args.get("per_device_train_batch_size", keys.get("orchestrator.batch_size"))
    if batch is not None:
        orch["batch_size"] = batch
    group = args.get("num_generations", keys.get("orchestrator.group_size", keys.get("orchestrator.rollouts_per_example")))
    if group is not None:
        orch["group_size"] = group
    if not orch:
        out.pop("orchestrator")
    sampling = keys.get("orchestrator.train.sampling") or keys.get("orchestrator.sampling") or {}
    if sampling:
        out["sampling"] = _sampling(sampling, notes)
    seq_len = keys.get("trainer.model.seq_len", keys.get("seq_len", keys.get("orchestrator.seq_len")))
    for other in ("seq_len", "orchestrator.seq_len"):
        keys.get(other)  # one sequence length in vf: the trainer's (it bounds the orchestrator's rows too)
    max_tokens = (out.get("sampling") or {}).get("max_tokens")
    if seq_len is not None and max_tokens is not None and seq_len <= max_tokens:
        notes.append((MANUAL, f"seq_len {seq_len} leaves no room for the prompt next to max_completion_tokens "
                      f"{max_tokens} (prime-rl truncated such samples; vf-train refuses): trainer.seq_len set to "
                      f"{max_tokens + 2048}, lower sampling.max_tokens instead if memory is tight"))
        seq_len = max_tokens + 2048
    if seq_len is not None:
        out.setdefault("trainer", {})["seq_len"] = seq_len
    # staleness: prime-rl's max_async_level (how many steps inference may run ahead of training) bounds
    # how old a rollout's policy may be: vf's async.max_off_policy_steps
    level_key = next((k for k in ("max_async_level", "orchestrator.max_async_level", "trainer.max_async_level")
                      if keys.peek(k) is not None), None)
    off_policy = keys.get("orchestrator.max_off_policy_steps")
    if level_key is not None:
        level = keys.get(level_key)
        for k in ("max_async_level", "orchestrator.max_async_level", "trainer.max_async_level"):
            keys.get(k)
        out["async"] = {"max_off_policy_steps": level}
        notes.append((MIGRATED, f"{level_key} {level} → async.max_off_policy_steps {level} (a rollout from a policy more "
                      f"than {level} steps behind is not trained on)"))
        if off_policy is not None and off_policy != level:
            notes.append((INFO, f"orchestrator.max_off_policy_steps {off_policy} (policies one rollout may span) has "
                          f"no separate vf key: vf bounds a rollout's age by async.max_off_policy_steps = {level}"))
    elif off_policy is not None:
        out["async"] = {"max_off_policy_steps": off_policy}


def _parallel_and_memory(keys: _Keys, out: dict, notes: list) -> None:
    parallel = {}
    for name in ("cp", "ep"):
        for path in (f"trainer.model.{name}", f"trainer.parallel.{name}", f"trainer.{name}"):
            value = keys.peek(path)
            if value is not None:
                keys.get(path)
                if value != 1:
                    parallel[name] = value
                notes.append((MIGRATED, f"{path} {value} → parallel.{name} {value} (`--parallel.{name}`: torchrun "
                              "processes split the " + ("sequence" if name == "cp" else "experts") + ")"))
                break
    if parallel:
        out["parallel"] = parallel
    ac = keys.get("trainer.model.ac")
    if ac is not None and ac is not False:
        out.setdefault("trainer", {})["activation_checkpointing"] = True
        freq = ac.get("freq", 1) if isinstance(ac, dict) else 1
        notes.append((MIGRATED if freq == 1 else INFO, "trainer.model.ac → trainer.activation_checkpointing true"
                      + ("" if freq == 1 else f" (every layer; prime-rl checkpointed every {freq}th)")))


def _lora(keys: _Keys, out: dict, notes: list) -> None:
    path = next((p for p in ("trainer.model.lora", "trainer.lora", "trainer.model.experimental.lora") if keys.has(p)), None)
    if path is None:
        return
    lora = keys.get(path)
    lora = lora if isinstance(lora, dict) else {}
    if not _vf_train_has("lora"):
        raise Refused(f"[{path}] trains LoRA adapters (rank {lora.get('rank', '?')}); vf-train has no LoRA yet, so "
                      "this config would fine-tune every weight of the model instead (another run, and far more "
                      "memory): not converted; keep training it with prime-rl, or delete the section to accept full "
                      "fine-tuning and run vf-migrate again")
    section: dict[str, Any] = {}
    for k in ("rank", "alpha", "dropout"):
        if k in lora:
            section[k] = lora[k]
    targets = lora.get("target_modules")
    if targets:
        mapped = sorted({LORA_TARGETS.get(t, t) for t in targets})
        fused = {"qkv_proj": {"q_proj", "k_proj", "v_proj"}, "gate_up_proj": {"gate_proj", "up_proj"}}
        partial = [m for m, parts in fused.items() if m in mapped and not parts <= set(targets)]
        section["target_modules"] = mapped
        if partial:
            notes.append((MANUAL, f"lora target_modules {targets}: vf's {', '.join(partial)} is one fused layer, so its "
                          "adapter covers the projections not listed too"))
    else:
        notes.append((INFO, "lora target_modules not set: vf adapts every linear layer of the decoder (all-linear)"))
    for k in sorted(set(lora) - {"rank", "alpha", "dropout", "target_modules"}):
        notes.append((MANUAL, f"{path}.{k} = {lora[k]!r} has no vf-train key (dropped)"))
    out["lora"] = section
    notes.append((MIGRATED, f"[{path}] → lora ({', '.join(f'{k} {v}' for k, v in section.items())})"))


# ---- evaluation, run length, checkpoints, what is left -------------------------------------------


def _eval(keys: _Keys, out: dict, notes: list) -> None:
    ev = keys.get("orchestrator.eval") or {}
    envs = _env_list(ev.get("env"))
    if not envs:
        return
    out["eval"] = {"taskset": _env_entry(envs[0]), **({"every": ev["interval"]} if "interval" in ev else {})}
    if envs[0].get("group_size"):
        out["eval"]["num_rollouts"] = envs[0]["group_size"]
    if ev.get("sampling"):
        out["eval"]["sampling"] = _sampling(ev["sampling"], notes)
    if len(envs) > 1:
        notes.append((MANUAL, f"{len(envs)} eval envs; vf-train evaluates one: kept "
                      f"{out['eval']['taskset']['id']!r}; run vf-eval for the others "
                      f"({', '.join(str(_env_entry(e)['id']) for e in envs[1:])})"))
    for k in sorted(set(ev) - {"env", "interval", "sampling"}):
        notes.append((MANUAL, f"orchestrator.eval.{k} = {ev[k]!r} has no vf-train key (dropped)"))


def _run(keys: _Keys, out: dict, notes: list) -> None:
    args = keys.peek("trainer.args") or {}
    steps = args.get("max_steps", keys.get("max_steps", keys.get("trainer.max_steps")))
    keys.get("orchestrator.max_steps")
    if steps is not None:
        out["steps"] = steps
    if keys.peek("ckpt.interval") is not None:
        out["ckpt"] = {"every": keys.get("ckpt.interval")}
    known = {"learning_rate", "per_device_train_batch_size", "num_generations", "max_steps", "loss_type"}
    for k in sorted(set(args) - known):
        notes.append((MANUAL, f"trainer.args.{k} has no vf-train key (dropped)"))
    wandb = keys.peek("wandb")
    if isinstance(wandb, dict) and _vf_train_has("wandb"):
        section = {k: keys.get(f"wandb.{k}") for k in ("project", "name", "entity") if k in wandb}
        if section:
            out["wandb"] = section
            notes.append((MIGRATED, f"[wandb] → wandb ({', '.join(section)})"))


def _left(keys: _Keys, notes: list) -> None:
    """Every key no mapping used, listed: info when it only says how the run is deployed, else manual."""
    operational, meaningful = [], []
    for key, value in keys.left():
        if any(key == p or key.startswith(p + ".") for p in OPERATIONAL):
            operational.append(key)
        else:
            meaningful.append((key, value))
    for key, value in meaningful:
        notes.append((MANUAL, f"{key} = {value!r} has no vf-train key (dropped): check the run does not depend on it"))
    if operational:
        notes.append((INFO, "not used by vf-train (dropped; deployment/logging/inference settings are run flags "
                      f"or have no equivalent): {', '.join(operational)}"))
