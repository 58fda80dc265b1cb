"""`harness` suite: the harness's own overhead. Episodes/s of the `vf-eval` path (taskset load,
plan, `run_plan` → `run_episode`: prompt, model call, trace records, scoring, run-dir append) against
a zero-latency local server (`vf.bench.stub_server`, its own process), vs the same model calls
made bare (`OpenAIEngine.generate` on the same messages and sampling, same concurrency, no trace,
no scoring, no file).

`vs_bare` = harness episodes/s ÷ bare calls/s (1.0 would be a free harness; the rest is
overhead). Both sides share the engine class and the server, so the ratio isolates the harness.

Program cases (`vf.bench.harness_program`): episodes that run a real agent program through the
interception server in vf's sandbox runtime, against the bare program and against verifiers
0.4.0's `bash` harness; per-episode and whole-process (start-up included) wall time, and a check
that `vf-eval` against a remote endpoint imports no torch.

Peer cases (`vf.bench.harness_peer`): the same v1 taskset run by verifiers 0.4.0's `vf-eval` and by
ours at `-r 10 -c 32`, plain and with an MCP toolset; `vs_verifiers` = verifiers' per-episode wall
time ÷ ours (target ≥ 100). Skipped, saying why, without `VF_VERIFIERS_PYTHON`.
"""

from __future__ import annotations

import time
from typing import Any

from vf.bench.common import Case, Ratio, ratio, run_child, suite_result

SIZES = {
    "full": {"episodes": 512, "concurrency": [1, 32], "repeats": 3, "taskset": "reverse-text",
             "peer": {"tasks": 10, "rollouts": 10, "concurrency": 32, "repeats": 2, "peer_timeout": 1800},
             "program": {"tasks": 10, "rollouts": 3, "concurrency": 32, "repeats": 2, "peer_timeout": 1200}},
    "quick": {"episodes": 128, "concurrency": [1, 32], "repeats": 1, "taskset": "reverse-text",
              "peer": {"tasks": 10, "rollouts": 10, "concurrency": 32, "repeats": 1, "peer_timeout": 900},
              "program": {"tasks": 10, "rollouts": 3, "concurrency": 32, "repeats": 1, "peer_timeout": 900}},
    "tiny": {"episodes": 8, "concurrency": [4], "repeats": 1, "taskset": "reverse-text",
             "peer": {"tasks": 2, "rollouts": 2, "concurrency": 4, "repeats": 0, "peer_timeout": 600},
             "program": {"tasks": 2, "rollouts": 1, "concurrency": 2, "repeats": 0, "peer_timeout": 600}},
}
PEER_TARGET = 100.0  # the target: ours at least 100x faster per episode


def measure(taskset: str, episodes: int, concurrency: list[int], repeats: int) -> dict[str, Any]:
    """(child) {c: {"harness": {...}, "bare": {...}}}; harness and bare runs alternate."""
    import asyncio
    import statistics
    import subprocess
    import sys
    import tempfile

    from vf.bench.serve import free_port
    from vf.engines.base import GenerateRequest
    from vf.episode.loading import load_taskset
    from vf.episode.runner import make_engine, make_plan, make_spec, run_plan
    from vf.evaluate import open_run, resolve_config

    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "vf.bench.stub_server", str(port)], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert server.stdout.readline().strip() == "ready"
        url = f"http://127.0.0.1:{port}/v1"
        out: dict[str, Any] = {}
        with tempfile.TemporaryDirectory() as tmp:
            for c in concurrency:
                hs, bs, rewards = [], [], []
                for rep in range(repeats + 1):  # rep 0 warms up both paths
                    over = {"taskset": {"id": taskset, "size": episodes}, "model": "stub",
                            "engine": {"base_url": url}, "select": {"limit": episodes}, "num_rollouts": 1,
                            "max_concurrent": c, "sampling": {"max_tokens": 64}}
                    config = resolve_config({"command": "eval"}, over)
                    # -- the vf-eval path (execute() minus its progress display)
                    t = time.perf_counter()
                    config, run, _, _ = open_run(config, over, f"{tmp}/run-{c}-{rep}", None)
                    loaded = load_taskset(taskset, config.taskset)
                    plan = make_plan(loaded, config)
                    engine = make_engine(config)
                    spec = make_spec(engine, loaded, config, {"type": "eval", "id": "bench", "name": "bench"})
                    eps = []

                    async def on_episode(ep, run=run, eps=eps):
                        await run.commit(ep)
                        eps.append(ep)

                    async def go(plan=plan, spec=spec, engine=engine, on_episode=on_episode, c=c):
                        try:
                            await run_plan(plan.owed, spec, c, on_episode)
                        finally:
                            await engine.close()

                    asyncio.run(go())
                    harness_s = time.perf_counter() - t
                    assert len(eps) == episodes and all(e.ok for e in eps), "harness episodes failed"
                    rewards.append(sum(e.reward for e in eps) / len(eps))
                    # -- bare engine calls: the same requests
                    requests = [GenerateRequest(messages=task.messages(), sampling=spec.sampling, model="stub")
                                for task, _ in plan.owed]
                    engine = make_engine(config)

                    async def bare(engine=engine, requests=requests, c=c):
                        sem = asyncio.Semaphore(c)

                        async def one(r):
                            async with sem:
                                return await engine.generate(r)
                        try:
                            return await asyncio.gather(*[one(r) for r in requests])
                        finally:
                            await engine.close()

                    t = time.perf_counter()
                    results = asyncio.run(bare())
                    bare_s = time.perf_counter() - t
                    assert len(results) == episodes
                    if rep > 0:
                        hs.append(harness_s)
                        bs.append(bare_s)
                h, b = statistics.median(hs), statistics.median(bs)
                out[str(c)] = {"harness": {"episodes_per_s": round(episodes / h, 1), "seconds": round(h, 3),
                                           "ms_per_episode": round(1000 * h / episodes, 3),
                                           "mean_reward": round(rewards[-1], 3)},
                               "bare": {"calls_per_s": round(episodes / b, 1), "seconds": round(b, 3),
                                        "ms_per_call": round(1000 * b / episodes, 3)}}
        return out
    finally:
        server.terminate()
        server.wait(timeout=10)


def run(size: str = "full", **_: Any) -> dict[str, Any]:
    t0 = time.perf_counter()
    cfg = {**SIZES[size], "size": size}
    res = run_child("vf.bench.harness:measure", {k: cfg[k] for k in ("taskset", "episodes", "concurrency", "repeats")})
    cases = []
    for c in cfg["concurrency"]:
        h, b = res[str(c)]["harness"], res[str(c)]["bare"]
        h["overhead_ms_per_episode"] = round(h["ms_per_episode"] - b["ms_per_call"], 3)
        cases.append(Case(name=f"concurrency {c}", ours=h, ref=b, ours_label="vf-eval harness",
                          ref_label="bare engine calls",
                          ratios={"vs_bare": Ratio(ratio(h["episodes_per_s"], b["calls_per_s"]), "higher")}))
    notes = [(f"{cfg['episodes']} single-turn {cfg['taskset']} episodes against a zero-latency stdlib server; the "
              "harness side includes taskset load, run-dir writes and scoring")]
    peer = run_child("vf.bench.harness_peer:measure", cfg["peer"], timeout=4 * cfg["peer"]["peer_timeout"])
    p = cfg["peer"]
    for case, title in (("plain", "vs verifiers 0.4.0"), ("mcp", "vs verifiers 0.4.0, MCP tools")):
        r = peer[case]
        ref = r.get("peer") or {"skipped": r.get("skipped")}
        value = ratio(ref.get("ms_per_episode"), r["ours"]["ms_per_episode"])
        target = PEER_TARGET if value is not None else None  # a skipped peer is not a missed target
        cases.append(Case(name=f"{title} (-r {p['rollouts']} -c {p['concurrency']})", ours=r["ours"], ref=ref,
                          ours_label="vf-eval", ref_label="verifiers 0.4.0 vf-eval",
                          ratios={"vs_verifiers": Ratio(round(value, 1) if value else None, "higher", target)},
                          note=f"skipped: {r['skipped']}" if r.get("skipped") else ""))
        if r.get("skipped"):
            notes.append(f"{title}: reference skipped: {r['skipped']}")
    notes.append(f"peer cases: {p['tasks']} tasks x {p['rollouts']} rollouts at concurrency {p['concurrency']}; "
                 "ms_per_episode = (last episode end - first start) / episodes from each side's traces; "
                 "verifiers runs its null harness with the subprocess runtime, its MCP toolset as a server per "
                 "rollout; vf calls the toolset in-process")
    cases += program_cases(cfg["program"], notes)
    return suite_result("harness", cfg, cases, notes=notes, wall_s=round(time.perf_counter() - t0, 1))


def program_cases(p: dict[str, Any], notes: list[str]) -> list[Case]:
    """The program-harness cases (`vf.bench.harness_program`): vf vs the bare agent program, and vf
    vs verifiers 0.4.0's `bash` harness, per episode and as whole 30-episode processes."""
    res = run_child("vf.bench.harness_program:measure", p, timeout=6 * p["peer_timeout"])
    ours, bare = dict(res["ours"]), res["bare"]
    flags = f"-n {p['tasks']} -r {p['rollouts']} -c {p['concurrency']}"
    ours["overhead_ms_per_episode"] = round(ours["ms_per_episode"] - bare["ms_per_episode"], 3)
    checks = {"no_torch": res["no_torch"]}
    cases = [Case(name=f"program harness vs the bare program ({flags})", ours=ours, ref=bare,
                  ours_label="vf-eval, BenchAgent in the sandbox runtime", ref_label="the agent program alone",
                  ratios={"vs_bare": Ratio(ratio(bare["ms_per_episode"], ours["ms_per_episode"]), "higher")},
                  checks=checks)]
    peer = dict(res.get("peer") or {"skipped": res.get("skipped")})
    if res.get("peer"):
        peer["overhead_ms_per_episode"] = round(peer["ms_per_episode"] - bare["ms_per_episode"], 3)
    per_episode = ratio(peer.get("ms_per_episode"), ours["ms_per_episode"])
    process = ratio(peer.get("command_wall_s"), ours["command_wall_s"])
    target = PEER_TARGET if per_episode is not None else None  # a skipped peer is not a missed target
    cases.append(Case(name=f"program harness vs verifiers 0.4.0 bash ({flags})", ours=ours, ref=peer,
                      ours_label="vf-eval", ref_label="verifiers 0.4.0 vf-eval, bash harness, subprocess runtime",
                      ratios={"vs_verifiers": Ratio(round(per_episode, 1) if per_episode else None, "higher", target),
                              "vs_verifiers_process": Ratio(round(process, 1) if process else None, "higher", target)},
                      checks=checks, note=f"skipped: {res['skipped']}" if res.get("skipped") else ""))
    if res.get("skipped"):
        notes.append(f"program harness vs verifiers: reference skipped: {res['skipped']}")
    if res.get("torch_lines"):
        notes.append(f"vf-eval imported torch: {res['torch_lines']}")
    notes.append(f"program cases: {p['tasks'] * p['rollouts']} episodes ({flags}), each a real agent program "
                 "(two model calls through the interception server, one shell command); vs_verifiers = per-episode "
                 "wall time from traces (start-up excluded), vs_verifiers_process = whole vf-eval process wall "
                 "time (start-up included); overhead = ms_per_episode - the bare program's")
    return cases
