"""vf's vLLM plugin: registers the `vf_safetensors` weight-transfer backend inside vLLM.

vLLM loads every `vllm.general_plugins` entry point in each of its processes (API server, engine
core, workers) before it builds the model (`vllm.plugins.load_general_plugins`); ours is
declared in pyproject.toml (`vf = "vf.engines.vllm_plugin:register"`), so a vLLM installed in the
same environment as vf finds the backend with no patch to vLLM. Registration is by module path
(`WeightTransferEngineFactory.register_engine(name, module, class)`), so nothing heavy is imported
until a server is started with `--weight-transfer-config '{"backend": "vf_safetensors"}'`.
The function may run several times per process (vLLM's own warning): a repeat is a no-op.
"""

from __future__ import annotations

BACKEND = "vf_safetensors"


def register() -> None:
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    try:
        WeightTransferEngineFactory.register_engine(BACKEND, "vf.engines.vllm_transfer",
                                                    "SafetensorsWeightTransferEngine")
    except ValueError:  # already registered in this process
        pass
