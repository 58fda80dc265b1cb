"""`trainer` suite: one training step (forward + backward) of our native model with the chunked
LM-head loss, against the `transformers` model of the same config and weights with a full-logits
loss, on the same batch.

    ours: the trainer's path: h = NativeModel(ids); mean −logp fused into the LM head
          (`fused_head_loss`: gradients formed in the forward, 3 GEMMs); tied embedding's gradient added in place;
          MoE layers on our `grouped` path (models/moe.py)
    ref:  logits = AutoModelForCausalLM(ids).logits;  logp = log_softmax(logits).gather(targets);  same loss
          MoE layers on transformers' default experts implementation (5.24: "grouped_mm", i.e.
          `torch.nn.functional.grouped_mm`, which has a CPU kernel with autograd in torch 2.13;
          reported per case as `experts_implementation`)

Both load the same safetensors directory (the built-in tiny model, or a seeded random init of a
0.5B-class Qwen3 shape with the 151,936-token vocabulary, or of a few layers of Qwen3-30B-A3B /
GLM-4.5-Air scaled to CPU (128 experts, top-8, 4k vocabulary), or of issue 19's model families scaled
the same way, built once into the vf cache; Qwen3-VL-MoE's, GLM-5.3's and Kimi K2.5's are built by
transformers, and their reference is the `…ForConditionalGeneration` model on text-only ids: no
causal-LM class exists for them). Each
variant runs in its own child process: one warm-up step (peak memory is measured over it and the
timed steps, above the loaded model), then the timed steps (median). Gradients are dropped after
every step so each step allocates them again, the same on both sides.

Cases with `ckpt` also run ours with per-layer activation checkpointing (`model.activation_checkpointing`,
the trainer's `trainer.activation_checkpointing`) against the same reference measurement, reported as a
second case "… +act-ckpt". Its MFU counts the same FLOPs/token (the recomputed forward is overhead).

MFU = FLOPs/token × tokens/s ÷ peak, FLOPs/token = 6·N_matmul + 12·L·(heads·head_dim)·T (prime-rl's
formula: no causal discount), with the peak measured on this machine at startup for the CPU (best
fp32 matmul) or the datasheet figure for a known GPU.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path
from typing import Any

from vf.bench.common import Case, PeakMemory, Ratio, ratio, run_child, suite_result

QWEN3_0_6B = {  # Qwen3-0.6B's shape (a 0.5B-class model with Qwen's 151,936-token vocabulary)
    "architecture": "qwen3", "vocab_size": 151936, "hidden_size": 1024, "num_layers": 28, "num_heads": 16,
    "num_kv_heads": 8, "head_dim": 128, "intermediate_size": 3072, "rope_theta": 1_000_000.0,
    "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "max_position_embeddings": 40960,
    "bos_token_id": 151643, "eos_token_id": 151645,
}
# MoE layer shapes scaled to a 2-core CPU in fp32, keeping each family's ratios where memory allows:
# 128 experts, top-8, head_dim 128, hidden : expert-intermediate : heads : kv-heads as released,
# and a 4,096-token vocabulary so the LM head doesn't dominate the step.
QWEN3_30B_A3B = {  # Qwen3-30B-A3B /4: hidden 2048, moe_intermediate 768, 32 heads, 4 kv heads
    "architecture": "qwen3_moe", "vocab_size": 4096, "hidden_size": 512, "num_layers": 48, "num_heads": 8,
    "num_kv_heads": 1, "head_dim": 128, "intermediate_size": 1536, "num_experts": 128,
    "num_experts_per_tok": 8, "moe_intermediate_size": 192, "norm_topk_prob": True,
    "rope_theta": 1_000_000.0, "rms_norm_eps": 1e-6, "max_position_embeddings": 40960,
}
GLM_4_5_AIR = {  # GLM-4.5-Air /8: hidden 4096, moe_intermediate 1408, dense 10944, 96 heads, 8 kv heads,
    # one shared expert, sigmoid router with expert bias, first layer dense, partial rotary 0.5
    "architecture": "glm4_moe", "vocab_size": 4096, "hidden_size": 512, "num_layers": 46, "num_heads": 12,
    "num_kv_heads": 1, "head_dim": 128, "intermediate_size": 1368, "num_experts": 128,
    "num_experts_per_tok": 8, "moe_intermediate_size": 176, "norm_topk_prob": True, "n_shared_experts": 1,
    "first_k_dense_replace": 1, "routed_scaling_factor": 1.0, "router_scoring": "sigmoid",
    "expert_bias": True, "attention_bias": True, "partial_rotary_factor": 0.5, "rope_theta": 1_000_000.0,
    "rms_norm_eps": 1e-5, "max_position_embeddings": 131072,
}
# Hybrids scaled to CPU: a gated-DeltaNet hybrid (Qwen3-Next-80B-A3B's layout: 3 DeltaNet layers per
# gated-attention layer, head_dim 256, partial rotary 0.25, 128-dim linear heads with twice as many
# value heads as key heads, MoE with a gated shared expert; hidden 2048 -> 512, 512 experts top-10 ->
# 64 top-4) and a Mamba-2 hybrid (Nemotron-H's M-M-M*-ME pattern: Mamba-2 with 64-dim heads and
# 128-dim states, relu² MLP, attention without rope, a relu² MoE; hidden 4096 -> 512).
QWEN3_NEXT = {
    "architecture": "qwen3_next", "vocab_size": 4096, "hidden_size": 512, "num_layers": 4, "num_heads": 4,
    "num_kv_heads": 1, "head_dim": 256, "intermediate_size": 1024, "num_experts": 64, "num_experts_per_tok": 4,
    "moe_intermediate_size": 128, "shared_expert_intermediate_size": 128, "shared_expert_gate": True,
    "norm_topk_prob": True, "linear_num_key_heads": 4, "linear_num_value_heads": 8, "linear_key_head_dim": 128,
    "linear_value_head_dim": 128, "partial_rotary_factor": 0.25, "rope_theta": 10_000_000.0,
    "layer_types": ["linear_attention"] * 3 + ["full_attention"], "max_position_embeddings": 262144,
}
NEMOTRON_H = {
    "architecture": "nemotron_h", "vocab_size": 4096, "hidden_size": 512, "num_layers": 8, "num_heads": 8,
    "num_kv_heads": 2, "head_dim": 64, "intermediate_size": 1536, "rms_norm_eps": 1e-5, "mlp_act": "relu2",
    "layer_types": ["linear_attention", "mlp", "linear_attention", "mlp", "linear_attention", "full_attention",
                    "linear_attention", "moe"],
    "ssm_state_size": 128, "mamba_num_heads": 16, "mamba_head_dim": 64, "mamba_n_groups": 4, "mamba_chunk_size": 128,
    "mamba_dt_min": 0.001, "num_experts": 32, "num_experts_per_tok": 4, "moe_intermediate_size": 256,
    "shared_expert_intermediate_size": 512, "norm_topk_prob": True, "router_scoring": "sigmoid",
    "expert_bias": True, "expert_act": "relu2", "max_position_embeddings": 8192,
}
# Nemotron-H Super's latent MoE on the same layout: the routed experts run in a 128-wide latent space
# (a quarter of the hidden size) between fc1/fc2 latent projections, with more, wider experts
NEMOTRON_H_SUPER = {**NEMOTRON_H, "moe_latent_size": 128, "num_experts": 64, "moe_intermediate_size": 384}
# The model families of issue 19, scaled as QWEN3_NEXT (hidden 2048 -> 512, 4 layers of the 3:1 pattern,
# 4 query heads of 256 and 1 kv head, DeltaNet heads 4 key / 8 value of 128, a 4k vocabulary).
# Qwen3.8 Flash Next (`qwen4_exp_text`, Qwen4ExpForCausalLM; real shape = transformers' Qwen4ExpTextConfig
# defaults: hidden 2048, 40 layers of 3 DeltaNet + 1 QSA-indexed attention, 16 heads / 2 kv of 256,
# DeltaNet 16 / 32 heads of 128, 512 experts top-10 of width 512 + a gated shared expert of 512, 4
# gated-residual streams mixed at rank 320, PLE n-gram tables (3-grams, 8 heads per n-gram, ~20M rows
# per head, ple_embed_dim = hidden) on its ple_layer_ids, 248k vocabulary) -> 64 experts top-4 of 128,
# 4 streams at rank 80, one PLE layer (the first; 16 n-gram heads of 32 dims over ~20k rows each, the
# tables /1000), and a QSA indexer of 4 heads x 128 dims choosing 512 tokens in blocks of 4 (the released
# indexer sizes are not in transformers' defaults: ours, with the budget a quarter of the 2k-token rows).
QWEN4_EXP = {
    "architecture": "qwen4_exp_text", "vocab_size": 4096, "hidden_size": 512, "num_layers": 4, "num_heads": 4,
    "num_kv_heads": 1, "head_dim": 256, "intermediate_size": 1024, "num_experts": 64, "num_experts_per_tok": 4,
    "moe_intermediate_size": 128, "shared_expert_intermediate_size": 128, "shared_expert_gate": True,
    "norm_topk_prob": True, "linear_num_key_heads": 4, "linear_num_value_heads": 8, "linear_key_head_dim": 128,
    "linear_value_head_dim": 128, "partial_rotary_factor": 0.25, "rope_theta": 10_000_000.0,
    "layer_types": ["linear_attention"] * 3 + ["indexed_attention"], "max_position_embeddings": 32768,
    "hc_mult": 4, "hc_lowrank": 80, "ple_layer_ids": [1], "ple_embed_dim": 512, "ngram_size": 3,
    "heads_per_ngram": 8, "ngram_vocab_size_base": 20_000, "ngram_divisible_by": 128, "split_ngram_parts": 4,
    "index_n_heads": 4, "index_head_dim": 128, "indexer_kv_heads": 1, "indexer_budget": 512,
    "indexer_compress_ratio": 4, "eos_token_id": 2,
}
# Qwen3.5-MoE's text model (`qwen3_5_moe_text`, Qwen3_5MoeForCausalLM: the decoder of the `qwen3_5_moe`
# vision-language checkpoint; real shape = transformers' Qwen3_5MoeTextConfig defaults: hidden 2048, 40
# layers of 3 DeltaNet + 1 gated attention, 16 heads / 2 kv of 256, DeltaNet 16 / 32 heads of 128, 256
# experts top-8 of width 512 + a gated shared expert of 512, 248k vocabulary) -> 32 experts top-4 of 128.
QWEN3_5_MOE = {
    **{k: v for k, v in QWEN3_NEXT.items() if k not in ("architecture", "num_experts")},
    "architecture": "qwen3_5_moe_text", "num_experts": 32, "max_position_embeddings": 32768,
}
SHAPES = {"qwen3-0.6b": QWEN3_0_6B, "qwen3-30b-a3b": QWEN3_30B_A3B, "glm-4.5-air": GLM_4_5_AIR,
          "qwen3-next": QWEN3_NEXT, "nemotron-h": NEMOTRON_H, "nemotron-h-super": NEMOTRON_H_SUPER,
          "qwen4-exp": QWEN4_EXP, "qwen3.5-moe": QWEN3_5_MOE}
# Shapes transformers builds (no native config to build from: a vision-language checkpoint), as
# (model_type, text_config, vision_config, top-level fields) in transformers' keys. Qwen3-VL-MoE's decoder
# (`qwen3_vl_moe`; transformers has no causal-LM class for it, so the reference is
# Qwen3VLMoeForConditionalGeneration on text-only prompts): Qwen3-VL-30B-A3B's decoder is Qwen3-30B-A3B's
# (hidden 2048, 48 layers, 128 experts top-8 of 768, 32 heads / 4 kv of 128) with interleaved M-RoPE,
# scaled as QWEN3_30B_A3B (the text prompts never reach the one-block vision tower; it only has to load).
QWEN3_VL_MOE = ("qwen3_vl_moe", {
    "vocab_size": 4096, "hidden_size": 512, "num_hidden_layers": 4, "num_attention_heads": 8,
    "num_key_value_heads": 1, "head_dim": 128, "intermediate_size": 1536, "num_experts": 128,
    "num_experts_per_tok": 8, "moe_intermediate_size": 192, "rms_norm_eps": 1e-6, "max_position_embeddings": 40960,
    "rope_parameters": {"rope_type": "default", "rope_theta": 5_000_000.0, "mrope_section": [24, 20, 20],
                        "mrope_interleaved": True}},
    {"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "patch_size": 16,
     "temporal_patch_size": 2, "spatial_merge_size": 2, "out_hidden_size": 512, "num_position_embeddings": 16,
     "deepstack_visual_indexes": [0]},
    {"image_token_id": 4093, "video_token_id": 4094, "vision_start_token_id": 4091, "vision_end_token_id": 4092,
     "eos_token_id": 2, "pad_token_id": 0})
# GLM-5.3 (`glm5_next`, Glm5NextForConditionalGeneration; real shape = transformers' Glm5NextTextConfig
# defaults: hidden 4096, 45 layers of 3 KDA linear attention + 1 k-pool indexed MLA (64 heads, no rope,
# q/kv ranks 1536/512, qk/v head 256; indexer 32 heads of 128 picking 2048 tokens in pools of 16), KDA 64
# heads of 128, 3 dense layers of 12288 then 288 experts top-8 of 2048 + a shared expert, 4
# hyper-connection streams, 155k vocabulary) /8: one layer of each kind (KDA, then indexed MLA), the
# first MLP dense and the second sparse, 8 MLA heads of 256 with ranks 192/64, KDA 8 heads of 128, an
# indexer of 4 heads of 128 picking 512 tokens (a quarter of the 2k-token row) in pools of 16, 64 experts
# top-4 of 256 + the shared expert, dense 1536, the 4 streams kept; a one-block vision tower.
GLM5_NEXT = ("glm5_next", {
    "vocab_size": 4096, "hidden_size": 512, "num_hidden_layers": 2, "num_attention_heads": 8,
    "num_key_value_heads": 8, "intermediate_size": 1536, "moe_intermediate_size": 256, "n_routed_experts": 64,
    "num_experts_per_tok": 4, "n_shared_experts": 1, "kv_lora_rank": 64, "q_lora_rank": 192,
    "qk_nope_head_dim": 256, "v_head_dim": 256, "index_topk": 512, "index_kpool": 16, "index_head_dim": 128,
    "index_n_heads": 4, "linear_head_dim": 128, "linear_num_heads": 8, "hc_mult": 4,
    "max_position_embeddings": 32768, "pad_token_id": 0, "eos_token_id": 2,
    "layer_types": ["linear_attention", "indexed_attention"], "indexer_types": ["full", "full"],
    "mlp_layer_types": ["dense", "sparse"]},
    {"depth": 1, "hidden_size": 32, "num_heads": 2, "image_size": 16, "patch_size": 4, "out_hidden_size": 512,
     "intermediate_size": 64, "projection_intermediate_size": 64},
    {"image_token_id": 4093, "video_token_id": 4094, "image_start_token_id": 4089, "image_end_token_id": 4090,
     "video_start_token_id": 4091, "video_end_token_id": 4092, "eos_token_id": 2, "pad_token_id": 0})
# Kimi K2.5 (`kimi_k25`, Kimi_K25ForConditionalGeneration: MoonViT + a DeepSeek-V3 decoder; real text
# shape: hidden 7168, 61 layers, the first 3 dense of 18432, then 256 experts top-8 of 2048 in 8 groups
# (top-4 groups, sigmoid scores, scaling 2.5) + a shared expert, MLA with 128 heads (q/kv ranks 1536/512,
# qk 128 + rope 64, v 128), yarn rope x64 over 4k, 164k vocabulary) /14: 4 layers (1 dense of 1344, 3 MoE),
# 64 experts top-4 of 144 in the same 8 groups / top-4, 8 MLA heads with the real head dims and ranks
# 192/64; a one-block MoonViT (text prompts never reach it).
KIMI_K25 = ("kimi_k25", {
    "vocab_size": 4096, "hidden_size": 512, "num_hidden_layers": 4, "num_attention_heads": 8,
    "num_key_value_heads": 8, "intermediate_size": 1344, "moe_intermediate_size": 144, "n_routed_experts": 64,
    "num_experts_per_tok": 4, "n_shared_experts": 1, "n_group": 8, "topk_group": 4, "first_k_dense_replace": 1,
    "q_lora_rank": 192, "kv_lora_rank": 64, "qk_rope_head_dim": 64, "head_dim": 64, "qk_nope_head_dim": 128,
    "v_head_dim": 128, "max_position_embeddings": 262144, "eos_token_id": 2, "pad_token_id": 0,
    "rope_parameters": {"rope_type": "yarn", "factor": 64.0, "original_max_position_embeddings": 4096,
                        "rope_theta": 50000.0, "mscale": 1.0, "mscale_all_dim": 1.0, "beta_fast": 32.0,
                        "beta_slow": 1.0}},
    {"patch_size": 4, "pos_emb_height": 6, "pos_emb_width": 6, "num_attention_heads": 2, "num_hidden_layers": 1,
     "hidden_size": 32, "intermediate_size": 64},
    {"projection_hidden_size": 32, "image_token_id": 4093, "video_token_id": 4094, "vision_start_token_id": 4091,
     "vision_end_token_id": 4092, "tie_word_embeddings": False, "eos_token_id": 2, "pad_token_id": 0})
HF_SHAPES = {"qwen3-vl-moe": QWEN3_VL_MOE, "glm5-next": GLM5_NEXT, "kimi-k25": KIMI_K25}

# case name -> shape ("tiny" = the built-in tiny model), layers override, batch, seq, timed steps
# target: the speedup goal where it is not the default (1.5× MoE, 1.3× 152k vocabulary, else 1×); the
# model families of issue 19 have its goal, ≥ 1× transformers' tokens/s.
# steps: timed steps after the warm-up step (0: the warm-up step is the timed one). interleave:
# time both variants in one process, alternating steps (robust to machine noise; cheap models only),
# while peak memory still comes from one process per variant.
SIZES: dict[str, list[dict[str, Any]]] = {
    "full": [
        {"name": "tiny", "shape": "tiny", "batch": 8, "seq": 256, "steps": 7, "interleave": True},
        {"name": "qwen3-0.6b-V152k", "shape": "qwen3-0.6b", "layers": None, "batch": 1, "seq": 2048, "steps": 1,
         "ckpt": True},
        {"name": "qwen3-30b-a3b-4L-V4k", "shape": "qwen3-30b-a3b", "layers": 4, "batch": 1, "seq": 1024,
         "steps": 3, "interleave": True},
        {"name": "glm-4.5-air-4L-V4k", "shape": "glm-4.5-air", "layers": 4, "batch": 1, "seq": 1024,
         "steps": 3, "interleave": True},
        {"name": "qwen3-next-4L-V4k", "shape": "qwen3-next", "layers": None, "batch": 1, "seq": 2048, "steps": 3,
         "interleave": True},
        {"name": "nemotron-h-8L-V4k", "shape": "nemotron-h", "layers": None, "batch": 1, "seq": 2048, "steps": 3,
         "interleave": True},
        {"name": "nemotron-h-super-latent-8L-V4k", "shape": "nemotron-h-super", "layers": None, "batch": 1,
         "seq": 2048, "steps": 3, "interleave": True, "target": 1.0},
        {"name": "qwen4-exp-4L-V4k", "shape": "qwen4-exp", "layers": None, "batch": 1, "seq": 2048, "steps": 3,
         "interleave": True, "target": 1.0},
        {"name": "qwen3.5-moe-text-4L-V4k", "shape": "qwen3.5-moe", "layers": None, "batch": 1, "seq": 2048,
         "steps": 3, "interleave": True, "target": 1.0},
        {"name": "qwen3-vl-moe-text-4L-V4k", "shape": "qwen3-vl-moe", "layers": None, "batch": 1, "seq": 1024,
         "steps": 3, "interleave": True, "target": 1.0},
        {"name": "glm5-next-text-2L-V4k", "shape": "glm5-next", "layers": None, "batch": 1, "seq": 2048,
         "steps": 3, "interleave": True, "target": 1.0},
        {"name": "kimi-k25-text-4L-V4k", "shape": "kimi-k25", "layers": None, "batch": 1, "seq": 1024,
         "steps": 3, "interleave": True, "target": 1.0},
    ],
    "quick": [
        {"name": "tiny", "shape": "tiny", "batch": 8, "seq": 256, "steps": 3, "interleave": True},
        {"name": "qwen3-0.6b-2L-V152k", "shape": "qwen3-0.6b", "layers": 2, "batch": 1, "seq": 1024, "steps": 2,
         "interleave": True, "ckpt": True},
        {"name": "qwen3-30b-a3b-1L-V4k", "shape": "qwen3-30b-a3b", "layers": 1, "batch": 1, "seq": 256,
         "steps": 3, "interleave": True},
        {"name": "glm-4.5-air-2L-V4k", "shape": "glm-4.5-air", "layers": 2, "batch": 1, "seq": 256,
         "steps": 3, "interleave": True},
        {"name": "qwen3-next-4L-V4k", "shape": "qwen3-next", "layers": None, "batch": 1, "seq": 256, "steps": 3,
         "interleave": True},
        {"name": "nemotron-h-8L-V4k", "shape": "nemotron-h", "layers": None, "batch": 1, "seq": 256, "steps": 3,
         "interleave": True},
    ],
    "tiny": [{"name": "tiny", "shape": "tiny", "batch": 2, "seq": 64, "steps": 1}],
}


def _cache_root() -> Path:
    root = os.environ.get("VF_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "vf")
    return Path(root) / "bench"


def model_config(shape: str, layers: int | None):
    from vf.models import ModelConfig

    d = dict(SHAPES[shape])
    if layers:
        d["num_layers"] = layers
    return ModelConfig(**d)


def prepare(shape: str, layers: int | None) -> dict[str, Any]:
    """(child) The model directory for a case: the tiny model, or a seeded init saved once."""
    if shape == "tiny":
        from vf.models.tiny import ensure_tiny_model

        return {"path": str(ensure_tiny_model())}
    from vf.bench.common import config_hash

    if shape in HF_SHAPES:
        return {"path": str(prepare_hf(shape, layers))}
    cfg = model_config(shape, layers)
    path = _cache_root() / f"{shape}-{cfg.num_layers}L-{config_hash(cfg.to_dict())}"
    if not (path / "config.json").exists():
        import torch

        from vf.models import build_model, save_hf

        tmp = path.with_name(path.name + f".tmp{os.getpid()}")
        model = build_model(cfg, dtype=torch.float32, seed=0)
        save_hf(model, tmp)
        tmp.rename(path)
    return {"path": str(path)}


def prepare_hf(shape: str, layers: int | None) -> Path:
    """(child) A seeded random init of an HF_SHAPES model saved once by transformers: every matrix
    (routers and fused experts included, which transformers initialises to zeros or leaves to its own
    scheme) N(0, 0.02) as `build_model` draws them, norms at 1, biases at 0."""
    from vf.bench.common import config_hash
    from vf.models.tiny import build_once

    model_type, text, vision, top = HF_SHAPES[shape]
    text = {**text, **({"num_hidden_layers": layers} if layers else {})}

    def build(out: Path) -> None:
        import torch
        from transformers import AutoConfig, AutoModelForImageTextToText

        torch.manual_seed(0)
        cfg = AutoConfig.for_model(model_type, text_config=text, vision_config=vision, **top)
        hf = AutoModelForImageTextToText.from_config(cfg, dtype=torch.float32)
        gen = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for _, p in hf.named_parameters():
                if p.dim() >= 2:
                    p.copy_(torch.randn(p.shape, generator=gen).mul_(0.02))
        hf.save_pretrained(str(out))

    def complete(path: Path) -> bool:
        return (path / "config.json").is_file() and any(path.glob("*.safetensors"))

    digest = config_hash({"type": model_type, "text": text, "vision": vision, "top": top})
    return build_once(_cache_root() / f"{shape}-{text['num_hidden_layers']}L-{digest}", build, complete)


def flops_per_token(cfg, seq: int) -> float | None:
    """6·N_matmul + 12·L·(heads·head_dim)·T (attention scores and values, forward + backward).
    MoE layers count the weights a token uses: the router, its k experts and the shared experts.
    None for the linear-attention / SSM hybrids (no MFU reported: their scans are not matmul-shaped)."""
    if getattr(cfg, "hybrid", False):
        return None
    h, L = cfg.hidden_size, cfg.num_layers
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    n_mm = cfg.vocab_size * h
    for i in range(L):
        mlp = 3 * cfg.intermediate_size * h
        if cfg.is_moe_layer(i):
            active = cfg.num_experts_per_tok + cfg.n_shared_experts
            mlp = cfg.num_experts * h + 3 * active * cfg.moe_intermediate_size * h
        n_mm += h * q + 2 * h * kv + q * h + mlp
    return 6 * n_mm + 12 * L * q * seq


def _build(variant: str, path: str, device: str = "cpu", dtype: str = "float32"):
    """(model, config, loss_fn(ids, targets) -> scalar loss) for "ours" | "ours-ckpt" | "ref", its
    weights on `device` in `dtype` (the compute dtype; the loss is taken in fp32 on both sides)."""
    import torch

    torch_dtype = getattr(torch, dtype)
    if variant in ("ours", "ours-ckpt"):
        from vf.models import load_model
        from vf.trainer import losses
        from vf.trainer.step import PolicyLogprobs, embedding_grad_in_place

        model = load_model(path, dtype=torch_dtype, device=device)
        model.activation_checkpointing = variant == "ours-ckpt"
        embedding_grad_in_place(model)
        cfg = model.config
        policy, sft = PolicyLogprobs(model), losses.get("sft")

        def loss_fn(ids, tgt):  # the trainer's path: sft loss fused into the LM head
            n = tgt.numel()

            def token_loss(lp, a, b):
                return sft(lp, None, None, torch.ones(b - a, dtype=torch.bool, device=lp.device))

            loss, _, _ = policy(ids, None, tgt, 1.0, fused=(torch.arange(n, device=ids.device), token_loss, 1.0 / n))
            return loss
    else:
        from vf.models import read_config

        cfg = read_config(path)
        model = hf_reference_class(path).from_pretrained(path, dtype=torch_dtype, attn_implementation="sdpa").to(device)

        def loss_fn(ids, tgt):
            logits = model(input_ids=ids, use_cache=False).logits
            return -torch.log_softmax(logits.float(), dim=-1).gather(-1, tgt.unsqueeze(-1)).mean()

    return model.train(), cfg, loss_fn


def hf_reference_class(path: str):
    """transformers' auto class for the reference: AutoModelForCausalLM, or for a vision-language
    checkpoint without a causal-LM class (qwen3_vl_moe, glm5_next, kimi_k25) AutoModelForImageTextToText,
    run on text-only prompts (its `…ForConditionalGeneration` forward, loss and `generate` take input_ids alone)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    causal = AutoConfig.from_pretrained(path).model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    return AutoModelForCausalLM if causal else AutoModelForImageTextToText


def _batch(vocab: int, batch: int, seq: int, device: str = "cpu"):
    import torch

    ids = torch.randint(0, vocab, (batch, seq + 1), generator=torch.Generator().manual_seed(1)).to(device)
    return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()


def _sync(device) -> None:
    """Wait for a CUDA device's queued work (step times are wall times of finished work)."""
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def _step(model, loss_fn, inp, tgt) -> tuple[float, float]:
    """One forward+backward; (seconds, loss). Grads are dropped so every step allocates them."""
    _sync(inp.device)
    t = time.perf_counter()
    loss = loss_fn(inp, tgt)
    loss.backward()
    _sync(inp.device)
    dt = time.perf_counter() - t
    model.zero_grad(set_to_none=True)
    return dt, float(loss.detach())


def measure_pair(path: str, batch: int, seq: int, steps: int) -> dict[str, Any]:
    """(child) Step time of both variants in one process, alternating ours/ref steps."""
    import torch

    torch.manual_seed(0)
    sides = {v: _build(v, path) for v in ("ours", "ref")}
    inp, tgt = _batch(sides["ours"][1].vocab_size, batch, seq)
    times: dict[str, list[float]] = {"ours": [], "ref": []}
    for i in range(steps + 1):
        for v, (model, _, loss_fn) in sides.items():
            dt, _ = _step(model, loss_fn, inp, tgt)
            if i > 0:
                times[v].append(dt)
    out = {}
    for v, ts in times.items():
        med = statistics.median(ts)
        out[v] = {"tokens_per_s": round(batch * seq / med, 1), "step_s": round(med, 4)}
    return out


def measure(variant: str, path: str, batch: int, seq: int, steps: int, device: str = "cpu",
            dtype: str = "float32") -> dict[str, Any]:
    """(child) Train-step tokens/s and peak memory of one variant ("ours" | "ours-ckpt" | "ref").
    On CUDA the memory figures are the allocator's (`peak_cuda_mib`: the most allocated at once
    during the steps, model included; `extra_mib`: that above the loaded model)."""
    import torch

    torch.manual_seed(0)
    model, cfg, loss_fn = _build(variant, path, device, dtype)
    n_params = sum(p.numel() for p in model.parameters())
    inp, tgt = _batch(cfg.vocab_size, batch, seq, device)
    cuda = torch.device(device).type == "cuda"
    pm = PeakMemory()
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    else:
        pm.reset()
    times, losses = [], []
    for i in range(steps + 1):  # step 0 is the warm-up (and the timed one when steps == 0)
        dt, loss = _step(model, loss_fn, inp, tgt)
        losses.append(loss)
        if i > 0 or steps == 0:
            times.append(dt)
    med = statistics.median(times)
    if cuda:
        peak = torch.cuda.max_memory_allocated(device)
        mem = {"peak_cuda_mib": round(peak / 2**20, 1), "extra_mib": round((peak - base) / 2**20, 1)}
    else:
        mem = pm.figures()
    out = {"tokens_per_s": round(batch * seq / med, 1), "step_s": round(med, 3 if not cuda else 5), **mem,
           "loss": round(losses[0], 5), "params": n_params, "device": device, "dtype": dtype}
    if variant == "ref" and cfg.num_experts:  # transformers' default: "grouped_mm" where it can dispatch
        out["experts_implementation"] = getattr(model.config, "_experts_implementation", None)
    return out


def run(size: str = "full", peak: dict[str, Any] | None = None, **_: Any) -> dict[str, Any]:
    from vf.models import read_config

    t0 = time.perf_counter()
    specs = SIZES[size]
    cfg_doc = {"size": size, "cases": specs,
               "loss": "mean -logp, loss fused into the LM head vs full logits"}
    peak_flops = (peak or {}).get("peak_flops")
    cases, notes = [], []
    for spec in specs:
        path = run_child("vf.bench.trainer:prepare", {"shape": spec["shape"], "layers": spec.get("layers")})["path"]
        kw = {"path": path, "batch": spec["batch"], "seq": spec["seq"], "steps": spec["steps"]}
        if spec.get("interleave"):
            pair = run_child("vf.bench.trainer:measure_pair", kw, timeout=3600)
            kw["steps"] = 0  # the memory children then run one step each
        ours = run_child("vf.bench.trainer:measure", {"variant": "ours", **kw}, timeout=3600)
        ref = run_child("vf.bench.trainer:measure", {"variant": "ref", **kw}, timeout=3600)
        ckpt = (run_child("vf.bench.trainer:measure", {"variant": "ours-ckpt", **kw}, timeout=3600)
                if spec.get("ckpt") else None)
        if spec.get("interleave"):
            ours.update(pair["ours"], timing="interleaved in one process")
            ref.update(pair["ref"], timing="interleaved in one process")
        mcfg = read_config(path)
        fpt = flops_per_token(mcfg, spec["seq"])
        for side in (ours, ref, ckpt):
            if side is not None and peak_flops and fpt:
                side["mfu_pct"] = round(100 * fpt * side["tokens_per_s"] / peak_flops, 2)
        big, moe = mcfg.vocab_size >= 100_000, mcfg.num_experts > 0
        name = f"{spec['name']} B{spec['batch']}xT{spec['seq']}"
        for mine, suffix, label in ((ours, "", "native + fused head loss"),
                                    (ckpt, " +act-ckpt", "native + fused head loss + activation checkpointing")):
            if mine is None:
                continue
            mine["loss_delta"] = abs(mine["loss"] - ref["loss"])  # same weights, same batch: ~0
            cases.append(Case(
                name=name + suffix, ours=mine, ref=ref, ours_label=label, ref_label="transformers + full logits",
                ratios={"speedup": Ratio(ratio(mine["tokens_per_s"], ref["tokens_per_s"]), "higher",
                                         spec.get("target", 1.5 if moe else 1.3 if big else 1.0)),
                        "memory": Ratio(ratio(mine["peak_rss_mib"], ref["peak_rss_mib"]), "lower",
                                        0.5 if big else None),
                        "step_memory": Ratio(ratio(mine["extra_mib"], ref["extra_mib"]), "lower")},
            ))
    notes.append("memory = peak RSS during the steps (model included); step_memory = the part above the "
                 "loaded model (activations, logits, grads)")
    if peak_flops:
        notes.append(f"MFU against {peak_flops / 1e9:.1f} GFLOP/s ({(peak or {}).get('peak_source')})")
    return suite_result("trainer", cfg_doc, cases, notes=notes, wall_s=round(time.perf_counter() - t0, 1))
