"""Getting new weights to the inference engine: one interface, `push(state, version)`, three paths.

- Embedded engine (in-process): `EmbeddedPush` copies the full state dict into the engine's own
  copy of the model (`engine.update_weights(state, version)`); drift noise, if configured, is
  applied to that copy only.
- `vf-serve` (HTTP): `HttpPush` writes an HF checkpoint and POSTs `{"path", "version"}` to
  `BASE/v1/load_weights`, with the engine's API key (`Authorization: Bearer $api_key_var`).
- vLLM servers (`--engine.type vllm`): `VLLMPush` writes the same HF checkpoint and has every
  server load it through vLLM's RL routes with our `vf_safetensors` backend
  (`VLLMEngine.load_weights`: pause(keep) → start → update → finish(version) → resume, so requests
  in flight survive). On GPUs `NcclPush` uses vLLM's own `nccl` backend instead (no files).

Checkpoints go to `RUN/broadcasts/step_N/` (config.json + safetensors; tmp dir + rename so a
reader never sees a half-written one); older ones are removed, the newest `keep` stay (a restarted
vLLM server reloads the newest). Pushing the version the engine already holds is a no-op: within
one run a version names one set of weights, and the orchestrator and the trainer's evaluations
push through the same pusher from different threads (hence the lock). `seconds` is the wall time of
the last push (logged as `weight_sync_time`), `pushes` their count.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

from vf.trainer.drift import perturb

from vf.errors import EngineError


class EmbeddedPush:
    def __init__(self, engine, noise: float = 0.0, seed: int = 0):
        self.engine, self.noise, self.seed = engine, noise, seed
        self.seconds, self.pushes = 0.0, 0

    def push(self, state: dict, version: int) -> None:
        t0 = time.perf_counter()
        self.engine.update_weights(perturb(state, self.noise, self.seed, version), version)
        self.seconds, self.pushes = time.perf_counter() - t0, self.pushes + 1


class _Versioned:
    """Skip a version the engine already holds; time each push; one push at a time."""

    def __init__(self):
        self.loaded: int | None = None
        """The version the engine holds after our last successful push."""
        self.pushes = 0
        self.seconds = 0.0
        self._lock = threading.Lock()

    def push(self, state: dict, version: int) -> None:
        with self._lock:
            if version == self.loaded:
                return
            t0 = time.perf_counter()
            self._push(state, version)
            self.seconds = time.perf_counter() - t0
            self.loaded = version
            self.pushes += 1

    def _push(self, state: dict, version: int) -> None:
        raise NotImplementedError

    def metrics(self) -> dict[str, float]:
        """Per-step numbers for metrics.jsonl: the last push's seconds."""
        return {"weight_sync_time": self.seconds}

    def close(self) -> None:
        pass


class _ToVLLM(_Versioned):
    """Pushers into a `VLLMEngine` fleet; they own it (`close()` stops the servers it started)."""

    engine = None

    def metrics(self) -> dict[str, float]:
        servers = self.engine.servers
        return {**super().metrics(), "vllm_servers_healthy": sum(s.healthy for s in servers),
                "vllm_restarts": sum(s.restarts for s in servers)}

    def close(self) -> None:
        self.engine.shutdown()


class CheckpointFiles:
    """`RUN/broadcasts/step_N/`: HF checkpoints of pushed versions, the newest `keep` kept."""

    def __init__(self, run_dir: Path, model_config, keep: int = 2):
        self.dir = Path(run_dir) / "broadcasts"
        self.model_config, self.keep = model_config, keep

    def write(self, state: dict, version: int) -> Path:
        from vf.models import build_model, save_hf

        target = self.dir / f"step_{version}"
        tmp = self.dir / f".step_{version}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        model = build_model(self.model_config)
        model.load_state_dict(state)
        save_hf(model, tmp)
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)
        return target.resolve()

    def prune(self) -> None:
        old = sorted(self.dir.glob("step_*"), key=lambda p: int(p.name.split("_")[1]))
        for p in old[: -self.keep]:
            shutil.rmtree(p, ignore_errors=True)


class HttpPush(_Versioned):
    def __init__(self, base_url: str, run_dir: Path, model_config, keep: int = 2, timeout: float = 300.0,
                 api_key_var: str | None = "OPENAI_API_KEY"):
        super().__init__()
        root = base_url.rstrip("/")
        self.url = (root.removesuffix("/v1")) + "/v1/load_weights"
        self.files = CheckpointFiles(run_dir, model_config, keep)
        self.timeout = timeout
        # the same key the rollout client sends: a server started with an API key (vf-serve
        # --api-key) refuses an unauthenticated reload with 401
        self.key_var = api_key_var
        key = os.environ.get(api_key_var) if api_key_var else None
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}

    def _push(self, state: dict, version: int) -> None:
        import httpx

        target = self.files.write(state, version)
        try:
            r = httpx.post(self.url, json={"path": str(target), "version": version},
                           headers=self.headers, timeout=self.timeout)
        except httpx.HTTPError as e:
            raise EngineError(f"weight reload at {self.url} failed: {e}", type="WeightReload") from None
        if r.status_code >= 400:
            e = EngineError(f"weight reload at {self.url} answered {r.status_code}: {r.text[:200]}",
                            type="WeightReload", status_code=r.status_code)
            if r.status_code in (401, 403):
                e.hint = f"put the server's API key in ${self.key_var} (or name another variable with --engine.api-key-var)"
            raise e
        self.files.prune()


class VLLMPush(_ToVLLM):
    """Weights to vLLM servers through our `vf_safetensors` backend (the trainer and the servers
    share a filesystem: the same machine, or RUN on a shared mount)."""

    def __init__(self, engine, run_dir: Path, model_config, keep: int = 2):
        super().__init__()
        self.engine = engine
        self.files = CheckpointFiles(run_dir, model_config, keep)

    def _push(self, state: dict, version: int) -> None:
        target = self.files.write(state, version)
        self.engine.load_weights(str(target), version)
        self.files.prune()


class NcclPush(_ToVLLM):
    """GPU: vLLM's own `nccl` weight-transfer backend (trainer rank 0 → every inference worker,
    layer by layer from the live parameters; no files, no gather on one host's CPU). The servers
    must be started with `--weight-transfer-config '{"backend": "nccl"}'`.

    UNTESTED: written against vLLM 0.32's `NCCLTrainerWeightTransferEngine` API; this project's
    CI machines have no GPU. Imported lazily; needs vllm in the trainer's environment.
    """

    def __init__(self, engine, model_config, host: str = "127.0.0.1", port: int = 29501):
        super().__init__()
        from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource
        from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

        class HFSource(WeightSource):
            """The pushed state under HF names (vLLM's `load_weights` reads checkpoint names)."""

            def __init__(self):
                self.tensors: dict = {}

            def metadata(self):
                return [ParamMeta(n, t.dtype, tuple(t.shape)) for n, t in self.tensors.items()]

            def __iter__(self):
                return iter(self.tensors.items())

        self.engine, self.model_config, self.source = engine, model_config, HFSource()
        self.clients = [_RouteClient(engine, s) for s in engine.servers]
        self.transfers = []
        self._first = True
        self._init = [(c, NCCLTrainerInitInfo(master_address=host, master_port=port + i, rank=0,
                                              world_size=1 + c.world_size()))
                      for i, c in enumerate(self.clients)]
        self._factory = WeightTransferTrainerFactory

    def _push(self, state: dict, version: int) -> None:
        from vf.models.convert import native_to_hf

        self.source.tensors = native_to_hf(state, self.model_config)
        if not self.transfers:  # the rendezvous needs the metadata: on the first push
            self.transfers = [self._factory.trainer_init(info, client=c, source=self.source) for c, info in self._init]
        for c, t in zip(self.clients, self.transfers):
            c.version = version
            c.pause()
            try:
                t.send_weights()  # start → update (concurrent with the broadcast) → finish(version)
            finally:
                c.resume()


class _RouteClient:
    """vLLM's `VLLMWeightSyncClient` protocol over one server's HTTP RL routes (for `NcclPush`)."""

    def __init__(self, engine, server):
        self.engine, self.server, self.version = engine, server, None

    def world_size(self) -> int:
        import httpx

        return int(httpx.get(f"{self.server.url}/get_world_size", params={"include_dp": False},
                             timeout=30).json()["world_size"])

    def pause(self):
        self.engine._post(self.server, "/pause", params={"mode": "keep"})

    def resume(self):
        self.engine._post(self.server, "/resume")

    def init_weight_transfer_engine(self, init_info):
        self.engine._post(self.server, "/init_weight_transfer_engine", json={"init_info": init_info})

    def start_weight_update(self):
        self.engine._post(self.server, "/start_weight_update")

    def update_weights(self, update_info):
        self.engine._post(self.server, "/update_weights", json={"update_info": update_info})

    def finish_weight_update(self, weight_version=None):
        v = weight_version if weight_version is not None else self.version
        self.engine._post(self.server, "/finish_weight_update",
                          json={"weight_version": None if v is None else str(v)})
