"""verifiers 0.4.0's `vf-eval` spellings, accepted by `vf-eval` and `vf-rollout`.

One table maps verifiers' config keys onto ours (`KEYS`); it is applied to dotted flags
(`--client.base-url URL`) and to `@ FILE.toml` config files alike. Run identity flags decide the
run dir: `--run.name NAME` puts the run in `DIR/NAME` where DIR is `-o`/`--output-dir` (default
`outputs`), as in verifiers; `--run.dir` names it outright. Flags about verifiers' platform and
dashboard (`--push`, `--rich`, ...) do nothing here and say so on stderr.

`resolved_eval_json` writes `configs/resolved/eval.json`, our resolved config in verifiers'
shape, into every vf-eval / vf-rollout run dir, for tools that read verifiers run dirs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vf.atomic import write_atomic
from vf.config import MAX_CONFIG_BYTES, flatten, parse_dotted_args, set_dotted
from vf.errors import UsageError

KEYS: dict[str, str | None] = {
    # verifiers key (prefix)  -> our key (prefix); None = accepted, does nothing here
    "client.base_url": "engine.base_url",
    "client.api_key_var": "engine.api_key_var",
    "client": None,  # headers, timeouts, client type: verifiers' provider client, not ours
    "env.taskset": "taskset",
    "num_rollouts": "num_rollouts",
    "max_concurrent": "max_concurrent",
    "model": "model",
    "sampling": "sampling",
    "select": "select",
    "env": "env",  # the rest of env.* (agent, harness, runtime, ...): the episode runner's config
    "push": None,
    "rich": None,
    "verbose": None,
    "dry_run": None,
    "clean": None,
}
RUN_KEYS = ("run", "output_dir")
"""Keys that choose the run dir rather than configure the run (see `run_dir`)."""

NO_OP_FLAGS = ("--push", "--no-push", "--rich", "--no-rich")


def translate_key(key: str) -> str | None:
    """A verifiers config key (dots, `-` or `_`) → ours, or None for a no-op key. Our own keys
    pass through unchanged."""
    key = key.replace("-", "_")
    for theirs in sorted(KEYS, key=len, reverse=True):  # longest prefix wins: env.taskset before env
        if key == theirs or key.startswith(theirs + "."):
            ours = KEYS[theirs]
            return None if ours is None else ours + key[len(theirs):]
    return key


def translate_tree(tree: dict[str, Any], notes: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A verifiers config (nested, as in eval.toml) → (our override tree, run identity keys)."""
    out: dict[str, Any] = {}
    run: dict[str, Any] = {}
    for dotted, value in flatten(tree).items():
        key = dotted.replace("-", "_")  # verifiers' TOML spells keys with dashes too
        if key.split(".", 1)[0] in RUN_KEYS:
            run[key] = value
            continue
        if value is None:  # verifiers writes unset keys as null: leave ours at their defaults
            continue
        ours = translate_key(key)
        if ours is None:
            if value not in (False, "", [], {}):  # an unset verifiers default needs no note
                notes.append(f"{key} = {value!r}: verifiers-only setting, ignored by vf")
        else:
            set_dotted(out, ours, value)
    return out, run


def load_toml(path: str) -> dict[str, Any]:
    """An `@` file: TOML (verifiers' eval.toml), or JSON (a run dir's configs/resolved/eval.json)."""
    import tomllib

    from vf.bounded import BoundsError, check_tree, load_json

    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
        if len(raw) > MAX_CONFIG_BYTES:
            raise UsageError(f"config file {path} is over {MAX_CONFIG_BYTES >> 20} MiB; configs are a few KB")
        if path.endswith(".json"):
            return load_json(raw)
        try:
            data = tomllib.loads(raw.decode("utf-8"))
        except RecursionError:
            raise BoundsError("nested too deeply") from None
        check_tree(data)
        return data
    except FileNotFoundError:
        raise UsageError(f"config file {path} does not exist", hint="pass an existing file after @") from None
    except BoundsError as e:
        raise UsageError(f"{path} is refused: {e}", hint="pass a TOML or JSON config after @") from None
    except UnicodeDecodeError as e:
        raise UsageError(f"{path} is not UTF-8 text: {e}", hint="pass a TOML or JSON config after @") from None
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"{path} is not valid TOML: {e}", hint="fix the file (verifiers' eval.toml format)") from None


def run_dir(run_keys: dict[str, Any], output: str | None, output_dir: str | None) -> str | None:
    """The run dir that verifiers' run identity flags ask for, or None to keep ours (-o or auto).

    `--run.dir D` names the dir (relative to the output dir); `--run.name N` puts it in
    `OUTPUT_DIR/N`, where OUTPUT_DIR is -o/--output-dir (default `outputs`)."""
    name = run_keys.get("run.dir") or run_keys.get("run.name")
    parent = output_dir or run_keys.get("output_dir")
    if name is None:
        return output
    return str(Path(output or parent or "outputs") / str(name))


def resolved_eval_json(config: dict[str, Any], run_path: Path) -> dict[str, Any]:
    """Our resolved config in the shape of verifiers' `configs/resolved/eval.json` (the keys its
    tools read: env.taskset, model, client, sampling, select, num_rollouts, run, output_dir)."""
    engine = config.get("engine") or {}
    env = dict(config.get("env") or {})
    env["taskset"] = dict(config.get("taskset") or {})
    return {
        "env": env,
        "run": {"name": run_path.name, "dir": run_path.name, "attach": None},
        "model": config.get("model"),
        "client": {"base_url": engine.get("base_url"), "api_key_var": engine.get("api_key_var"),
                   "type": "train" if config.get("command") == "rollout" else "eval"},
        "sampling": config.get("sampling") or {},
        "select": config.get("select") or {},
        "num_rollouts": config.get("num_rollouts"),
        "max_concurrent": config.get("max_concurrent"),
        "output_dir": str(run_path.parent),
        "push": False,
        "rich": False,
        "verbose": False,
    }


def write_resolved_eval_json(config: dict[str, Any], run_path: Path) -> Path:
    out = Path(run_path) / "configs" / "resolved" / "eval.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, json.dumps(resolved_eval_json(config, Path(run_path)), indent=2) + "\n")
    return out


def layers_from(dotted: list[str], at_files: list[str]) -> tuple[tuple[dict[str, Any], ...], dict[str, Any],
                                                                 dict[str, Any], list[str]]:
    """This invocation's `@ FILE.toml` files and dotted flags in our keys:
    (file layers, lowest first; dotted-flag tree; run identity keys; notes for stderr)."""

    notes: list[str] = []
    files, run = [], {}
    for path in at_files:
        tree, run_keys = translate_tree(load_toml(path), notes)
        files.append(tree)
        run.update(run_keys)
    flags, run_keys = translate_tree(parse_dotted_args(list(dotted)), notes)
    run.update(run_keys)
    return tuple(files), flags, run, notes
