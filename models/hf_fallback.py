"""Any causal LM that `transformers` implements, run through our trainer and embedded engine when
no native family exists for its `model_type` (`--model.impl auto|hf`).

    HFModel.load(path, dtype, device) -> HFModel      the NativeModel interface over AutoModelForCausalLM,
                                                      or a vision-language checkpoint's own
                                                      `…ForConditionalGeneration` class (text prompts)
      forward(input_ids [B,T], position_ids [B,T] | None, cache) -> hidden [B,T,H] (final norm applied)
      lm_head_weight [V, H];  config (a ModelConfig of the fields trainer and engine read);  save(path)

How it plugs in: the HF model's attention modules call the attention function registered here
under the name "vf" (transformers' `AttentionInterface`), which hands q/k/v (after the model's own
projections, norms and rotary) to the same seams the native layers use: `layers.sdpa` with a
`Documents` layout for packed training rows, or the embedded engine's KV cache
(`cache.attend(layer_idx, q, k, v)`) for prefill and decode — so generation runs on the engine's
cache, not a full recompute. transformers builds no mask for a custom attention function, so a mask
that reaches the seam is the model's own key selection (GLM-5-Next's DSA top-k): packed rows apply
it (kept causal and within documents), the engine's cache refuses the model (exit 2). The base model
returns the final-normed hidden states, so log-probs and losses go through our chunked/fused LM head
unchanged. A vision-language model's base model takes text-only ids like a causal LM's (its M-RoPE
positions are the text positions on all axes); image prompts are not served by the fallback.

What is slower than native: q/k/v and gate/up projections unfused, transformers' module overhead
per step, and no lean decode step in the engine (`FastDecoder`). Refused (exit 2): logit
soft-capping or scaling, an LM-head bias, attention soft-capping — our LM head and attention seam
do not apply them — and sliding-window attention over sequences longer than the window.

Never silently wrong: a model whose tokens also mix outside attention (recurrent DeltaNet or
Mamba layers, convolutions) would carry that state across packed documents and, in the engine,
lose it between decode steps (our cache holds only attention K/V). `load` probes for it — the
second of two packed documents must equal the same document run alone — and such a model runs
packed rows one document at a time (slower, exact) and refuses the engine's cache (exit 2:
generate with vLLM or a native family). A model the probe forward itself fails on is refused.
"""

from __future__ import annotations

import contextvars
import math
from pathlib import Path
from typing import Any

import torch
from torch import nn
from vf.models.config import ModelConfig
from vf.models.errors import ModelLoadError, read_json_object, under_root
from vf.models.layers import Documents, positions_and_mask, refuse_context_parallel, sdpa

ATTN_NAME = "vf"
SLOWER = ("unfused q/k/v and gate/up projections, transformers' per-module overhead, no lean decode "
          "step in the embedded engine")
_UNSUPPORTED_KEYS = ("final_logit_softcapping", "attn_logit_softcapping", "logit_scale", "logits_scaling")

# what the attention function should do during the current forward: (Documents | None, cache | None)
_CONTEXT: contextvars.ContextVar[tuple[Any, Any]] = contextvars.ContextVar("vf_hf_attention", default=(None, None))
# during `load`'s probe: the (kv heads, k dim, v dim) of every attention call, for the engine's cache
# layout, or SELECTS_KEYS for a call that brought its own mask
SELECTS_KEYS = "selects keys"
_SHAPES: contextvars.ContextVar[set | None] = contextvars.ContextVar("vf_hf_attention_shapes", default=None)


def _attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers' attention-function signature: q [B,nh,T,hd], k/v [B,nkv,S,hd] -> ([B,T,nh,hd], None)."""
    docs, cache = _CONTEXT.get()
    shapes = _SHAPES.get()
    if shapes is not None:
        shapes.add((key.shape[1], key.shape[-1], value.shape[-1]) if attention_mask is None else SELECTS_KEYS)
    window = kwargs.get("sliding_window")
    if window and cache is None and query.shape[2] > window:
        raise ModelLoadError(f"sliding-window attention ({window} tokens) over {query.shape[2]} tokens is not "
                             "supported by the transformers fallback", hint="use sequences within the window")
    hd = query.shape[-1]
    if scaling is not None and not math.isclose(scaling, hd ** -0.5, rel_tol=1e-6):
        query = query * (scaling * math.sqrt(hd))  # SDPA and the cache scale by 1/sqrt(hd)
    if attention_mask is not None:
        if cache is not None:  # the probe refuses the cache for such a model; never attend without the mask
            raise ModelLoadError("an attention layer selects its keys with its own mask, which the embedded "
                                 "engine's cache does not apply", hint="generate with --engine.type vllm")
        out = sdpa(query, key, value, _visible(attention_mask, docs, query.shape[2]))
    elif cache is not None:
        out = cache.attend(module.layer_idx, query, key, value)
    else:
        out = sdpa(query, key, value, docs)
    return out.transpose(1, 2), None


def _visible(mask: torch.Tensor, docs: Documents | None, T: int) -> torch.Tensor:
    """bool [B,1,T,T] (True = attend): a mask the model built itself — transformers builds none for our
    attention function, so this is a model's own key selection (e.g. GLM-5-Next's DSA top-k), as
    bool or additive 0/-inf — kept causal and within packed documents. An additive mask carrying
    any other bias is refused: our attention adds none."""
    if mask.dtype != torch.bool:
        low = mask <= torch.finfo(mask.dtype).min / 2
        if not bool(((mask == 0) | low).all()):
            raise ModelLoadError("an attention layer adds a bias to its scores (an additive mask other than "
                                 "0/-inf), which the transformers fallback's attention seam does not apply",
                                 hint="this family needs a native implementation in vf.models")
        mask = ~low
    mask = mask[..., -T:, -T:]
    within = docs.dense() if docs is not None and not docs.single else \
        torch.ones(T, T, dtype=torch.bool, device=mask.device).tril()
    return mask & within


def _leak(packed: torch.Tensor, alone: torch.Tensor) -> float:
    """Largest difference between a document's hidden states packed and alone, relative to their scale."""
    return ((packed.float() - alone.float()).abs().max() / alone.float().abs().max().clamp_min(1e-6)).item()


# relative difference above which the probe calls a document's states changed by its neighbour: the
# attention seam gives ~1e-7 in fp32 (different GEMM shapes) and ~1e-2 in 16-bit; a leak gives ~1
LEAK_TOLERANCE = {torch.float32: 1e-4, torch.float64: 1e-8}
LEAK_TOLERANCE_16BIT = 5e-2


def _register() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(ATTN_NAME, _attention)


def hf_model_config(hf_config) -> ModelConfig:
    """The native config fields the trainer and the embedded engine read (sizes, heads, tokens),
    from a transformers config; `architecture` is the HF model_type (not a native family)."""
    c = hf_config.get_text_config() if hasattr(hf_config, "get_text_config") else hf_config
    nh = c.num_attention_heads
    return ModelConfig(
        architecture=hf_config.model_type, vocab_size=c.vocab_size, hidden_size=c.hidden_size,
        num_layers=c.num_hidden_layers, num_heads=nh, num_kv_heads=getattr(c, "num_key_value_heads", None) or nh,
        head_dim=getattr(c, "head_dim", None) or c.hidden_size // nh,
        intermediate_size=getattr(c, "intermediate_size", 0) or 0,
        max_position_embeddings=getattr(c, "max_position_embeddings", 4096),
        tie_word_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
        bos_token_id=getattr(c, "bos_token_id", None), eos_token_id=getattr(c, "eos_token_id", None))


def _model_class(raw: dict):
    """The transformers class to load config.json `raw` with: the checkpoint's own
    `…ForConditionalGeneration` class (a vision-language model: its text decoder and LM head serve text
    prompts), else `AutoModelForCausalLM` (whose error names a config it does not know)."""
    import transformers

    archs = raw.get("architectures")
    arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else ""
    if arch.endswith("ForConditionalGeneration") and hasattr(transformers, arch):
        return getattr(transformers, arch)
    return transformers.AutoModelForCausalLM


class HFModel(nn.Module):
    """A transformers causal or vision-language LM behind the NativeModel interface (see the module doc)."""

    is_hf_fallback = True

    def __init__(self, hf):
        super().__init__()
        self.hf = hf
        self.config = hf_model_config(hf.config)
        self.activation_checkpointing = False
        self.cache_refusal: str | None = None
        """Why the embedded engine must not run this model on its cache (None: it may); the engine
        refuses with it. Set by `load`'s probe."""
        self.unpack_documents = False
        """Run packed rows one document at a time: state outside attention would cross documents."""
        if self.config.tie_word_embeddings:
            self._tie_state_dict()

    def _tie_state_dict(self) -> None:
        """A tied LM head is one parameter (as `named_parameters` lists it), so the state dict holds
        it once too: its head key is dropped on save and filled from the embedding on load. Weight
        pushes between trainer and engine compare the two name sets."""
        names = {id(m): n for n, m in self.hf.named_modules()}
        head = "hf." + names[id(self.hf.get_output_embeddings())] + ".weight"
        embed = "hf." + names[id(self.hf.get_input_embeddings())] + ".weight"

        def drop(_module, state, prefix, _meta):
            state.pop(prefix + head, None)

        def fill(state, prefix, *_):
            if prefix + embed in state:
                state.setdefault(prefix + head, state[prefix + embed])

        self._register_state_dict_hook(drop)
        self._register_load_state_dict_pre_hook(fill)

    @classmethod
    def load(cls, path: str | Path, dtype: torch.dtype = torch.float32, device="cpu",
             root: Path | None = None) -> HFModel:
        """`root`: the weights root every file read must resolve under (`load_model` checks the shards)."""
        path = Path(path)
        cfg_file = under_root(path / "config.json", root)
        raw = read_json_object(cfg_file)
        bad = [k for k in _UNSUPPORTED_KEYS if raw.get(k) not in (None, 1.0)]
        if bad:
            raise ModelLoadError(f"{path}: model_type {raw.get('model_type')!r} uses {', '.join(bad)}, which the "
                                 "transformers fallback's LM head does not apply",
                                 hint="this family needs a native implementation in vf.models")
        _register()
        try:
            hf, info = _model_class(raw).from_pretrained(str(path), dtype=dtype, attn_implementation=ATTN_NAME,
                                                            output_loading_info=True)
        except (ValueError, KeyError, OSError) as e:
            raise ModelLoadError(f"transformers cannot load {path}: {e}",
                                 hint="check config.json's model_type and the weight files") from None
        for kind in ("missing_keys", "unexpected_keys", "mismatched_keys"):
            keys = sorted(str(k) for k in info.get(kind) or [])
            if keys:  # never a half-loaded model
                shown = ", ".join(keys[:5]) + (f" (+{len(keys) - 5} more)" if len(keys) > 5 else "")
                raise ModelLoadError(f"{path}: {len(keys)} {kind.replace('_', ' ')} for model_type "
                                     f"{hf.config.model_type!r}: {shown}",
                                     hint="the checkpoint does not match its config.json")
        head = hf.get_output_embeddings()
        if head is None or getattr(head, "bias", None) is not None:
            raise ModelLoadError(f"{path}: the LM head has a bias (or there is none); the transformers fallback "
                                 "needs a plain [V, H] head", hint="this family needs a native implementation")
        return cls(hf.to(device)).eval()._probe(path)

    def _probe(self, path: Path) -> HFModel:
        """Run two packed documents and the second alone (see the module doc): a model that mixes
        tokens outside the attention seam is unpacked and kept off the engine's cache."""
        V = self.config.vocab_size
        ids = torch.randint(V, (1, 12), generator=torch.Generator().manual_seed(0)).to(self.lm_head_weight.device)
        positions = torch.cat([torch.arange(7), torch.arange(5)]).unsqueeze(0).to(ids.device)
        shapes: set = set()
        token = _SHAPES.set(shapes)
        try:
            with torch.no_grad():
                packed = self._decode(ids, positions, Documents(positions))[:, 7:]
                alone = self._decode(ids[:, 7:], None, None)
        except ModelLoadError:
            raise
        except Exception as e:  # noqa: BLE001 (whatever the model's own code raises on our seam)
            raise ModelLoadError(f"{path}: model_type {self.hf.config.model_type!r} does not run through the "
                                 f"transformers fallback's attention seam ({type(e).__name__}: {e})",
                                 hint="this family needs a native implementation in vf.models") from None
        finally:
            _SHAPES.reset(token)
        dtype, kind = self.lm_head_weight.dtype, self.hf.config.model_type
        cache_shape = (self.config.num_kv_heads, self.config.head_dim, self.config.head_dim)
        if _leak(packed, alone) > LEAK_TOLERANCE.get(dtype, LEAK_TOLERANCE_16BIT):
            self.unpack_documents = True
            self.cache_refusal = (f"model_type {kind!r} keeps state outside attention (recurrent or "
                                  "convolutional layers), which the embedded engine's KV cache cannot carry "
                                  "through the transformers fallback")
        elif SELECTS_KEYS in shapes:
            self.cache_refusal = (f"model_type {kind!r} selects each query's keys with its own attention mask "
                                  "(sparse attention), which the embedded engine's KV cache does not apply "
                                  "through the transformers fallback")
        elif shapes - {cache_shape}:
            got = ", ".join(f"{h} kv heads of k dim {k} / v dim {v}" for h, k, v in sorted(shapes - {cache_shape}))
            self.cache_refusal = (f"model_type {kind!r} attends with {got}, which the embedded engine's KV cache "
                                  f"(laid out from config.json: {cache_shape[0]} kv heads of dim {cache_shape[1]}) "
                                  "cannot hold through the transformers fallback")
        return self

    @property
    def decoder(self):
        return getattr(self.hf, self.hf.base_model_prefix)

    @property
    def embed_tokens(self):
        return self.hf.get_input_embeddings()

    @property
    def lm_head_weight(self) -> torch.Tensor:  # [V, H]
        return self.hf.get_output_embeddings().weight

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None, cache=None) -> torch.Tensor:
        if cache is not None and self.cache_refusal:
            raise ModelLoadError(self.cache_refusal, hint="generate with --engine.type vllm")
        T = input_ids.shape[1]
        position_ids, docs = positions_and_mask(input_ids, position_ids, cache)
        refuse_context_parallel(docs, "transformers-fallback")
        if self.activation_checkpointing and cache is None and torch.is_grad_enabled():
            self.hf.gradient_checkpointing_enable({"use_reentrant": False})
        if self.unpack_documents and docs is not None and not docs.single:
            return torch.cat([torch.cat([self._decode(input_ids[b:b + 1, s:e], position_ids[b:b + 1, s:e], None)
                                         for s, e in row], dim=1) for b, row in enumerate(docs.spans)], dim=0)
        out = self._decode(input_ids, position_ids, docs, cache)
        if cache is not None and hasattr(cache, "advance"):
            cache.advance(T)
        return out

    def _decode(self, input_ids, position_ids, docs, cache=None) -> torch.Tensor:
        """The base model's final-normed hidden states, its attention routed through our seam."""
        token = _CONTEXT.set((docs, cache))
        try:
            return self.decoder(input_ids=input_ids, position_ids=position_ids, use_cache=False).last_hidden_state
        finally:
            _CONTEXT.reset(token)

    def compute_logits(self, input_ids, position_ids=None, cache=None):
        return self.forward(input_ids, position_ids, cache) @ self.lm_head_weight.t()

    def save(self, path: str | Path, max_shard_size: int | None = None) -> Path:
        """HF layout through transformers' own `save_pretrained` (with the default attention name)."""
        path = Path(path)
        impl = self.hf.config._attn_implementation
        self.hf.config._attn_implementation = "sdpa"
        try:
            kw = {"max_shard_size": max_shard_size} if max_shard_size else {}
            self.hf.save_pretrained(str(path), **kw)
        finally:
            self.hf.config._attn_implementation = impl
        return path
