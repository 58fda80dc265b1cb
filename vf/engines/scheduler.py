"""Continuous batching: one background thread runs prefill + decode steps over every active sequence.

Contract:
    Scheduler(model, max_batch, max_len, eos_ids, decode_tail).submit(seq) -> None   (thread-safe)
    Each Seq gets `done(seq)` called from the scheduler thread when it finishes (or fails:
    seq.error set). `on_token(token_id, logprob)` (optional) is called per sampled token.
    `lock` is held for each step; weight updates take it so they land between decode steps: a
    sequence in flight keeps its KV cache and samples its next tokens from the new weights. Each
    Seq records the version at admission (`policy_version`) and at its last token
    (`policy_version_end`), so a reply that spans an update says so. With `router_replay` each
    Seq also gets `routed_experts` per sampled token (`vf.models.moe.RoutingRecorder`).

One iteration: admit waiting sequences into free rows (up to max_batch) and prefill them as one
right-padded block (their first token is sampled from the prefill logits); then one decode step
for all active rows (a [n, 1] forward). Finished rows are freed at once (compaction), so a new
request waits at most one step to join. Python work per step is O(rows): one `.tolist()` of the
sampled tokens and log-probs plus bookkeeping; stop strings decode only a short token tail.

Threads: the engine thread sets its own intra-op thread count (`threads`; None = `auto_threads`).
A decode step of a small model is ~60 ops of microseconds each; with two OpenMP threads every op
that forks (matmul, attention) ends in a barrier, and on a busy machine the second thread is often
descheduled, so the barrier waits a scheduler time slice. Measured on the 2-core dev box (tiny
model, docs: benchmarks/RESULTS.md "Embedded engine batch decode"): one thread made a batch-16
decode step several times faster under load. OpenMP's and MKL's thread counts are per thread, so
`torch.set_num_threads` in the engine thread leaves the trainer's (or any caller's) count alone.
Above SMALL_MODEL_PARAMS no fixed count is right: on the same 2-vCPU box a 126M-parameter decode
step at batch 16 took 150 ms with 1 thread against 200–720 ms with 2 at load average 5, while an
idle machine favours 2. So a bigger CPU model gets a `ThreadTuner`: it times decode steps with each
candidate count in turn (alternating, so both see the same load), keeps the faster per row, and
probes again every `hold` steps as the machine's load moves.
"""

from __future__ import annotations

import collections
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from vf.engines.kv import SlotKVCache
from vf.engines.sampler import make_params, sample

# padded-token budget of one prefill block (rows x longest prompt); bigger groups are split
PREFILL_TOKENS = 8192
# below this many parameters a decode step's ops are too small to gain from a second thread
SMALL_MODEL_PARAMS = 50_000_000


def auto_threads(model) -> int | None:
    """Intra-op threads for the engine thread: 1 for a small model on CPU, else None (torch's default
    count on GPU; tuned per decode step by `ThreadTuner` on CPU)."""
    p = next(model.parameters())
    if p.device.type != "cpu":
        return None
    return 1 if sum(x.numel() for x in model.parameters()) < SMALL_MODEL_PARAMS else None


class ThreadTuner:
    """Picks the engine thread's intra-op thread count from timed decode steps.

        t = tuner.next()            # the count for the next step
        tuner.record(t, seconds, rows)
    Probing: the candidates take turns step by step until each has `probe` timings; the one with the
    lowest median seconds per row wins and runs the next `hold` steps, then it probes again. The
    count in use (at first the last choice, all threads) is only replaced by one at least `margin`
    faster: on a quiet 2-vCPU VM single steps of a 126M model vary by ±30% from step to step, and
    without the margin three noisy timings each sent a 64-row decode to 1 thread, 1.25-1.4x slower
    there; a loaded machine, where 1 thread wins, makes 2 threads 1.3-5x slower, well past it."""

    def __init__(self, choices: list[int], probe: int = 3, hold: int = 96, margin: float = 0.15):
        self.choices, self.probe, self.hold, self.margin = list(choices), probe, hold, margin
        self.times: dict[int, list[float]] = {c: [] for c in self.choices}
        self.best = self.choices[-1]
        self.left = 0  # steps before the next probe round

    def next(self) -> int:
        if self.left > 0:
            return self.best
        return min(self.choices, key=lambda c: len(self.times[c]))

    def record(self, threads: int, seconds: float, rows: int) -> None:
        if self.left > 0:
            self.left -= 1
            return
        self.times[threads].append(seconds / max(1, rows))
        if all(len(t) >= self.probe for t in self.times.values()):
            median = {c: sorted(t)[len(t) // 2] for c, t in self.times.items()}
            fastest = min(self.choices, key=median.__getitem__)
            if median[fastest] < (1 - self.margin) * median[self.best]:
                self.best = fastest
            self.times = {c: [] for c in self.choices}
            self.left = self.hold


@dataclass
class Seq:
    prompt_ids: list[int]
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    min_tokens: int = 0
    on_token: Callable[[int, float], None] | None = None
    done: Callable[[Seq], None] | None = None
    # filled in by the scheduler
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str | None = None  # stop | length | abort
    stop_reason: Any = None  # the stop string or token id that ended it
    policy_version: int | None = None  # the version that processed the prompt (admission)
    policy_version_end: int | None = None  # the version that sampled the last token
    error: BaseException | None = None
    cancelled: bool = False
    generator: torch.Generator | None = None
    mm: dict | None = None  # a VL model's image inputs for the prompt (pixel_values, image_grid_thw, rope_delta)
    # router replay (MoE): per sampled token, [L][k] expert ids of the forward that produced it
    routed_experts: list[list[list[int]]] = field(default_factory=list)


class Scheduler:
    def __init__(self, model, max_batch: int, max_len: int, eos_ids: set[int],
                 decode_tail: Callable[[list[int]], str], version: Callable[[], int], fast_decode: bool = True,
                 router_replay: bool = False, threads: int | None = None):
        self.model = model
        self.max_batch, self.max_len = max_batch, max_len
        self.eos_ids = set(eos_ids)
        self.decode_tail = decode_tail
        self.version = version
        cfg = model.config
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype
        streams = model.kv_streams() if hasattr(model, "kv_streams") else None
        kinds = model.cache_kinds() if hasattr(model, "cache_kinds") else None  # hybrids: kv / state / none
        self.cache = SlotKVCache(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, max_batch, max_len,
                                 p.dtype, p.device, streams=streams,
                                 kv_layers=None if kinds is None else [i for i, k in enumerate(kinds) if k == "kv"],
                                 state_shapes=model.state_shapes() if kinds is not None else None)
        self.lock = threading.RLock()
        from vf.engines.fastpath import FastDecoder

        self.multimodal = bool(getattr(model, "is_multimodal", False))
        self.fast = FastDecoder(model, self.cache) if fast_decode and FastDecoder.supports(model) else None
        from vf.models.moe import RoutingRecorder

        self.routing = RoutingRecorder(model) if router_replay else None  # fills Seq.routed_experts
        self.refresh_head()
        self._cv = threading.Condition()
        self._waiting: collections.deque[Seq] = collections.deque()
        self.rows: list[Seq] = []  # row i of the cache
        self.pos = torch.zeros(max_batch, dtype=torch.int64, device=self.device)  # tokens stored per row
        self.last = torch.zeros(max_batch, dtype=torch.int64, device=self.device)  # sampled, not yet stored
        # VL models: rotary position = stored position + this row's rope delta (0 for text-only prompts)
        self.delta = torch.zeros(max_batch, dtype=torch.int64, device=self.device)
        self._params = None
        self._gen = torch.Generator(device="cpu")
        self._gen.seed()
        self._stopped = False
        self.steps = 0
        self.prefill_s = 0.0  # wall seconds spent in prefill blocks (benchmarks split prefill from decode)
        self.peak_rows = 0  # most rows decoded together so far (observability, tests)
        self.threads = threads if threads else auto_threads(model)
        default = torch.get_num_threads()
        # a bigger CPU model: 1 thread or all of them, whichever decodes faster now (see the module doc)
        self.tuner = ThreadTuner([1, default]) if (not self.threads and self.device.type == "cpu"
                                                   and default > 1) else None
        self._threads_set = threading.Event()
        self._thread = threading.Thread(target=self._run, name="vf-local-engine", daemon=True)
        creator_threads = torch.get_num_threads()  # also pins the creating thread's own count
        self._thread.start()
        if self.threads:
            self._threads_set.wait(timeout=10)
            # torch also keeps a process-wide default that threads started later copy: restore it
            torch.set_num_threads(creator_threads)

    def refresh_head(self) -> None:
        """Set up the LM head (`self.head(hidden) -> logits`) and rebuild the fast decoder's derived
        weights. Called after every weight update. The fast decoder's oneDNN linear reads the [V, H]
        weight as it is; else the head is pre-transposed ([H, V], contiguous: one plain matmul, and
        a copy of the head's weights)."""
        with self.lock:
            w = self.model.lm_head_weight.detach()
            if self.fast is not None and self.fast.linear is not torch.nn.functional.linear:
                lin = self.fast.linear
                self.head = lambda h: lin(h, w)
            else:
                head_t = w.t().contiguous()
                self.head = lambda h: h @ head_t
            if self.fast is not None:
                self.fast.refresh()

    # -- public ------------------------------------------------------------------------------
    def submit(self, seq: Seq) -> None:
        with self._cv:
            if self._stopped:
                raise RuntimeError("engine is closed")
            self._waiting.append(seq)
            self._cv.notify()

    @property
    def load(self) -> int:
        return len(self.rows) + len(self._waiting)

    def stop(self) -> None:
        with self._cv:
            self._stopped = True
            self._cv.notify()
        self._thread.join(timeout=10)

    # -- loop --------------------------------------------------------------------------------
    def _run(self) -> None:
        torch.set_grad_enabled(False)
        if self.threads:
            torch.set_num_threads(self.threads)  # this thread's OpenMP/MKL count (see the module doc)
        self.threads_in_use = torch.get_num_threads()
        self._threads_set.set()
        while True:
            with self._cv:
                while not self._stopped and not self._waiting and not self.rows:
                    self._cv.wait()
                if self._stopped:
                    break
                free = self.max_batch - len(self.rows)
                new = [self._waiting.popleft() for _ in range(min(free, len(self._waiting)))]
            try:
                with self.lock, torch.inference_mode():
                    new = [s for s in new if not s.cancelled]
                    if new:
                        t = time.perf_counter()
                        self._prefill(new)
                        self.prefill_s += time.perf_counter() - t
                    if self.rows:
                        self._decode()
            except Exception as e:  # noqa: BLE001 (a bug or OOM: fail what is in flight, keep serving)
                traceback.print_exc()
                for s in self.rows + new:
                    if s.finish_reason is None:
                        s.error = e
                        self._finish(s, "abort")
                self.rows = []
                self._params = None
        with self._cv:
            left = list(self._waiting) + self.rows
            self._waiting.clear()
        for s in left:
            s.error = RuntimeError("engine closed")
            self._finish(s, "abort")

    def _prefill(self, new: list[Seq]) -> None:
        new.sort(key=lambda s: len(s.prompt_ids))  # similar lengths per block, less padding
        i = 0
        while i < len(new):
            j = i + 1
            while j < len(new) and (j + 1 - i) * len(new[j].prompt_ids) <= PREFILL_TOKENS:
                j += 1
            self._prefill_block(new[i:j])
            i = j

    def _prefill_block(self, block: list[Seq]) -> None:
        start, m = len(self.rows), len(block)
        T = max(len(s.prompt_ids) for s in block)
        ids = torch.zeros(m, T, dtype=torch.int64)
        for r, s in enumerate(block):
            ids[r, : len(s.prompt_ids)] = torch.tensor(s.prompt_ids, dtype=torch.int64)
            s.policy_version = self.version()
            if s.seed is not None:
                s.generator = torch.Generator(device="cpu").manual_seed(int(s.seed))
        ids = ids.to(self.device)
        lens = torch.tensor([len(s.prompt_ids) for s in block], device=self.device)
        mm = [s.mm for s in block if s.mm]
        self.delta[start:start + m] = torch.tensor([int((s.mm or {}).get("rope_delta", 0)) for s in block])
        if self.fast is not None and not self.multimodal and self.routing is None:
            last_h = self.fast.prefill(ids, lens, start)  # [m, H]
        else:  # the module forward: images, M-RoPE positions, router replay's per-position routes
            extra = {} if not mm else {"pixel_values": torch.cat([x["pixel_values"] for x in mm]),
                                       "image_grid_thw": torch.cat([x["image_grid_thw"] for x in mm])}
            positions = torch.arange(T, device=self.device).expand(m, T)
            self.cache.begin_prefill(start, m, T, lens)
            hidden = self.model(ids, positions, self.cache, **extra)  # [m, T, H]
            self.cache.advance(T)
            last_h = hidden[torch.arange(m, device=self.device), lens - 1]  # [m, H]
        for s in block:
            s.mm = None  # the pixels are in the KV cache now
        logits = self.head(last_h)
        self.rows.extend(block)
        self.peak_rows = max(self.peak_rows, len(self.rows))
        self.pos[start : start + m] = lens
        self._params = None
        self._sample_and_update(logits, start, block)

    def _decode(self) -> None:
        if self.tuner is None:
            return self._decode_step()
        threads = self.tuner.next()
        if threads != self.threads_in_use:
            torch.set_num_threads(threads)
            self.threads_in_use = threads
        t = time.perf_counter()
        n = len(self.rows)
        self._decode_step()
        self.tuner.record(threads, time.perf_counter() - t, n)

    def _decode_step(self) -> None:
        n = len(self.rows)
        pos = self.pos[:n]
        rope_pos = pos + self.delta[:n] if self.multimodal else pos
        if self.fast is not None:
            hidden = self.fast.forward(self.last[:n], pos, rope_pos)  # [n, H]
        else:
            self.cache.begin_decode(n, pos)
            hidden = self.model(self.last[:n, None], rope_pos[:, None], self.cache)[:, 0]  # [n, H]
            self.cache.advance(1)
        self.pos[:n] += 1
        self.steps += 1
        self._sample_and_update(self.head(hidden), 0, self.rows)

    def _sample_and_update(self, logits: torch.Tensor, start: int, seqs: list[Seq]) -> None:
        """Sample one token for rows start..start+len(seqs)-1, record it, free finished rows."""
        k = len(seqs)
        if self._params is None or self._params[0] != (start, k, len(self.rows)):
            params = make_params([s.temperature for s in seqs], [s.top_k for s in seqs],
                                 [s.top_p for s in seqs], [s.min_p for s in seqs], device=self.device)
            if start == 0 and k == len(self.rows):
                self._params = ((start, k, len(self.rows)), params)
        else:
            params = self._params[1]
        if params.all_greedy:
            uniforms = torch.zeros(k, device=self.device)
        else:
            u = torch.rand(k, generator=self._gen)
            for r, s in enumerate(seqs):
                if s.generator is not None:
                    u[r] = torch.rand((), generator=s.generator)
            uniforms = u.to(self.device)
        tokens, logprobs = sample(logits, params, uniforms)
        self.last[start : start + k] = tokens
        toks, lps = tokens.tolist(), logprobs.tolist()
        routes = self.routing.take(seqs) if self.routing is not None else None
        finished: list[int] = []
        for r, s in enumerate(seqs):
            tok = toks[r]
            if routes is not None:
                s.routed_experts.append(routes[r])
            s.token_ids.append(tok)
            s.logprobs.append(lps[r])
            if s.on_token is not None:
                s.on_token(tok, lps[r])
            reason = self._check_stop(s, tok)
            if reason is not None:
                s.finish_reason = reason
                s.policy_version_end = self.version()  # under self.lock: no update mid-step
                finished.append(start + r)
        if finished:
            self._free(finished)

    def _check_stop(self, s: Seq, tok: int) -> str | None:
        if s.cancelled:
            return "abort"
        n = len(s.token_ids)
        if n >= s.min_tokens:
            if (tok in self.eos_ids and not s.ignore_eos) or tok in s.stop_token_ids:
                s.stop_reason = tok
                return "stop"
            if s.stop:
                tail = self.decode_tail(s.token_ids[-(max(len(x) for x in s.stop) + 4):])
                for x in s.stop:
                    if x in tail:
                        s.stop_reason = x
                        return "stop"
        if n >= s.max_tokens:
            return "length"
        return None

    def _free(self, finished: list[int]) -> None:
        for row in sorted(finished, reverse=True):
            seq = self.rows[row]
            last = len(self.rows) - 1
            if row != last:
                moved = self.rows[last]
                self.cache.move(last, row, int(self.pos[last]))
                self.rows[row] = moved
                self.pos[row] = self.pos[last]
                self.last[row] = self.last[last]
                self.delta[row] = self.delta[last]
            self.rows.pop()
            self._finish(seq, seq.finish_reason)
        self._params = None

    def _finish(self, seq: Seq, reason: str) -> None:
        seq.finish_reason = reason
        if seq.done is not None:
            try:
                seq.done(seq)
            except Exception:  # noqa: BLE001, S110 (a closed event loop must not kill the engine thread)
                pass
