"""The v0 reference: each corpus environment's own reward functions, run by a verifiers release itself.

Run with the python of a venv that has `verifiers` (0.1.2 … 0.3.x, with math-verify) installed — never
vf's: `VF_V0_PYTHON=/path/to/v0/bin/python tests/...` (see tests/test_migrate_corpus.py). Prints
JSON: {env: [{"row": i, "names": [...], "scores": [...], "weights": [...], "reward": Σ w·s}, ...]} for the
cases of cases.json, on the local data files of data/ (standing in for the hub).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import importlib.util
import inspect
import json
import os
import random
import sys
from pathlib import Path
from types import SimpleNamespace

import datasets

HERE = Path(__file__).parent
DATA = [HERE / "data"]  # data_repeat: a temporary copy whose rows are repeated
_hub_load = datasets.load_dataset


def _local(path, name=None, *args, split=None, **kwargs):
    """The same lookup as vf.migrate.compat.load_dataset with VF_DATA_DIR=data/."""
    stem = path.replace("/", "__")
    names = [f"{stem}.{name}.{split}", f"{stem}.{name}"] if name else []
    names += [f"{stem}.{split}", stem] if split else [stem]
    for n in names:
        f = DATA[0] / f"{n}.jsonl"
        if f.is_file():
            ds = datasets.Dataset.from_json(str(f))
            return ds if split else datasets.DatasetDict({s: ds for s in ("train", "test", "validation", "dev")})
    return _hub_load(path, name, *args, split=split, **kwargs)


datasets.load_dataset = _local
import verifiers
import verifiers.utils.data_utils as _data_utils

try:  # the installed release (0.1.1's __version__ still says "0.1.0")
    RELEASE = importlib.metadata.version("verifiers")
except importlib.metadata.PackageNotFoundError:
    RELEASE = getattr(verifiers, "__version__", "?")

_data_utils.load_dataset = _local


def _objects(messages):
    """Tool calls as the openai client returned them to v0 (attribute access)."""
    out = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            m["tool_calls"] = [SimpleNamespace(id=c["id"], type=c["type"], function=SimpleNamespace(**c["function"]))
                               for c in m["tool_calls"]]
        out.append(m)
    return out


def _members(rubric):
    return [r for sub in rubric.rubrics for r in _members(sub)] if hasattr(rubric, "rubrics") else [rubric]


def repeated_data(times: int) -> Path:
    """data/ with every file's rows repeated `times` times (load_environment()s that select(range(1000)))."""
    import tempfile

    out = Path(tempfile.mkdtemp(prefix="v0data"))
    for f in (HERE / "data").glob("*.jsonl"):
        (out / f.name).write_text(f.read_text() * times)
    return out


def stub_textarena() -> None:
    """TextArenaEnv needs the textarena package and nltk data from the network: a stand-in that
    keeps what the rewards use (the v0 rubric and parser it is given) and one row per case."""
    import types

    def TextArenaEnv(parser=None, rubric=None, system_prompt=None, **kwargs):
        row = {"prompt": [{"role": "system", "content": system_prompt}, {"role": "user", "content": "Wordle"}],
               "answer": ""}
        return types.SimpleNamespace(rubric=rubric, parser=parser, eval_dataset=None, get_dataset=lambda: [row])

    for name in ("verifiers.envs.textarena_env", "verifiers.envs.integrations.textarena_env"):
        sys.modules[name] = types.SimpleNamespace(TextArenaEnv=TextArenaEnv)


async def _score(env, row, completion):
    state = {"prompt": row["prompt"], "completion": completion, "answer": row.get("answer", ""),
             "info": row.get("info") or {}, "task": row.get("task", "default"), "example_id": 0,
             "turn": sum(m["role"] == "assistant" for m in completion),
             "responses": [m for m in completion if m["role"] == "assistant"]}
    names, scores, weights = [], [], []
    for rubric in _members(env.rubric):
        if hasattr(rubric, "funcs"):  # 0.1.14
            pairs = zip(rubric.funcs, rubric.weights)
        else:  # 0.1.3
            pairs = zip(rubric.reward_funcs, rubric.reward_weights)
        for fn, w in pairs:
            names.append(getattr(fn, "__name__", repr(fn)))
            if hasattr(rubric, "_call_individual_reward_func"):
                score = rubric._call_individual_reward_func
                if "score_sem" in inspect.signature(score).parameters:  # 0.1.8-0.1.9
                    scores.append(await score(fn, state, asyncio.Semaphore(1)))
                else:
                    scores.append(await score(fn, state))
            elif hasattr(rubric, "_call_reward_func"):  # 0.1.0-0.1.1: sync, run in a thread by score_rollout
                scores.append(rubric._call_reward_func(fn, state["prompt"], completion, state["answer"], state,
                                                       task=state["task"], info=state["info"]))
            elif "parser" in inspect.signature(rubric.call_reward_func).parameters:  # 0.1.2
                scores.append(await rubric.call_reward_func(fn, rubric.parser, state["prompt"], completion,
                                                            state["answer"], state, task=state["task"],
                                                            info=state["info"]))
            else:
                scores.append(await rubric.call_reward_func(fn, state["prompt"], completion, state["answer"], state,
                                                            task=state["task"], info=state["info"]))
            weights.append(w)
    return names, scores, weights


def main() -> None:
    cases = json.loads((HERE / "cases.json").read_text())
    out = {}
    only = set(sys.argv[1:])  # optional: just these envs
    names = [n for n, spec in cases.items() if "cases" in spec and (not only or n in only)]
    if len(names) > 1:  # one process per env: 0.1.2's Rubric(funcs=[]) default list is shared by every
        # rubric built without funcs=, so a second env would inherit the first one's reward functions
        import subprocess

        for name in names:
            r = subprocess.run([sys.executable, __file__, name], capture_output=True, text=True, check=False)
            sys.stderr.write(r.stderr)
            if r.returncode != 0:  # this release cannot score it (a reward raised, an API it lacks): say so
                lines = r.stderr.strip().splitlines() or [f"exit {r.returncode}"]
                out[name] = {"error": lines[-1][:300]}
                continue
            out.update(json.loads(r.stdout))
        json.dump(out, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return
    for name, spec in cases.items():
        if "cases" not in spec or (only and name not in only):
            continue
        random.seed(spec.get("seed", 0))
        DATA[0] = repeated_data(spec["data_repeat"]) if "data_repeat" in spec else HERE / "data"
        if spec.get("v0_stub_env"):
            stub_textarena()
        kwargs = spec.get("kwargs", {})
        if spec.get("judge"):  # the scripted judge server the test runs (VF_JUDGE_BASE_URL)
            url = os.environ["VF_JUDGE_BASE_URL"]
            os.environ["OPENAI_BASE_URL"] = url
            kwargs = {k: url if v == "$JUDGE" else v for k, v in kwargs.items()}
        if spec.get("cwd"):  # an env that reads its data relative to the working directory (data/)
            os.chdir(HERE)
        modspec = importlib.util.spec_from_file_location(f"v0_{name}", HERE / "envs" / f"{name}.py")
        mod = importlib.util.module_from_spec(modspec)
        try:
            with contextlib.redirect_stdout(sys.stderr):  # an env's own print()s are not the JSON
                modspec.loader.exec_module(mod)
                env = mod.load_environment(**kwargs)
        except (ImportError, AttributeError, TypeError) as e:  # written for another v0 release than this one
            out[name] = {"unavailable": f"{type(e).__name__}: {e}"}
            continue
        ds = env.get_eval_dataset() if env.eval_dataset is not None or hasattr(env, "build_eval_dataset") \
            else env.get_dataset()
        group = getattr(env, "env_map", None)  # EnvGroup: a row is scored by its member's rubric
        results = []
        loop = asyncio.new_event_loop()  # one loop per env: a judge's async client outlives a case
        for case in spec["cases"]:
            row = dict(ds[case["row"]])
            if "answer" in case:
                row["answer"] = case["answer"]
            completion = case.get("completion")
            if completion is None:  # the ideal replies, from the row's own info
                completion = [{"role": "assistant", "content": a} for a in row["info"][case["replies_from_info"]]]
                completion = [m for a in completion for m in (a, {"role": "user", "content": "next"})][:-1]
            # 0.1.14 routes by info["env_id"], earlier releases by the "task" column
            owner = group[(row.get("info") or {}).get("env_id") or row.get("task")] if group else env
            with contextlib.redirect_stdout(sys.stderr):  # an env's own print()s are not the JSON
                names, scores, weights = loop.run_until_complete(_score(owner, row, _objects(completion)))
            results.append({"verifiers": RELEASE, "row": case["row"], "names": names, "scores": scores, "weights": weights,
                            "reward": sum(s * w for s, w in zip(scores, weights))})
        loop.close()
        out[name] = results
    json.dump(out, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
