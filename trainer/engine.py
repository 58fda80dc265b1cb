"""Which engine produces the rollouts (and evaluations) of a training run, and how weights reach it.

- Embedded (default): `vf.engines.local.LocalEngine` over its *own copy* of the native model (the
  trainer keeps changing its weights while the next batch is generated). Weights arrive
  in-process (`weights.EmbeddedPush` → `LocalEngine.update_weights`). Each rollout samples with
  its own seed (a per-request generator), so its tokens depend only on (weights, prompt, seed).
- Server (`engine.base_url` set): the OpenAI-compatible client; weights arrive as HF checkpoint
  files + an HTTP reload (`weights.HttpPush`). Evaluations go through the same server
  (`server_for_eval`), after the weights to evaluate were pushed.
"""

from __future__ import annotations

from pathlib import Path


def embedded(model_path: Path, tokenizer, dtype: str = "float32", device: str = "cpu", max_batch: int = 64,
             impl: str = "auto"):
    import torch
    from vf.models import load_model

    model = load_model(model_path, dtype=getattr(torch, dtype), device=device, impl=impl)
    for p in model.parameters():
        p.requires_grad_(False)
    from vf.engines.local import LocalEngine

    return LocalEngine(model, tokenizer, max_batch=max_batch, model_name=str(model_path), path=Path(model_path))


def server(config):
    from vf.engines import create_engine

    e = config.engine
    return create_engine("openai", base_url=e.base_url, model=config.model.path, api_key_var=e.api_key_var,
                         timeout=e.timeout, max_retries=e.max_retries, max_connections=64)


class ServerEvalEngine:
    """The openai engine for the trainer's evaluations, which run each evaluation in its own
    `asyncio.run()`: an httpx client's pooled connections belong to the event loop that opened
    them (reusing or closing them from a later loop raises "Event loop is closed"), so a client is
    opened on first use and closed, on the same loop, when its last call in flight returns."""

    name = "openai"
    supports_tokens = True

    def __init__(self, config):
        self.config = config
        self._engine = None
        self._busy = 0

    async def generate(self, request):
        if self._engine is None:
            self._engine = server(self.config)
        engine = self._engine
        self._busy += 1
        try:
            return await engine.generate(request)
        finally:
            self._busy -= 1
            if self._busy == 0:  # the loop may end after this call: do not keep its connections
                self._engine = None
                await engine.close()

    async def close(self) -> None:
        pass  # nothing outlives a batch of calls


def server_for_eval(config) -> ServerEvalEngine:
    return ServerEvalEngine(config)
