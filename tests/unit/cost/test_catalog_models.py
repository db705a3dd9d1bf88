"""The catalog entries of the models and GPUs served now, against their published configs.

Each model below carries the fields of its published ``config.json`` that fix its shape
(copied from the Hugging Face repository named in ``URL``). The test builds the entry
from those fields with :func:`llm_from_hf_config`, checks it equals the catalog entry,
computes the KV bytes per token by hand from the config's numbers, and compares the
parameter count with the figure the model card publishes.

Tolerance of the parameter counts: the model cards round their figures (to 3 significant
digits at most), and lpserve's count leaves out norms and biases (below 0.1 % of the
weights of every model here: gpt-oss, the only one with biases, has 40 M of them in
116.8 B). The bound is therefore half a unit of the card's last digit plus 0.1 % of the
count: it fails on any layer, width or expert count that is off by one.
"""
from __future__ import annotations

import json

import pytest

from lpserve.cost import cost_model, get_gpu, get_llm, llm_from_hf_config

URL = "https://huggingface.co/{}/blob/main/config.json"
_LLAMA31 = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "head_dim": 128,
            "num_key_value_heads": 8, "vocab_size": 128256, "tie_word_embeddings": False,
            "torch_dtype": "bfloat16", "max_position_embeddings": 131072,
            "rope_scaling": {"factor": 8.0, "original_max_position_embeddings": 8192,
                             "rope_type": "llama3"}}
_QWEN3 = {"head_dim": 128, "vocab_size": 151936, "tie_word_embeddings": False,
          "torch_dtype": "bfloat16", "max_position_embeddings": 40960, "sliding_window": None,
          "use_sliding_window": False}
_GPT_OSS = {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": 2880,
            "intermediate_size": 2880, "num_attention_heads": 64, "num_key_value_heads": 8,
            "head_dim": 64, "num_experts_per_tok": 4, "vocab_size": 201088,
            "sliding_window": 128, "max_position_embeddings": 131072,
            "tie_word_embeddings": False, "torch_dtype": "bfloat16",
            "quantization_config": {"quant_method": "mxfp4"}}

# key -> (HF repository, config.json fields, published total params, its last digit's unit)
CONFIGS = {
    "llama-3.1-8b": ("meta-llama/Llama-3.1-8B", {
        **_LLAMA31, "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
        "num_hidden_layers": 32}, 8.03e9, 0.01e9),
    "llama-3.1-70b": ("meta-llama/Llama-3.1-70B", {
        **_LLAMA31, "hidden_size": 8192, "intermediate_size": 28672, "num_attention_heads": 64,
        "num_hidden_layers": 80}, 70.6e9, 0.1e9),
    "llama-3.1-405b": ("meta-llama/Llama-3.1-405B", {
        **_LLAMA31, "hidden_size": 16384, "intermediate_size": 53248,
        "num_attention_heads": 128, "num_hidden_layers": 126}, 405e9, 1e9),
    "qwen3-8b": ("Qwen/Qwen3-8B", {
        **_QWEN3, "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
        "hidden_size": 4096, "intermediate_size": 12288, "num_attention_heads": 32,
        "num_key_value_heads": 8, "num_hidden_layers": 36}, 8.2e9, 0.1e9),
    "qwen3-14b": ("Qwen/Qwen3-14B", {
        **_QWEN3, "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
        "hidden_size": 5120, "intermediate_size": 17408, "num_attention_heads": 40,
        "num_key_value_heads": 8, "num_hidden_layers": 40}, 14.8e9, 0.1e9),
    "mixtral-8x22b": ("mistralai/Mixtral-8x22B-v0.1", {
        "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": 6144,
        "intermediate_size": 16384, "num_attention_heads": 48, "num_key_value_heads": 8,
        "num_hidden_layers": 56, "num_local_experts": 8, "num_experts_per_tok": 2,
        "vocab_size": 32000, "max_position_embeddings": 65536, "sliding_window": None,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16"}, 141e9, 1e9),
    "mistral-nemo-12b": ("mistralai/Mistral-Nemo-Instruct-2407", {
        "architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 5120,
        "head_dim": 128, "intermediate_size": 14336, "num_attention_heads": 32,
        "num_key_value_heads": 8, "num_hidden_layers": 40, "vocab_size": 131072,
        "max_position_embeddings": 1024000, "sliding_window": None,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16"}, 12.2e9, 0.1e9),
    "qwen3-32b": ("Qwen/Qwen3-32B", {
        **_QWEN3, "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
        "hidden_size": 5120, "intermediate_size": 25600, "num_attention_heads": 64,
        "num_key_value_heads": 8, "num_hidden_layers": 64}, 32.8e9, 0.1e9),
    "qwen3-30b-a3b": ("Qwen/Qwen3-30B-A3B", {
        **_QWEN3, "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
        "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768,
        "num_experts": 128, "num_experts_per_tok": 8, "decoder_sparse_step": 1,
        "mlp_only_layers": [], "num_attention_heads": 32, "num_key_value_heads": 4,
        "num_hidden_layers": 48}, 30.5e9, 0.1e9),
    "qwen3-235b-a22b": ("Qwen/Qwen3-235B-A22B", {
        **_QWEN3, "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
        "hidden_size": 4096, "intermediate_size": 12288, "moe_intermediate_size": 1536,
        "num_experts": 128, "num_experts_per_tok": 8, "decoder_sparse_step": 1,
        "mlp_only_layers": [], "num_attention_heads": 64, "num_key_value_heads": 4,
        "num_hidden_layers": 94}, 235e9, 1e9),
    "deepseek-v3": ("deepseek-ai/DeepSeek-V3", {
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
        "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
        "num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128,
        "n_shared_experts": 1, "n_routed_experts": 256, "num_experts_per_tok": 8,
        "first_k_dense_replace": 3, "moe_layer_freq": 1, "kv_lora_rank": 512,
        "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
        "v_head_dim": 128, "vocab_size": 129280, "max_position_embeddings": 163840,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "quantization_config": {"quant_method": "fp8", "fmt": "e4m3",
                                "weight_block_size": [128, 128]}}, 671e9, 1e9),
    "gpt-oss-20b": ("openai/gpt-oss-20b", {
        **_GPT_OSS, "num_hidden_layers": 24, "num_local_experts": 32,
        "layer_types": ["sliding_attention", "full_attention"] * 12}, 20.91e9, 0.01e9),
    "gpt-oss-120b": ("openai/gpt-oss-120b", {
        **_GPT_OSS, "num_hidden_layers": 36, "num_local_experts": 128,
        "layer_types": ["sliding_attention", "full_attention"] * 18}, 116.83e9, 0.01e9),
}

# KV bytes per token, computed by hand from each config: 2 (K and V) x layers x KV heads x
# head dim x 2 bytes (bf16) for grouped-query attention; for DeepSeek-V3's latent attention
# layers x (kv_lora_rank + qk_rope_head_dim) x 2 bytes (DeepSeek-V2 paper, arXiv 2405.04434,
# section 2.1.2: (d_c + d_h^R) l elements per token); gpt-oss keeps long contexts only in its
# full-attention half of the layers (the sliding half holds the last 128 tokens).
KV_PER_TOKEN = {
    "llama-3.1-8b": 2 * 32 * 8 * 128 * 2, "llama-3.1-70b": 2 * 80 * 8 * 128 * 2,
    "llama-3.1-405b": 2 * 126 * 8 * 128 * 2, "qwen3-8b": 2 * 36 * 8 * 128 * 2,
    "qwen3-32b": 2 * 64 * 8 * 128 * 2, "qwen3-30b-a3b": 2 * 48 * 4 * 128 * 2,
    "qwen3-14b": 2 * 40 * 8 * 128 * 2, "mixtral-8x22b": 2 * 56 * 8 * 128 * 2,
    "mistral-nemo-12b": 2 * 40 * 8 * 128 * 2,
    "qwen3-235b-a22b": 2 * 94 * 4 * 128 * 2, "deepseek-v3": 61 * (512 + 64) * 2,
    "gpt-oss-20b": 12 * 2 * 8 * 64 * 2, "gpt-oss-120b": 18 * 2 * 8 * 64 * 2,
}

# activated parameters the cards publish, and whether that figure counts the input
# embedding table (Qwen's does; gpt-oss counts only the unembedding; DeepSeek's README and
# Mistral's note on Mixtral-8x22B do not say, and their 0.93 B and 0.20 B input tables are
# within the rounding either way)
ACTIVE = {"qwen3-30b-a3b": (3.3e9, 0.1e9, True), "qwen3-235b-a22b": (22e9, 1e9, True),
          "mixtral-8x22b": (39e9, 1e9, False),
          "deepseek-v3": (37e9, 1e9, False), "gpt-oss-20b": (3.61e9, 0.01e9, False),
          "gpt-oss-120b": (5.13e9, 0.01e9, False)}

SHAPE = ("layers", "hidden", "heads", "kv_heads", "head_dim", "ffn", "vocab", "gated", "tied",
         "experts", "top_k", "shared_experts", "dense_layers", "dense_ffn", "kv_lora_rank",
         "q_lora_rank", "qk_rope_head_dim", "v_head_dim", "sliding_window", "sliding_layers",
         "dtype", "expert_dtype", "kv_dtype", "max_context")


def _bound(published: float, unit: float, count: float) -> float:
    return 0.5 * unit + 1e-3 * count


@pytest.mark.parametrize("key", sorted(CONFIGS))
def test_entry_matches_published_config(key, tmp_path):
    repo, cfg, published, unit = CONFIGS[key]
    spec = get_llm(key)
    assert repo in spec.source and spec.source.startswith(URL.format(repo)), spec.source
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    from_cfg = llm_from_hf_config(path, key=f"{key}-from-config", register=False)
    for f in SHAPE:
        assert getattr(from_cfg, f) == getattr(spec, f), (key, f)
    # KV bytes per token: by hand from the config, and through the cost model
    assert spec.kv_bytes_per_token == KV_PER_TOKEN[key]
    assert from_cfg.kv_bytes_per_token == KV_PER_TOKEN[key]
    assert spec.kv_bytes(1000) == (KV_PER_TOKEN[key] * 1000 if not spec.sliding_layers else
                                   KV_PER_TOKEN[key] * (1000 + 128))
    # parameter count against the model card
    assert abs(spec.n_params - published) <= _bound(published, unit, spec.n_params), \
        (key, spec.n_params / 1e9)
    if key in ACTIVE:
        value, unit_a, with_input = ACTIVE[key]
        active = spec.active_params + (spec.vocab * spec.hidden if with_input else 0)
        assert abs(active - value) <= _bound(value, unit_a, active), (key, active / 1e9)


_SCOUT = {  # meta-llama/Llama-4-Scout-17B-16E-Instruct config.json, the fields of its shape
    "architectures": ["Llama4ForConditionalGeneration"], "model_type": "llama4",
    "tie_word_embeddings": False,
    "text_config": {
        "model_type": "llama4_text", "hidden_size": 5120, "num_hidden_layers": 48,
        "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128,
        "intermediate_size": 8192, "intermediate_size_mlp": 16384, "num_local_experts": 16,
        "num_experts_per_tok": 1, "interleave_moe_layer_step": 1, "vocab_size": 202048,
        "attention_chunk_size": 8192, "no_rope_layers": [1, 1, 1, 0] * 12,
        "max_position_embeddings": 10485760, "torch_dtype": "bfloat16"},
    "vision_config": {"hidden_size": 1408, "num_hidden_layers": 34}}


def test_llama4_scout_entry_matches_its_config(tmp_path):
    """Scout's language model: the shape read from its multimodal config equals the entry;
    KV by hand (12 global layers hold the context, 36 chunked ones at most 8,192 tokens);
    17B activated as the card says; the text model's weights sit within 2 % under the
    card's 109B, which also counts the vision encoder (one layer more or less moves the
    count by 2.0 %, one expert per layer by 5.5 %)."""
    spec = get_llm("llama-4-scout-17b-16e")
    assert spec.source.startswith(URL.format("meta-llama/Llama-4-Scout-17B-16E-Instruct"))
    path = tmp_path / "config.json"
    path.write_text(json.dumps(_SCOUT))
    from_cfg = llm_from_hf_config(path, key="scout-from-config", register=False)
    for f in SHAPE:
        assert getattr(from_cfg, f) == getattr(spec, f), f
    per_layer = 2 * 8 * 128 * 2
    assert spec.kv_bytes_per_token == 12 * per_layer
    for n in (1, 8192, 8193, 100_000):
        assert spec.kv_bytes(n) == per_layer * (12 * n + 36 * min(n, 8192))
    active = spec.active_params + spec.vocab * spec.hidden
    assert abs(active - 17e9) <= _bound(17e9, 1e9, active), active / 1e9
    assert 0.98 * 109e9 <= spec.n_params <= 109e9, spec.n_params / 1e9
    # FP8 weights fit two H100s (bf16 needs four)
    assert cost_model(gpu="h100-sxm", llm=spec.key, tp=2, dtype="fp8").kv_capacity_tokens() > 0
    with pytest.raises(ValueError, match="weights"):
        cost_model(gpu="h100-sxm", llm=spec.key, tp=2)
    bad = dict(_SCOUT, text_config={**_SCOUT["text_config"], "interleave_moe_layer_step": 2})
    path.write_text(json.dumps(bad))  # Maverick's layout: dense layers between MoE ones
    with pytest.raises(ValueError, match="interleave_moe_layer_step"):
        llm_from_hf_config(path, register=False)


def test_sliding_and_latent_kv_accounting():
    """Sliding layers hold at most the window; a latent is replicated on every GPU."""
    oss = get_llm("gpt-oss-120b")
    assert oss.full_attention_layers == 18 and oss.sliding_window == 128
    per_layer = 2 * 8 * 64 * 2
    for n in (1, 127, 128, 129, 4096, 131072):
        assert oss.kv_bytes(n) == per_layer * (18 * n + 18 * min(n, 128))
    mistral = get_llm("mistral-7b")  # every layer slides over 4096 tokens
    assert mistral.kv_bytes(10_000) == mistral.kv_bytes(4096) == 4096 * mistral.kv_bytes_per_token
    ds = cost_model(gpu="h200", llm="deepseek-v3", tp=8)
    assert ds.kv_bytes_per_token_per_gpu == 61 * 576 * 2  # whole latent on each GPU
    assert ds.kv_bytes_per_token == 8 * 61 * 576 * 2
    llama = cost_model(gpu="h100-sxm", llm="llama-3.1-70b", tp=4)
    assert llama.kv_bytes_per_token == KV_PER_TOKEN["llama-3.1-70b"]  # 8 KV heads split 4 ways
    assert cost_model(gpu="h100-sxm", llm="llama-3.1-8b", tp=8).kv_bytes_per_token == \
        KV_PER_TOKEN["llama-3.1-8b"]  # one KV head per GPU: nothing replicated


def test_weights_at_their_dtypes_fit_where_published():
    """gpt-oss-120b (MXFP4 experts) runs on one 80 GB GPU; DeepSeek-V3 (fp8) needs 8 H200s,
    not 8 H100s; Llama-3.1-405B in bf16 needs 8 H200s."""
    assert cost_model(gpu="h100-sxm", llm="gpt-oss-120b").weight_bytes_per_gpu / 2**30 < 64
    assert cost_model(gpu="h200", llm="deepseek-v3", tp=8).kv_capacity_tokens() > 0
    with pytest.raises(ValueError, match="weights"):
        cost_model(gpu="h100-sxm", llm="deepseek-v3", tp=8).kv_capacity_tokens()
    assert cost_model(gpu="h200", llm="llama-3.1-405b", tp=8).kv_capacity_tokens() > 0
    with pytest.raises(ValueError, match="weights"):
        cost_model(gpu="h100-sxm", llm="llama-3.1-405b", tp=8)


@pytest.mark.parametrize("key,vendor,link", [("b200", "nvidia", "nvlink5"),
                                             ("mi300x", "amd", "infinity-fabric"),
                                             ("h20", "nvidia", "nvlink4"), ("l4", "nvidia", "pcie")])
def test_new_gpus_have_sources_and_links(key, vendor, link):
    g = get_gpu(key)
    assert g.source and g.vendor == vendor and g.interconnect == link
    assert g.fp8_tflops == pytest.approx(2 * g.bf16_tflops, rel=0.01)  # every one has FP8


def test_config_layouts_the_catalog_cannot_represent_are_refused(tmp_path):
    path = tmp_path / "config.json"
    cfg = dict(CONFIGS["qwen3-30b-a3b"][1], mlp_only_layers=[0, 1])
    path.write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="mlp_only_layers"):
        llm_from_hf_config(path, register=False)
    cfg = dict(CONFIGS["llama-3.1-8b"][1], quantization_config={"quant_method": "awq"})
    path.write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="quantization_config"):
        llm_from_hf_config(path, register=False)
