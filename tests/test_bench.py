"""vf-bench's CLI contract: exit codes, the JSON document, --compare gating. No timing assertions."""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest


def bench(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vf.commands.bench", *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def loss_run(tmp_path_factory):
    """One real `vf-bench loss --size tiny --json --out FILE` (two child processes, ~10 s)."""
    out = tmp_path_factory.mktemp("bench") / "loss.json"
    p = bench("loss", "--size", "tiny", "--json", "--out", str(out))
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout), out


def test_json_document_shape(loss_run):
    doc, out = loss_run
    assert json.loads(out.read_text()) == doc  # --out keeps exactly what --json printed
    assert doc["schema"] == "vf-bench/1" and doc["size"] == "tiny"
    assert doc["machine"]["cpu_count"] >= 1 and doc["versions"]["torch"]
    assert len(doc["config_hash"]) == 12
    loss = doc["suites"]["loss"]
    assert loss["config"]["vocabs"] == [4096] and loss["skipped"] is None
    assert [c["name"] for c in loss["cases"]] == ["V4096/fwd", "V4096/fwd_bwd"]
    for case in loss["cases"]:
        for side in ("ours", "ref"):
            assert case[side]["seconds"] > 0 and case[side]["peak_rss_mib"] > 0
        sp, mem = case["ratios"]["speedup"], case["ratios"]["memory"]
        assert sp["better"] == "higher" and mem["better"] == "lower"
        # the ratios are what the raw figures say
        assert sp["value"] == pytest.approx(case["ref"]["seconds"] / case["ours"]["seconds"])
        assert mem["value"] == pytest.approx(case["ours"]["extra_mib"] / case["ref"]["extra_mib"])


def _doctor(doc: dict, ratio: str, factor: float) -> dict:
    bad = copy.deepcopy(doc)
    for case in bad["suites"]["loss"]["cases"]:
        case["ratios"][ratio]["value"] *= factor
    return bad


@pytest.mark.parametrize("ratio,factor,code", [
    ("speedup", 1.0, 0),    # itself: nothing regressed
    ("speedup", 1.05, 0),   # baseline 5% better: within the 10% threshold
    ("speedup", 1.5, 3),    # baseline 50% faster: now a regression
    ("memory", 0.5, 3),     # baseline used half the memory (lower is better): a regression
    ("memory", 2.0, 0),     # baseline used twice the memory: an improvement
])
def test_compare_exit_codes(loss_run, tmp_path, ratio, factor, code):
    doc, out = loss_run
    base = tmp_path / "base.json"
    base.write_text(json.dumps(_doctor(doc, ratio, factor)))
    p = bench("--results", str(out), "--compare", str(base), "--json")
    assert p.returncode == code, p.stderr
    cmp = json.loads(p.stdout)["compare"]
    assert len(cmp["compared"]) == 4 and cmp["threshold"] == 0.1
    assert len(cmp["regressions"]) == (2 if code == 3 else 0)
    if code == 3:
        assert "regressed beyond 10%" in p.stderr and "Traceback" not in p.stderr


def test_threshold_flag(loss_run, tmp_path):
    doc, out = loss_run
    base = tmp_path / "base.json"
    base.write_text(json.dumps(_doctor(doc, "speedup", 1.5)))
    assert bench("--results", str(out), "--compare", str(base), "--threshold", "0.5").returncode == 0


@pytest.mark.parametrize("args,needle", [
    (["nosuch"], "unknown suite(s): nosuch"),
    (["loss", "--size", "huge"], "unknown --size 'huge'"),
    ([], "missing SUITE"),
    (["loss", "--compare", "/nonexistent/base.json"], "cannot read the baseline file"),
    (["--results", "/nonexistent/r.json"], "--results compares or renders saved results"),
    (["engine", "--model.size", "5b"], "unknown --model.size '5b'"),
    (["engine", "--model.size", "100m", "--model", "/tmp"], "give --model or --model.size, not both"),
    (["engine", "--model.layers", "3"], "vf-bench takes --model.size tiny|100m|600m and vf-train's --parallel.*"),
    (["loss", "--parallel.cp", "2"], "--parallel.* sets the layouts of the parallel suite"),
    (["parallel", "--parallel.cp", "8", "--parallel.cp-style", "ulysses"], "4 query heads do not split 8 ways"),
    (["parallel", "--parallel.ep", "3"], "--parallel.ep 3 does not divide the expert count (32)"),
    (["parallel", "--parallel.cp", "1"], "--parallel.cp 1: the suite compares a split against 1 process"),
    (["parallel", "--parallel.cp-style", "spiral"], "cp_style: Input should be 'ring' or 'ulysses'"),
    (["parallel", "--parallel.dp-shard", "2"], "--parallel.dp-shard: the parallel suite measures cp and ep"),
])
def test_bad_usage_exits_2(args, needle):
    p = bench(*args, timeout=30)
    assert p.returncode == 2
    assert needle in p.stderr and "Traceback" not in p.stderr


def test_markdown_of_saved_results(loss_run):
    _, out = loss_run
    p = bench("--results", str(out), "--markdown", timeout=30)
    assert p.returncode == 0, p.stderr
    assert "### loss" in p.stdout and "| V4096/fwd_bwd | speedup **" in p.stdout


def test_bad_baseline_content_exits_2(tmp_path):
    base = tmp_path / "base.json"
    base.write_text('{"not": "results"}')
    p = bench("loss", "--size", "tiny", "--compare", str(base), timeout=30)
    assert p.returncode == 2 and "no 'suites' object" in p.stderr


def test_cli_imports_no_torch():
    code = ("import sys, vf.commands.bench, vf.bench, vf.bench.common;"
            "assert 'torch' not in sys.modules, 'torch imported'")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0


def test_compare_directions_unit():
    from vf.bench.common import compare

    def doc(sp, mem):
        return {"suites": {"s": {"config_hash": "h", "cases": [{"name": "c", "ratios": {
            "speedup": {"value": sp, "better": "higher"}, "memory": {"value": mem, "better": "lower"}}}]}}}

    assert compare(doc(1.0, 0.5), doc(1.0, 0.5), 0.1)["regressions"] == []
    r = compare(doc(0.85, 0.56), doc(1.0, 0.5), 0.1)["regressions"]
    assert [x["ratio"] for x in r] == ["speedup", "memory"]
    assert r[0]["change"] == pytest.approx(-0.15)
    # a baseline of different work (config hash) is not compared, only reported
    other = doc(1.0, 0.5)
    other["suites"]["s"]["config_hash"] = "other"
    cmp = compare(doc(0.5, 0.9), other, 0.1)
    assert cmp["regressions"] == [] and cmp["compared"] == [] and cmp["config_changed"] == ["s"]


def test_trainer_moe_flops_count_active_experts():
    """The MoE cases' MFU counts the router and the k routed (+ shared) experts a token uses, not
    all 128; GLM-4.5-Air's first layer is dense."""
    from vf.bench.trainer import flops_per_token, model_config

    qwen = model_config("qwen3-30b-a3b", 1)
    h, q, kv = 512, 8 * 128, 1 * 128
    attn = h * q + 2 * h * kv + q * h
    moe = 128 * h + 3 * 8 * 192 * h
    assert flops_per_token(qwen, 256) == 6 * (attn + moe + 4096 * h) + 12 * q * 256
    glm = model_config("glm-4.5-air", 2)
    q = 12 * 128
    attn = h * q + 2 * h * kv + q * h
    dense, moe = 3 * 1368 * h, 128 * h + 3 * (8 + 1) * 176 * h
    assert flops_per_token(glm, 256) == 6 * (2 * attn + dense + moe + 4096 * h) + 12 * 2 * q * 256


def test_family_shapes_pass_the_family_checks_and_keep_their_layouts(tmp_path):
    """The issue-19 family cases: each trainer shape survives the HF round trip through its family's
    checks (what transformers and our loader will read), keeps the real layout it scales (3 DeltaNet :
    1 attention layers; qwen4_exp's PLE layer, QSA indexer choosing fewer tokens than the 2k-token row,
    4 residual streams; glm5_next's KDA + indexed MLA layers and dense-then-sparse MLPs; kimi_k25's
    dense-then-MoE MLA decoder), and the reference class is a causal LM except for qwen3_vl_moe,
    glm5_next and kimi_k25, which transformers only has as `…ForConditionalGeneration`."""
    import transformers
    from vf.models import ModelConfig

    from vf.bench.engine import FAMILIES
    from vf.bench.trainer import HF_SHAPES, SHAPES, SIZES, hf_reference_class, model_config

    for shape in ("qwen4-exp", "qwen3.5-moe"):
        cfg = model_config(shape, None)
        back = ModelConfig.from_hf_dict(cfg.to_hf_dict())
        assert back.to_dict() == cfg.to_dict(), shape
        assert [t == "linear_attention" for t in cfg.layer_types] == [True, True, True, False]
        assert cfg.num_experts > cfg.num_experts_per_tok > 1 and cfg.shared_expert_gate
    q = model_config("qwen4-exp", None)
    assert q.hc_mult == 4 and q.ple_layer_ids == [1] and q.layer_types[3] == "indexed_attention"
    spec = {s["shape"]: s for s in SIZES["full"]}
    assert q.indexer_budget < spec["qwen4-exp"]["seq"] and q.indexer_budget % q.indexer_compress_ratio == 0
    for shape in FAMILIES.values():  # every engine family case has its trainer case
        assert shape in SHAPES or shape in HF_SHAPES
        assert spec[shape]["target"] == 1.0
    model_type, text, vision, top = HF_SHAPES["qwen3-vl-moe"]
    transformers.AutoConfig.for_model(model_type, text_config=text, vision_config=vision, **top).save_pretrained(
        tmp_path / "vl")
    ModelConfig.from_hf_dict(json.loads((tmp_path / "vl" / "config.json").read_text()))  # our loader takes it
    assert hf_reference_class(str(tmp_path / "vl")) is transformers.AutoModelForImageTextToText
    transformers.AutoConfig.for_model("qwen4_exp_text", **{k: v for k, v in q.to_hf_dict().items()
                                                           if k != "model_type"}).save_pretrained(tmp_path / "q")
    assert hf_reference_class(str(tmp_path / "q")) is transformers.AutoModelForCausalLM
    # glm5_next: one KDA and one k-pool indexed MLA layer, dense then sparse MLPs, 4 streams, the indexer
    # choosing fewer tokens than the row; kimi_k25: a dense layer then group-limited MoE layers
    for shape, check in (("glm5-next", lambda c: c.layer_types == ["linear_attention", "indexed_attention"]
                          and not c.is_moe_layer(0) and c.is_moe_layer(1) and c.hc_mult == 4 and c.kv_lora_rank > 0),
                         ("kimi-k25", lambda c: c.mla and not c.is_moe_layer(0)
                          and all(c.is_moe_layer(i) for i in range(1, 4)) and c.num_experts > c.num_experts_per_tok)):
        model_type, text, vision, top = HF_SHAPES[shape]
        transformers.AutoConfig.for_model(model_type, text_config=text, vision_config=vision, **top).save_pretrained(
            tmp_path / shape)
        cfg = ModelConfig.from_hf_dict(json.loads((tmp_path / shape / "config.json").read_text()))
        assert check(cfg), shape
        assert hf_reference_class(str(tmp_path / shape)) is transformers.AutoModelForImageTextToText
    assert HF_SHAPES["glm5-next"][1]["index_topk"] < spec["glm5-next"]["seq"]


def test_engine_costs_count_flops_and_bytes():
    """The engine suite's FLOP and byte counts for a Qwen3-0.6B-shaped config (MFU and bandwidth
    utilisation are these ÷ the measured time ÷ the measured limit)."""
    from types import SimpleNamespace

    from vf.bench.engine import figures, model_costs, work

    cfg = SimpleNamespace(hidden_size=1024, num_layers=28, num_heads=16, num_kv_heads=8, head_dim=128,
                          intermediate_size=3072, vocab_size=151936)
    c = model_costs(cfg)
    layer = 1024 * 4096 + 2048 * 1024 + 3 * 1024 * 3072  # qkv, o, gate/up/down
    assert c["matmul"] == 2 * 28 * layer and c["head"] == 2 * 1024 * 151936
    assert c["weight_bytes"] == 4 * (28 * layer + 1024 * 151936)  # 440M + 156M fp32 weights
    assert c["kv_bytes_per_key"] == 4 * 2 * 8 * 128 * 28
    w = work(c, B=2, P=4, T=3)  # 2 decode steps, the queries see 5 and 6 keys
    assert w["prefill_flops"] == 2 * 4 * c["matmul"] + 2 * c["head"] + 2 * c["attn_per_key"] * 10
    assert w["decode_flops"] == 2 * 2 * (c["matmul"] + c["head"]) + 2 * c["attn_per_key"] * 11
    assert w["step_bytes"] == c["weight_bytes"] + 2 * c["kv_bytes_per_key"] * 5.5
    f = figures(2, 4, 3, total_s=3.0, prefill_s=1.0, w=w, peak_prefill=1e11, peak_decode=1e10, bandwidth=1e10)
    assert f["tokens_per_s"] == 2.0 and f["prefill_tok_s"] == 8.0 and f["decode_tok_s"] == 2.0
    assert f["decode_mfu"] == round(w["decode_flops"] / 2.0 / 1e10, 3)
    assert f["decode_bw_util"] == round(w["step_bytes"] / 1.0 / 1e10, 3)
    assert f["decode_limit_frac"] == max(f["decode_mfu"], f["decode_bw_util"])



@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or (os.cpu_count() or 1) < 2, reason="needs Linux, 2 CPUs")
def test_bound_cpus_reports_a_child_pinned_to_one_cpu():
    """The engine suite reports where vLLM's processes are pinned (its model runs on the CPUs its
    OpenMP threads are bound to): a grandchild pinned to CPU 1 is found, an unpinned child is not."""
    import time

    from vf.bench.engine import bound_cpus

    code = ("import os, subprocess, sys, time; os.sched_setaffinity(0, {1}); "
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); time.sleep(30)")
    free = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    pinned = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # the grandchild inherits the pin once it has started
            found = bound_cpus()
            if len(found) == 2:
                break
            time.sleep(0.1)
        assert sorted(found.values()) == [[1], [1]], found
        assert any(k.endswith(f"({pinned.pid})") for k in found) and not any(f"({free.pid})" in k for k in found)
    finally:
        for proc in (free, pinned):
            proc.kill()
            proc.wait()


# -- vf-eval against a remote endpoint: no torch; the harness suite's program cases -------------

HERE = Path(__file__).parent
needs_bwrap = pytest.importorskip("test_runtime_sandbox").needs_bwrap
needs_peer = pytest.mark.skipif(not os.environ.get("VF_VERIFIERS_PYTHON"),
                                reason="set VF_VERIFIERS_PYTHON to a python with verifiers==0.4.0")
SCRIPT_ENV = HERE / "program_envs" / "script_agent.py"


@pytest.mark.parametrize("path", [
    "in-process",
    pytest.param("program", marks=needs_bwrap),
])
def test_vf_eval_against_a_remote_endpoint_imports_no_torch(cli, stub, tmp_path, path):
    """A whole `vf-eval ... --client.base-url URL` process, every import logged
    (PYTHONPROFILEIMPORTTIME): neither the in-process chat loop nor a program harness (a real agent
    program in the default sandbox runtime, its calls through the interception server) imports
    torch, whose import alone costs seconds of a CI run's start-up."""
    from vf.bench.harness_program import torch_imports

    if path == "in-process":
        args, control = ["reverse-text", "-m", "reverse", "-n", "2"], "vf.evaluate"
    else:
        args = [str(SCRIPT_ENV), "-m", "bash:echo hi > out.txt", "--env.agent.harness.id", f"{SCRIPT_ENV}:ScriptAgent"]
        control = "vf.runtime.sandbox"  # the program ran in vf's default runtime
    out = tmp_path / "run"
    proc = cli("vf-eval", *args, "--client.base-url", stub.url, "--client.api-key-var", "FAKE_KEY", "-o", str(out),
               env={"FAKE_KEY": "sk-test", "PYTHONPROFILEIMPORTTIME": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    # the log is real (it names the path's own modules), so an empty torch list means something
    assert re.search(rf"\|\s*{re.escape(control)}$", proc.stderr, re.MULTILINE), proc.stderr[-2000:]
    assert torch_imports(proc.stderr) == []
    episodes = [json.loads(line) for line in (out / "traces.jsonl").read_text().splitlines()]
    assert len(episodes) == 2 and all(t["ok"] for e in episodes for t in e["traces"])
    if path == "program":  # the program's own bash tool call went through interception onto the trace
        calls = [n["message"].get("tool_calls") for e in episodes for n in e["traces"][0]["nodes"] if n.get("message")]
        assert any(c and c[0]["name"] == "bash" for c in calls)  # verifiers' flat wire shape


def test_torch_import_lines_are_recognised():
    from vf.bench.harness_program import torch_imports

    log = ("import time:       120 |        120 |   vf.evaluate\n"
           "import time:      3000 |     900000 | torch\n"
           "import time:        50 |         50 |     torch._C\n"
           "import time:        10 |         10 |   vf.bench.torchless\n"
           "import time:        10 |         10 |   mytorch\n")
    assert [line.split("|")[-1].strip() for line in torch_imports(log)] == ["torch", "torch._C"]


def test_bench_stub_bash_model_calls_then_relays():
    """vf.bench.stub_server's `bash:CMD`: a bash tool call with CMD, then the tool's output."""
    from vf.bench.stub_server import respond

    tools = [{"type": "function", "function": {"name": "bash", "parameters": {}}}]
    msgs = [{"role": "user", "content": "go"}]
    _, _, body = respond("POST", "/v1/chat/completions",
                         json.dumps({"model": "bash:echo hi > out.txt", "messages": msgs, "tools": tools}).encode())
    choice = json.loads(body)["choices"][0]
    (call,) = choice["message"]["tool_calls"]
    assert choice["finish_reason"] == "tool_calls" and call["function"]["name"] == "bash"
    assert json.loads(call["function"]["arguments"]) == {"command": "echo hi > out.txt"}
    msgs += [{"role": "assistant", "content": "", "tool_calls": [call]},
             {"role": "tool", "tool_call_id": call["id"], "content": "hi\n"}]
    _, _, body = respond("POST", "/v1/chat/completions",
                         json.dumps({"model": "bash:echo hi > out.txt", "messages": msgs, "tools": tools}).encode())
    choice = json.loads(body)["choices"][0]
    assert choice["message"]["content"] == "hi\n" and "tool_calls" not in choice["message"]


def _program_measure(env: dict[str, str]) -> dict:
    from vf.bench.common import run_child

    return run_child("vf.bench.harness_program:measure",
                     {"tasks": 2, "rollouts": 1, "concurrency": 2, "repeats": 0, "peer_timeout": 300}, timeout=900, env=env)


# verifiers 0.4.0's bash harness on the bench taskset (recorded 2026-12-04 with /work/venvs/v04):
# every episode ends with the relayed "hi", no errors; its setup stage (uv sync of the program)
# runs once per rollout
PEER_PROGRAM = {"episodes": 2, "mean_reward": 1.0, "errors": 0}


@needs_bwrap
def test_program_case_runs_the_agent_in_the_sandbox(monkeypatch):
    """The bench's program case on vf alone: every episode of the real agent program is rewarded
    (its command ran, its reply came through interception), the bare program does the same work,
    no torch; without a peer the reference is skipped, saying why."""
    monkeypatch.delenv("VF_VERIFIERS_PYTHON", raising=False)
    res = _program_measure({"VF_VERIFIERS_PYTHON": ""})
    ours = res["ours"]
    assert (ours["episodes"], ours["mean_reward"], ours["errors"]) == (2, 1.0, 0)
    assert ours["command_wall_s"] > ours["span_s"] > 0 and ours["outside_span_s"] > 0
    assert ours["agent_ms"] > 0 and ours["setup_ms"] is not None
    assert res["bare"]["ok"] == 2 and res["no_torch"] is True and res["torch_lines"] == []
    assert "VF_VERIFIERS_PYTHON" in res["skipped"] and "peer" not in res


@needs_bwrap
@needs_peer
def test_program_case_peer_still_gives_the_recorded_figures():
    res = _program_measure({})
    assert "skipped" not in res, res.get("skipped")
    peer = res["peer"]
    assert {k: peer[k] for k in PEER_PROGRAM} == PEER_PROGRAM
    assert peer["setup_ms"] > 0 and peer["command_wall_s"] > peer["span_s"] > 0


@pytest.mark.matrix
def test_parallel_suite_measures_per_rank_memory_under_torchrun():
    """`vf-bench parallel --size tiny --parallel.ep 2 --parallel.cp-style ulysses`: real torchrun
    workers at the layouts the flags ask for (Ulysses instead of the default ring); ep 2 holds half
    of the expert bytes per rank and spends time in all-to-all, cp 2 (Ulysses) allocates less per
    rank than one process, and the MoE block reports an MFU for ours (ep 1 and ep 2) and
    transformers against the same-process peak."""
    from vf.bench import run_suite

    doc = run_suite("parallel", size="tiny", parallel={"ep": 2, "cp_style": "ulysses"})
    assert (doc["config"]["cp"], doc["config"]["ep"], doc["config"]["cp_styles"]) == (2, 2, ["ulysses"])
    cases = {c["name"].split("/")[0]: c for c in doc["cases"]}
    assert set(cases) == {"cp2-ulysses", "ep2", "moe-block-qwen3-30b-a3b"}
    ep = cases["ep2"]
    assert ep["ratios"]["expert_memory"]["value"] == 0.5 and ep["ratios"]["expert_memory"]["met"]
    assert ep["ours"]["all_to_all_s_per_step"] > 0 and ep["ref"]["all_to_all_s"] == 0
    cp = cases["cp2-ulysses"]
    assert 0 < cp["ratios"]["memory"]["value"] < 1, cp
    moe = cases["moe-block-qwen3-30b-a3b"]
    for side in (moe["ours"], moe["ref"]):
        assert 0 < side["mfu_pct"] <= 100 and 0 < side["expert_shape_peak_pct"] <= 100, moe
    assert 0 < moe["ours"]["ep2_mfu_pct"] <= 100 and moe["ratios"]["mfu_ep2"]["value"] > 0

# torchrun's summary when a rank died by a signal (as in a CI run where a gloo rank aborted)
SIGNALLED = """terminate called without an active exception
[0]:
  rank      : 1 (local_rank: 1)
  exitcode  : -6 (pid: 24226)  (SIGABRT)
  traceback : Signal 6 (SIGABRT) received by PID 24226"""
RAISED = """ValueError: a bug in the worker
[0]:
  rank      : 1 (local_rank: 1)
  exitcode  : 1 (pid: 24226)"""


@pytest.mark.parametrize("stderr, retried", [(SIGNALLED, True), (RAISED, False)])
def test_parallel_worker_killed_by_a_signal_is_run_again_and_reported(monkeypatch, stderr, retried):
    """The first torchrun run "fails" with the given summary; a rank killed by a signal is run again
    (for real, 2 gloo ranks) and the failure is kept for the notes, a rank's exception fails at once."""
    from vf.bench import parallel

    real, calls = subprocess.run, []

    def first_fails(cmd, **kw):
        calls.append(cmd)
        if len(calls) == 1:
            return subprocess.CompletedProcess(cmd, 1, "", stderr)
        return real(cmd, **kw)

    monkeypatch.setattr(parallel.subprocess, "run", first_fails)
    notes: list[str] = []
    spec = {"kind": "cp", "tokens": 128, "steps": 1, "style": "ring"}
    if not retried:
        with pytest.raises(parallel.ChildFailed, match="a bug in the worker"):
            parallel.launch_worker(spec, 2, retried=notes)
        assert len(calls) == 1 and notes == []
        return
    figures = parallel.launch_worker(spec, 2, retried=notes)
    assert len(calls) == 2 and len(figures) == 2 and all(f["tokens"] == 128 for f in figures)
    assert len(notes) == 1 and "SIGABRT" in notes[0] and "terminate called" in notes[0]
