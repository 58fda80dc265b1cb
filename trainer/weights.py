"""Getting new weights to the inference engine.

- Embedded engine (in-process): `EmbeddedPush.push(state, version)` copies the full state dict
  into the engine's own copy of the model (`engine.update_weights(state, version)`); drift noise,
  if configured, is applied to that copy only.
- Servers (`vf-serve`, vLLM): `HttpPush.push(state, version)` writes an HF checkpoint
  `RUN/broadcasts/step_N/` (config.json + safetensors; tmp dir + rename so a reader never sees a
  half-written one) and POSTs `{"path", "version"}` to `BASE/v1/load_weights`, with the engine's
  API key (`Authorization: Bearer $api_key_var`, like the rollout requests); older broadcast
  dirs are removed. Pushing the version the server already holds is a no-op: within one run a
  version names one set of weights, and both the orchestrator (before each batch) and the
  trainer's evaluations push through the same HttpPush, from different threads (hence the lock).
"""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

from vf.trainer.drift import perturb

from vf.errors import EngineError


class EmbeddedPush:
    def __init__(self, engine, noise: float = 0.0, seed: int = 0):
        self.engine, self.noise, self.seed = engine, noise, seed

    def push(self, state: dict, version: int) -> None:
        self.engine.update_weights(perturb(state, self.noise, self.seed, version), version)


class HttpPush:
    def __init__(self, base_url: str, run_dir: Path, model_config, keep: int = 2, timeout: float = 300.0,
                 api_key_var: str | None = "OPENAI_API_KEY"):
        root = base_url.rstrip("/")
        self.url = (root.removesuffix("/v1")) + "/v1/load_weights"
        self.dir = Path(run_dir) / "broadcasts"
        self.model_config, self.keep, self.timeout = model_config, keep, timeout
        # the same key the rollout client sends: a server started with an API key (vf-serve
        # --api-key, vllm --api-key) refuses an unauthenticated reload with 401
        self.key_var = api_key_var
        key = os.environ.get(api_key_var) if api_key_var else None
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.loaded: int | None = None
        """The version the server holds after our last successful push."""
        self.pushes = 0
        self._lock = threading.Lock()

    def push(self, state: dict, version: int) -> None:
        with self._lock:
            if version == self.loaded:
                return
            self._push(state, version)
            self.loaded = version
            self.pushes += 1

    def _push(self, state: dict, version: int) -> None:
        import httpx
        from vf.models import build_model, save_hf

        target = self.dir / f"step_{version}"
        tmp = self.dir / f".step_{version}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        model = build_model(self.model_config)
        model.load_state_dict(state)
        save_hf(model, tmp)
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)
        try:
            r = httpx.post(self.url, json={"path": str(target.resolve()), "version": version},
                           headers=self.headers, timeout=self.timeout)
        except httpx.HTTPError as e:
            raise EngineError(f"weight reload at {self.url} failed: {e}", type="WeightReload") from None
        if r.status_code >= 400:
            e = EngineError(f"weight reload at {self.url} answered {r.status_code}: {r.text[:200]}",
                            type="WeightReload", status_code=r.status_code)
            if r.status_code in (401, 403):
                e.hint = f"put the server's API key in ${self.key_var} (or name another variable with --engine.api-key-var)"
            raise e
        old = sorted(self.dir.glob("step_*"), key=lambda p: int(p.name.split("_")[1]))
        for p in old[: -self.keep]:
            shutil.rmtree(p, ignore_errors=True)
