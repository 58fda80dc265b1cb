"""Engines: where model replies come from. See `base.py` for the interface."""

from vf.engines.base import Engine, GenerateRequest, GenerateResult, Sampling, Usage

__all__ = ["Engine", "GenerateRequest", "GenerateResult", "Sampling", "Usage", "create_engine"]


def create_engine(type: str, **kwargs) -> Engine:
    """Build an engine by type name. Heavy imports (torch, vllm) happen only here."""
    if type == "openai":
        from vf.engines.openai_client import OpenAIEngine

        return OpenAIEngine(**kwargs)
    if type == "local":
        from vf.engines.local import LocalEngine

        return LocalEngine.from_model(**kwargs)
    if type == "vllm":
        from vf.engines.vllm_engine import VLLMEngine

        return VLLMEngine(**kwargs)
    from vf.errors import UsageError

    raise UsageError(f"unknown engine type {type!r}", hint="use one of: local, openai, vllm")
