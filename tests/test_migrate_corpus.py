"""vf-migrate on real v0 environments: verifiers' own `environments/` from its public history.

tests/migrate_corpus/v0/ holds the corpus (31 envs/ from verifiers' public history, MIT, LICENSE beside
it), local stand-ins for the hub datasets they load (data/, read through `VF_DATA_DIR`), fixed
completions (cases.json) and the rewards the verifiers release each was written for gave them
(golden_v0_rewards.json: 0.1.2, 0.1.5, 0.1.7, 0.1.14, 0.2.1 or 0.3.1, written by v0_reference.py in a venv of
that release; SOURCES.md lists which). Asserted here:

- the whole corpus migrates: no `verifiers` import left, everything compiles, and `--check` on the
  result finds nothing more (EnvGroup and TextArenaEnv through compat.V0Taskset);
- every migrated env loads (`vf.load_taskset`, as vf-validate does) on the local data;
- the same rows and completions give the v0 rewards (reward total and each v0 function's score);
- migrated envs run end to end under `vf-eval` on the embedded `tiny` model (a few by default, every
  one with `-m migrate_all`; judges against the scripted judge server);
- judge envs: v0's JudgeRubric and the migrated vf.Judge against the same scripted server give the
  same rewards (v0_reference.py with VF_JUDGE_BASE_URL).

release_matrix.json holds the same cases scored by every release from 0.1.0 to 0.3.x (or why a release
cannot load an env); `-m v0ref` with `VF_V0_PYTHON` set recomputes one release's column live.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from openai_stub import Handler

from vf.migrate import apply, plan
from vf.trace import MessageNode, Trace

V0 = Path(__file__).parent / "migrate_corpus" / "v0"
CASES = json.loads((V0 / "cases.json").read_text())
GOLDEN = json.loads((V0 / "golden_v0_rewards.json").read_text())
ENVS = sorted(p.stem for p in (V0 / "envs").glob("*.py"))
NO_REWARDS = {name for name, spec in CASES.items() if spec.get("e2e_no_rewards")}
NEEDS_MATH_VERIFY = {"vf_math500", "vf_aime2024", "vf_math_python"}  # their own rewards import math_verify
VERIFIERS_IMPORT = re.compile(r"^\s*(import verifiers|from verifiers)", re.MULTILINE)


@pytest.fixture(scope="module")
def migrated(tmp_path_factory):
    root = tmp_path_factory.mktemp("v0corpus")
    shutil.copytree(V0 / "envs", root / "envs")
    report = plan([root / "envs"])
    apply(report)
    return root / "envs", report


@pytest.fixture
def local_data(monkeypatch, request):
    monkeypatch.setenv("VF_DATA_DIR", str(V0 / "data"))
    monkeypatch.setenv("OPENAI_API_KEY", "unused")  # judge envs build their (v0) client at load, as v0 did
    name = getattr(request.node, "callspec", None) and request.node.callspec.params.get("name")
    if name and CASES.get(name, {}).get("cwd"):  # an env that reads data/ relative to the working directory
        monkeypatch.chdir(V0)


def test_corpus_is_real_and_licensed():
    assert len(ENVS) >= 31
    assert "MIT License" in (V0 / "LICENSE").read_text()
    sources = (V0 / "SOURCES.md").read_text()
    for name in ENVS:
        assert f"envs/{name}.py" in sources, name


def test_whole_corpus_migrates_without_verifiers(migrated):
    root, report = migrated
    for name in ENVS:
        new = (root / f"{name}.py").read_text()
        compile(new, name, "exec")
        assert not VERIFIERS_IMPORT.search(new), name
        assert "TODO(vf-migrate)" not in new, name
    assert not [e for e in report.entries if e.status == "manual"]
    # self_reward's JudgeRubric has no reward functions: v0 (0.1.2+, the releases that load it) scored 0,
    # so the migrated task has none, said as a note, not left as a decision
    assert {Path(e.file).stem for e in report.entries if "no reward functions" in e.message} == NO_REWARDS
    # a second run finds nothing more to change and nothing left to do: `vf-migrate --check` exits 0
    again = plan([root])
    assert not again.changes and not [e for e in again.entries if e.status == "manual"]
    check = subprocess.run([sys.executable, "-m", "vf.commands.migrate", str(root), "--check"], capture_output=True,
                           text=True, timeout=300, check=False)
    assert check.returncode == 0 and "0 need a manual step" in check.stdout + check.stderr, check.stdout[-2000:]


def test_json_lists_every_decision(tmp_path):
    shutil.copytree(V0 / "envs", tmp_path / "envs")
    r = subprocess.run([sys.executable, "-m", "vf.commands.migrate", str(tmp_path / "envs"), "--json"],
                       capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    files = {Path(e["file"]).stem for e in out["entries"]}
    assert files == set(ENVS)
    for name in ENVS:  # every module says what happened to load_environment, or why it was kept
        assert any(Path(e["file"]).stem == name and e["rule"] in ("ENV001", "ENV013", "ENV900") for e in out["entries"]), name
    assert out["summary"]["files_changed"] == len(ENVS)


def _load(root: Path, name: str, fields: dict | None = None):
    import vf

    if "data_repeat" in CASES[name]:  # a load_environment() that selects more rows than data/ has
        os.environ["VF_DATA_DIR"] = str(_repeated_data(CASES[name]["data_repeat"]))
    random.seed(CASES[name].get("seed", 0))  # as v0_reference.py: row generation that draws random numbers
    return vf.load_taskset(str(root / f"{name}.py"), fields)


@pytest.mark.parametrize("name", ENVS)
def test_migrated_env_loads_on_local_data(migrated, local_data, name):
    if name in NEEDS_MATH_VERIFY:
        pytest.importorskip("math_verify")
    from vf.validate import validate_taskset

    fields = CASES[name].get("fields")  # a load_environment() with required arguments gets them
    loaded = _load(migrated[0], name, fields)
    rows = list(loaded.taskset.take(2))
    assert rows and all(t.messages() for t in rows)
    report = asyncio.run(validate_taskset(_load(migrated[0], name, fields), 2))  # what vf-validate runs
    if name in RAISES:  # its probe reply makes a v0 reward function raise: found before any run
        fn, words = RAISES[name]
        assert report.failures and all(fn in c.reason and words in c.reason for c in report.failures), report.failures
    else:
        assert not report.failures, report.failures


@functools.cache
def _repeated_data(times: int) -> Path:
    """data/ with every file's rows repeated (as v0_reference.py's `data_repeat`)."""
    out = Path(tempfile.mkdtemp(prefix="v0data"))
    for f in (V0 / "data").glob("*.jsonl"):
        (out / f.name).write_text(f.read_text() * times)
    return out


def _completion(task, case):
    if "completion" in case:
        return case["completion"]
    answers = task.data.info[case["replies_from_info"]]
    msgs = [{"role": "assistant", "content": a} for a in answers]
    return [m for a in msgs for m in (a, {"role": "user", "content": "next"})][:-1]


def _score(loaded, case):
    from vf.episode.scoring import score

    task = list(loaded.taskset.take(case["row"] + 1))[case["row"]]
    if "answer" in case:  # a generated row (wordle's secret word): the case fixes it, as in v0_reference.py
        task.data = task.data.model_copy(update={"answer": case["answer"]})
    trace = Trace()
    for m in task.messages():
        trace.nodes.append(MessageNode(parent=len(trace.nodes) - 1 if trace.nodes else None, message=m))
    for m in _completion(task, case):
        trace.nodes.append(MessageNode(parent=len(trace.nodes) - 1, message=m, sampled=m["role"] == "assistant"))
    state = task.state_class()()
    asyncio.run(score(task, trace, state))
    return trace


# MathRubric's function is `correct_answer` in 0.1.14 (the name vf-migrate gives it), earlier releases
# called it `correct_answer_reward_func`
RENAMED = {"correct_answer": "correct_answer_reward_func"}
PARITY = [(n, i) for n in ENVS if isinstance(GOLDEN.get(n), list) for i in range(len(GOLDEN[n]))]


def _judge_fields(request, name: str) -> dict | None:
    """The case's load_environment() arguments (`fields`, as v0_reference.py passed `kwargs`), and a
    judge env's judge pointed at the scripted judge server (the golden rewards are v0's JudgeRubric
    against the same server: v0_reference.py with VF_JUDGE_BASE_URL)."""
    fields = dict(CASES[name].get("fields", {}))
    if CASES[name].get("judge"):
        fields["task"] = {"judge": {"base_url": request.getfixturevalue("stub").url}}
    return fields or None


# v0 reward functions of the corpus that raise on a case (v0 logged it and scored 0; vf records an error
# on the trace, so the episode counts as errored instead of looking like a wrong answer):
# - wordle: partial_credit_reward_func splits the last env reply into two lines; a won game's reply has
#   one (and so has the game's reply to an invalid guess: its vf-eval run plays valid ones, e2e_script)
RAISES = {"wordle": ("partial_credit_reward_func", "Error: ")}


def _raised(trace, name: str) -> bool:
    fn, words = RAISES[name]
    return not trace.ok and any(fn in e.message and words in e.message for e in trace.errors)


# Cases that attack v0 semantics compat must keep (each fails when the fix is reverted):
# - gpqa-0, gpqa-2: the JudgeRubric has no parser, so v0's judge sees the whole reply (a plain Parser),
#   not the env's ThinkParser answer ("sey" inside <think> turns the reversing judge's reply into "yes");
# - wordle-0: a reward function that raises is an error on the trace (RAISES), and the env's other
#   functions still give v0's scores;
# - continuation_quality-0: grade_reward passes **kwargs to judge(), as 0.1.3-0.1.7 allowed (its golden
#   is 0.1.7's): the judge is asked, not a TypeError scored 0 as 0.1.8+ would.
@pytest.mark.parametrize("name, i", PARITY)
def test_rewards_match_v0(migrated, local_data, request, name, i):
    if name in NEEDS_MATH_VERIFY:
        pytest.importorskip("math_verify")
    want = GOLDEN[name][i]
    trace = _score(_load(migrated[0], name, _judge_fields(request, name)), CASES[name]["cases"][i])
    v0 = dict(zip(want["names"], zip(want["scores"], want["weights"])))
    raised = RAISES.get(name, ("",))[0] if name in RAISES and _raised(trace, name) else None
    assert raised or not trace.errors, trace.errors
    if raised:  # v0 scored it 0 (and logged the error); vf leaves it unscored and the trace errored
        assert v0.pop(raised)[0] == 0 and (trace.rewards.pop(raised, None) is None)
    for fn, value in trace.rewards.items():  # each v0 function: same score, same weight
        if value is None and fn == "v0_rubric":  # compat.V0Taskset's hook name, seeded before it ran
            continue
        v0_fn = fn if fn in v0 else RENAMED.get(fn, fn)
        assert (value.score, value.weight) == pytest.approx(v0[v0_fn], abs=1e-9), (name, i, fn)
        v0[fn] = v0.pop(v0_fn)
    # v0 0.1.14 adds its own zero-weight monitor metrics (num_turns, ...) the v0 env did not define
    assert all(w == 0 for fn, (_, w) in v0.items() if fn not in trace.rewards), (name, i)
    if not raised:
        assert trace.reward == pytest.approx(want["reward"], abs=1e-9), (name, i)


# ---- end to end: vf-eval on the embedded model -------------------------------------------------

# every corpus env that runs on the embedded model; the default run keeps a representative few:
# single-turn on a hub dataset from VF_DATA_DIR, multi-turn env_response + MathRubric, tools, an
# EnvGroup built at load time (compat.V0Taskset), and a judge rubric of the env's own that calls its
# client directly (against the scripted judge server)
E2E = ["reverse_text", "doublecheck", "tool_test", "math_group", "misguided_attention"]
E2E_ALL = [pytest.param(n, marks=pytest.mark.migrate_all) for n in ENVS if n not in E2E]


def _vf_eval(root: Path, name: str, out: Path, judge_url: str) -> subprocess.CompletedProcess:
    data = _repeated_data(CASES[name]["data_repeat"]) if "data_repeat" in CASES[name] else V0 / "data"
    env = {**os.environ, "NO_COLOR": "1", "VF_DATA_DIR": str(data), "OPENAI_API_KEY": "unused"}
    args = ["-n", "2", "-r", "1", "--sampling.max-tokens", "8", "--max-turns", "2", "-o", str(out), "--json"]
    if "e2e_script" in CASES[name]:  # a game the embedded model cannot play: the scripted player's moves
        args += ["-m", "script", "--base-url", judge_url]
    if CASES[name].get("judge"):  # the judge's base URL setting → the scripted judge server
        args += ["--taskset.task.judge.base-url", judge_url]
    for key, value in CASES[name].get("fields", {}).items():  # required load_environment() arguments
        args += [f"--taskset.{key.replace('_', '-')}", value]
    return subprocess.run([str(Path(sys.executable).parent / "vf-eval"), str(root / f"{name}.py"), *args],
                          capture_output=True, text=True, env=env, timeout=300, check=False,
                          cwd=V0 if CASES[name].get("cwd") else None)


@pytest.mark.slow
@pytest.mark.parametrize("name", E2E + E2E_ALL)
def test_migrated_env_runs_under_vf_eval(migrated, tmp_path, stub, monkeypatch, name):
    if name in NEEDS_MATH_VERIFY:
        pytest.importorskip("math_verify")
    monkeypatch.setattr(Handler, "script", CASES[name].get("e2e_script", []))
    out = tmp_path / "run"
    r = _vf_eval(migrated[0], name, out, stub.url)
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["num_episodes"] == CASES[name].get("e2e_episodes", 2)  # -n 2, or the rows its local data has
    assert r.returncode == 0 and summary["num_errors"] == 0, r.stderr[-3000:]  # no errored episode
    traces = [json.loads(line) for line in (out / "traces.jsonl").read_text().splitlines()]
    for ep in traces:
        assert ep["ok"], ep["errors"]
        rewards = ep["traces"][0]["rewards"]
        assert all(v is not None for v in rewards.values()), (name, rewards)  # v0's functions scored
        assert bool(rewards) != CASES[name].get("e2e_no_rewards", False), (name, rewards)  # self_reward: none


# ---- the live v0 reference: every release 0.1.0-0.3.x --------------------------------------------

MATRIX = json.loads((V0 / "release_matrix.json").read_text())


def _row(cases: list[dict]) -> list:
    return [[c["reward"], c["scores"]] for c in cases]


def _flat(row: list) -> list[float]:
    """[[reward, [scores]], ...] as one list of numbers (pytest.approx compares flat ones)."""
    return [x for reward, scores in row for x in (reward, len(scores), *scores)]


def test_every_release_scored_the_corpus_and_the_goldens_are_their_releases_own():
    """release_matrix.json: the corpus's cases scored by each verifiers release 0.1.0-0.3.x itself
    (v0_reference.py; release_matrix.py merged them). Each env's golden is the column of the
    release it was written for, and that release loads it; every release scores some of the corpus."""
    assert list(MATRIX) == ["0.1.0", "0.1.1", "0.1.2", "0.1.3", "0.1.4", "0.1.5", "0.1.6", "0.1.7", "0.1.8",
                            "0.1.9", "0.1.10", "0.1.11", "0.1.12", "0.1.14", "0.2.0", "0.2.1", "0.3.0", "0.3.1"]
    for release, column in MATRIX.items():
        assert sum(isinstance(v, list) for v in column.values()) >= 5, release
    for name, want in GOLDEN.items():
        if isinstance(want, list):
            assert _flat(MATRIX[want[0]["verifiers"]][name]) == pytest.approx(_flat(_row(want))), name


@pytest.mark.v0ref
def test_a_live_release_gives_its_column_of_the_matrix(stub):
    """`-m v0ref` with VF_V0_PYTHON (and PYTHONPATH) at a verifiers release: every env it can score
    gives that release's recorded rewards, and it fails to load the same ones."""
    py = os.environ.get("VF_V0_PYTHON")
    if not py:
        pytest.skip("set VF_V0_PYTHON to the python of a venv with a verifiers release (and math-verify)")
    env = {**os.environ, "VF_JUDGE_BASE_URL": stub.url, "OPENAI_API_KEY": "unused"}  # v0's JudgeRubric → the stub
    r = subprocess.run([py, str(V0 / "v0_reference.py")], capture_output=True, text=True, timeout=1200, check=False,
                       env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    live = json.loads(r.stdout)
    release = next(c[0]["verifiers"] for c in live.values() if isinstance(c, list))
    for name, want in MATRIX[release].items():
        got = live[name]
        if isinstance(want, list):
            assert isinstance(got, list) and _flat(_row(got)) == pytest.approx(_flat(want)), (release, name, got)
        else:
            assert not isinstance(got, list), (release, name)


# ---- prime-rl configs and CI scripts ----------------------------------------------------------

PRIME_RL = V0 / "prime_rl"


def _train_config(path: Path):
    """The YAML as `vf-train --config` reads it: resolved on the embedded defaults, then checked."""
    import yaml
    from vf.trainer.config import check, resolve

    cfg = resolve(yaml.safe_load(path.read_text()))
    check(cfg)
    return cfg


def test_prime_rl_configs_become_vf_train_configs(tmp_path):
    from vf.trainer.config import TrainConfig

    lora = "lora" in TrainConfig.model_fields  # else alphabet_sort_rl.toml ([trainer.model.lora]) is refused
    shutil.copytree(PRIME_RL, tmp_path / "cfg")
    report = plan([tmp_path / "cfg"])
    apply(report)
    tomls = sorted(PRIME_RL.glob("*.toml"))
    assert len(tomls) >= 5
    for toml in tomls:
        if toml.stem == "alphabet_sort_rl" and not lora:
            assert (tmp_path / "cfg" / toml.name).exists()
            continue
        out = tmp_path / "cfg" / f"{toml.stem}.yaml"
        cfg = _train_config(out)
        # none sets [trainer.loss]: the old default becomes IPO eps 0.3, and the report says so
        assert (cfg.loss.name, cfg.loss.params["eps"]) == ("ipo", 0.3), toml.name
        notes = [e.message for e in report.entries if Path(e.file).name == toml.name]
        assert any("prime-rl's default loss" in m and "eps 0.3" in m for m in notes), toml.name
        # [wandb]: vf-train's wandb section when it has one, else listed as not used
        assert any(m.startswith("not used by vf-train") and "wandb" in m for m in notes) or cfg.wandb.project, toml.name
        assert not (tmp_path / "cfg" / toml.name).exists()  # replaced (kept as .bak)
    math = _train_config(tmp_path / "cfg" / "qwen3_30b_math.yaml")
    assert math.taskset["id"] == "i3_math" and math.eval.taskset["id"] == "aime25" and math.eval.every == 25
    assert (math.sampling.max_tokens, math.trainer.seq_len, math.optim.lr) == (32768, 32768 + 2048, 1e-6)
    assert math.async_.max_off_policy_steps == 8 and math.ckpt.every == 100
    # trainer.model keys keep their meaning: ep → parallel.ep, ac → activation checkpointing, compile
    assert math.parallel.ep == 8 and math.trainer.activation_checkpointing and math.model.compile
    assert math.env["agent"] == {"harness": {"id": "null"}, "runtime": {"type": "subprocess"}}
    if lora:
        alpha = _train_config(tmp_path / "cfg" / "alphabet_sort_rl.yaml")
        assert alpha.taskset == {"id": "alphabet-sort", "min_turns": 3, "max_turns": 5,
                                 "task": {"power_per_turn": False}}
        assert (alpha.orchestrator.batch_size, alpha.orchestrator.group_size, alpha.steps) == (256, 16, 200)
        assert (alpha.lora.rank, alpha.lora.alpha) == (32, 64)  # [trainer.model.lora]
    assert any("leaves no room for the prompt" in e.message for e in report.entries if e.status == "manual")
    again = plan([tmp_path / "cfg"])  # --check on the result: nothing more to change (but a refusal)
    assert not again.changes
    assert not [e for e in again.entries if e.status == "manual" and not e.message.startswith("not converted")]


RL_HEAD = 'max_steps = 10\n[model]\nname = "m"\n[[orchestrator.train.env]]\ntaskset = { id = "reverse-text" }\n'


@pytest.mark.parametrize("table, name, params, status", [
    ('[trainer.loss]\ntype = "icepop"\nratio_low = 0.2\nratio_high = 5.0\n', "icepop", {"low": 0.2, "high": 5.0},
     "migrated"),
    ('[trainer.loss]\ntype = "ipo"\nipo_threshold = 0.2\nkl_tau = 0.0\n', "ipo", {"eps": 0.2, "kl_tau": 0.0}, "migrated"),
    # prime-rl's KL default of that release (1e-3) is kept, and said (vf's own default is 0)
    ('[trainer.loss]\ntype = "ipo"\nipo_threshold = 0.1\n', "ipo", {"eps": 0.1, "kl_tau": 1e-3}, "manual"),
    # DPPO masks one side by the advantage sign: no vf loss; IPO with the wider bound, flagged
    ('[trainer.loss]\ndppo_mask_low = 0.2\ndppo_mask_high = 0.28\nkl_tau = 0.001\n', "ipo",
     {"eps": 0.28, "kl_tau": 0.001}, "manual"),
    ('[trainer.loss]\ntype = "custom"\nimport_path = "my.loss"\n', "ipo", {"eps": 0.3, "kl_tau": 0.0}, "manual"),
])
def test_trainer_loss_keeps_its_meaning(tmp_path, table, name, params, status):
    src = tmp_path / "rl.toml"
    src.write_text(RL_HEAD + table)
    report = plan([src])
    apply(report)
    cfg = _train_config(tmp_path / "rl.yaml")
    assert cfg.loss.name == name and cfg.loss.params == pytest.approx(params)
    loss_notes = [e for e in report.entries if "loss" in e.message or "kl_tau" in e.message]
    assert loss_notes and (status == "manual") == any(e.status == "manual" for e in loss_notes)


@pytest.mark.parametrize("mixtures", [True, False])
def test_several_envs_are_never_dropped_silently(tmp_path, monkeypatch, mixtures):
    """Every training env is kept: a vf-train mixture when vf-train takes one (`tasksets`), else the
    first, with the others named in a manual step (never kept silently as the first alone)."""
    from vf.migrate import prime_rl

    real = prime_rl._vf_train_has
    if mixtures and not real("tasksets"):
        pytest.skip("this vf-train takes no mixture")
    monkeypatch.setattr(prime_rl, "_vf_train_has", lambda f: mixtures if f == "tasksets" else real(f))
    src = tmp_path / "rl.toml"
    src.write_text(RL_HEAD + '[[orchestrator.train.env]]\ntaskset = { id = "wordle" }\n'
                   '[trainer.loss]\ntype = "ipo"\neps = 0.3\nkl_tau = 0.0\nadv_tau = 2.0\n')
    report = plan([src])
    msgs = [e.message for e in report.entries if e.status == "manual"]
    assert any("adv_tau = 2.0" in m for m in msgs)
    apply(report)
    cfg = _train_config(tmp_path / "rl.yaml")
    if mixtures:
        assert [e.id for e in cfg.tasksets] == ["reverse-text", "wordle"]
        assert any("2 training envs → a vf-train mixture" in e.message for e in report.entries)
    else:
        assert cfg.taskset["id"] == "reverse-text"
        assert any("2 training envs" in m and "wordle" in m and "one vf-train per env" in m for m in msgs)


PRIME_MODEL = """
[trainer.model]
cp = 2
ep = 4
tp = 2
attn = "flash_attention_3"
secret_knob = 7

[orchestrator]
max_async_level = 3
max_off_policy_steps = 8
batch_size = 16
group_size = 4
oversampling_factor = 2
mystery = "x"
"""


def test_prime_rl_keys_keep_their_meaning_or_are_listed(tmp_path):
    """cp/ep → --parallel.cp/ep, max_async_level → the staleness bound, and every key without a
    vf-train meaning is listed one by one (manual unless it only says how the run is deployed)."""
    src = tmp_path / "rl.toml"
    src.write_text(RL_HEAD + PRIME_MODEL)
    report = plan([src])
    apply(report)
    cfg = _train_config(tmp_path / "rl.yaml")
    assert (cfg.parallel.cp, cfg.parallel.ep, cfg.async_.max_off_policy_steps) == (2, 4, 3)
    manual = {e.message.split(" =")[0] for e in report.entries if e.status == "manual"}
    assert {"trainer.model.secret_knob", "orchestrator.mystery"} <= manual
    info = " ".join(e.message for e in report.entries if e.status == "info")
    for key in ("trainer.model.tp", "trainer.model.attn", "orchestrator.oversampling_factor"):
        assert key in info and key not in manual
    assert "max_off_policy_steps 8 (policies one rollout may span)" in info


def test_lora_is_refused_while_vf_train_has_none(tmp_path, monkeypatch):
    from vf.migrate import prime_rl

    monkeypatch.setattr(prime_rl, "_vf_train_has", lambda field: field != "lora")
    src = tmp_path / "rl.toml"
    src.write_text(RL_HEAD + "[trainer.model.lora]\nrank = 16\nalpha = 32\n")
    report = plan([src])
    assert not report.changes  # the TOML stays: no YAML that would fine-tune every weight
    (refusal,) = [e for e in report.entries if e.message.startswith("not converted")]
    assert refusal.status == "manual"  # --check fails on it
    assert "rank 16" in refusal.message and "no LoRA yet" in refusal.message and "every weight" in refusal.message


def test_prime_cli_evals_become_valid_vf_eval_calls(tmp_path):
    """`prime env eval` was rewritten to `prime env vf-eval` (no such command); each rewrite is
    parsed by vf-eval's own CLI (vf.cli_docs.dry_parse), as a shell would run it."""
    from vf.cli_docs import dry_parse

    script = tmp_path / "ci.sh"
    script.write_text("prime env eval gsm8k -m gpt-4.1-mini -n 5 -r 2 -b http://x/v1 -a '{\"x\": 1}'\n"
                      "prime eval run wordle -n 3 --skip-upload\nprime eval tui\n")
    report = plan([script])
    new = report.changes[0].new.splitlines()
    assert new == ["vf-eval gsm8k -m gpt-4.1-mini -n 5 -r 2 --base-url http://x/v1 --taskset.x 1",
                   "vf-eval wordle -n 3", "prime eval tui"]
    for line in new[:2]:
        dry_parse(line)
    msgs = {e.message for e in report.entries}
    assert any("--skip-upload dropped" in m for m in msgs)
    assert any(e.status == "manual" and "Prime Inference" in e.message and e.line == 2 for e in report.entries)


def test_v0_cli_flags_are_rewritten_or_say_what_replaces_them(tmp_path):
    script = tmp_path / "ci.sh"
    script.write_text("vf-eval gsm8k -n 20 -r 3 -t 1024 --save-dataset --save-to-hf-hub\n"
                      "vf-eval reverse-text --num-examples 5 -s\nuv run rl @ configs/rl.toml\n"
                      "uv run sft @ configs/sft.toml\n")
    report = plan([script])
    new = report.changes[0].new.splitlines()
    assert new[0] == "vf-eval gsm8k -n 20 -r 3 --sampling.max-tokens 1024"
    assert new[1] == "vf-eval reverse-text -n 5"
    assert new[2] == "vf-train configs/rl.yaml"
    assert "TODO(vf-migrate)" in new[3] and "--loss sft" in new[3]
    msgs = {e.message for e in report.entries}
    assert any(m.startswith("--save-dataset dropped") and "traces.jsonl" in m for m in msgs)
    assert any("--save-to-hf-hub" in m and "huggingface-cli upload" in m for m in msgs)
    assert any(m.startswith("-s dropped") for m in msgs)


def test_a_module_libcst_cannot_parse_is_still_migrated(tmp_path, monkeypatch):
    """Python's own parser takes over when libcst gives up (simulated: libcst 1.9 parses every
    3.11 module we know; newer syntax or libcst bugs are what this guards)."""
    import libcst

    from vf.migrate import python_env

    real = libcst.parse_module
    calls = []

    def picky(source, *a, **k):
        calls.append(source)
        if len(calls) == 1:  # the original text
            raise libcst.ParserSyntaxError("simulated", lines=[""], raw_line=1, raw_column=0)
        return real(source, *a, **k)

    monkeypatch.setattr(python_env.cst, "parse_module", picky)
    src = (V0 / "envs" / "reverse_text.py").read_text()
    report = python_env.migrate_environment(tmp_path / "reverse_text.py", src)
    new = report.changes[0].new
    assert report.changes[0].old == src
    assert "TODO(vf-migrate)" not in new and not VERIFIERS_IMPORT.search(new)
    compile(new, "reverse_text.py", "exec")
    assert "class ReverseTextTaskset(vf.Taskset" in new
    assert any("libcst could not parse" in e.message for e in report.entries)


def test_textarena_wordle_replies_as_v0_rewards_read_them():
    """compat.TextArenaEnv plays Wordle-v0: the reply after a guess is textarena's layout (the guess
    line, then the G/Y/X marks), which wordle's partial_credit_reward_func counts; six guesses end it."""
    from vf.errors import UsageError
    from vf.migrate import compat

    env = compat.TextArenaEnv(num_train_examples=3, seed=1, feedback_fn=lambda o: o.split("Feedback:")[-1])
    assert len(env.dataset) == 3 and all(len(r["answer"]) == 5 for r in env.dataset) and env.eval_dataset is None
    state = {"answer": "grape"}
    reply = env.env_response([{"role": "assistant", "content": "<think>a</think><guess>[crane]</guess>"}], state)
    guess, marks = reply[0]["content"].strip().split("\n")[:2]
    assert (guess, marks) == ("C R A N E", "X G G X G") and not env.is_completed([], state)
    for _ in range(4):
        env.env_response([{"role": "assistant", "content": "<guess>[crane]</guess>"}], state)
    assert not env.is_completed([], state)
    last = env.env_response([{"role": "assistant", "content": "<guess>[crane]</guess>"}], state)
    assert env.is_completed([], state) and "[grape]" in last[0]["content"]  # the sixth guess ends the game
    won = {"answer": "grape"}
    env.env_response([{"role": "assistant", "content": "<guess>[grape]</guess>"}], won)
    assert env.is_completed([], won)
    with pytest.raises(UsageError, match="Wordle-v0"):
        compat.TextArenaEnv(game="Sudoku-v0")
