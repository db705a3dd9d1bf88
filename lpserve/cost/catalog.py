"""GPU and LLM catalog: datasheet and ``config.json`` figures, with their sources.

The built-in entries live in ``lpserve/data/gpus.toml`` and ``lpserve/data/llms.toml``.
Users add their own with :func:`load_catalog_file` (a TOML file with ``[gpu.<key>]`` and
``[llm.<key>]`` tables) or :func:`llm_from_hf_config` (a Hugging Face ``config.json`` on
disk); :func:`register_gpu` / :func:`register_llm` make an entry known by name.
"""
from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, fields
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

#: bytes per element of each storage dtype; ``mxfp4`` is OCP microscaling FP4 (4-bit
#: elements plus one 8-bit scale per 32, i.e. 4.25 bits), used for routed-expert weights
DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "mxfp4": 4.25 / 8}
#: dtypes a whole model (activations, KV, non-expert weights) can be served in
MODEL_DTYPES = ("fp32", "fp16", "bf16", "fp8")
#: GPU-to-GPU interconnects known to the communication model (``lpserve/data/links.toml``)
INTERCONNECTS = ("pcie", "nvlink-bridge", "nvlink3", "nvlink4", "nvlink5", "infinity-fabric")
VENDORS = ("nvidia", "amd")


@dataclass(frozen=True)
class GPUSpec:
    """One GPU model. Bandwidths in GB/s (10^9 bytes/s), links and PCIe bidirectional.

    ``nvlink_gbps`` is the GPU-to-GPU bandwidth of one GPU over all its links (NVLink, or
    AMD Infinity Fabric), 0 where GPUs talk over PCIe only; ``interconnect`` names the link
    kind (one of :data:`INTERCONNECTS`), which fixes its topology and latency.
    """

    key: str
    name: str
    family: str
    bf16_tflops: float
    fp8_tflops: float
    hbm_gbps: float
    memory_gib: float
    nvlink_gbps: float
    pcie_gbps: float
    source: str
    interconnect: str = "pcie"
    vendor: str = "nvidia"

    def __post_init__(self) -> None:
        for f in ("bf16_tflops", "hbm_gbps", "memory_gib", "pcie_gbps"):
            v = getattr(self, f)
            if not (isinstance(v, (int, float)) and v > 0):
                raise ValueError(f"GPU {self.key!r}: {f} must be > 0, got {v!r}")
        for f in ("fp8_tflops", "nvlink_gbps"):
            v = getattr(self, f)
            if not (isinstance(v, (int, float)) and v >= 0):
                raise ValueError(f"GPU {self.key!r}: {f} must be >= 0, got {v!r}")
        if self.interconnect not in INTERCONNECTS:
            raise ValueError(f"GPU {self.key!r}: interconnect must be one of {INTERCONNECTS}, "
                             f"got {self.interconnect!r}")
        if (self.interconnect == "pcie") != (self.nvlink_gbps == 0):
            raise ValueError(f"GPU {self.key!r}: interconnect {self.interconnect!r} with "
                             f"nvlink_gbps={self.nvlink_gbps!r} (0 exactly when 'pcie')")
        if self.vendor not in VENDORS:
            raise ValueError(f"GPU {self.key!r}: vendor must be one of {VENDORS}, "
                             f"got {self.vendor!r}")

    @property
    def memory_bytes(self) -> float:
        """GPU memory in bytes (``memory_gib * 2**30``)."""
        return self.memory_gib * 2.0**30

    def peak_flops(self, dtype: str) -> float:
        """Dense peak FLOP/s for weights of ``dtype`` (4-bit weights compute at bf16)."""
        if dtype == "fp8":
            if self.fp8_tflops <= 0:
                raise ValueError(f"GPU {self.key!r} has no FP8 tensor cores (dtype='fp8')")
            return self.fp8_tflops * 1e12
        return self.bf16_tflops * 1e12


@dataclass(frozen=True)
class LLMSpec:
    """One decoder-only LLM's shape (Hugging Face ``config.json`` names in comments).

    Attention is grouped-query (``kv_heads`` KV heads of ``head_dim``) unless
    ``kv_lora_rank`` > 0: multi-head latent attention (DeepSeek), whose KV cache holds one
    latent of ``kv_lora_rank`` plus a rotary key of ``qk_rope_head_dim`` per token and
    layer; there ``head_dim`` is the query/key head width (nope + rope) and ``v_head_dim``
    the value width. ``sliding_layers`` of the layers attend only to the last
    ``sliding_window`` tokens. A mixture-of-experts model (``experts`` > 0) routes each
    token to ``top_k`` experts of intermediate width ``ffn`` in every layer but the first
    ``dense_layers`` (which have a dense MLP of ``dense_ffn``), plus ``shared_experts``
    always-active experts of width ``ffn``.
    """

    key: str
    layers: int          # num_hidden_layers
    hidden: int          # hidden_size
    heads: int           # num_attention_heads
    kv_heads: int        # num_key_value_heads
    head_dim: int        # head_dim (MLA: qk_nope_head_dim + qk_rope_head_dim)
    ffn: int             # intermediate_size (per expert for MoE: moe_intermediate_size)
    vocab: int           # vocab_size
    gated: bool = True   # SwiGLU three-matrix MLP
    tied: bool = False   # tie_word_embeddings
    experts: int = 0     # num_local_experts / num_experts / n_routed_experts (0 = dense)
    top_k: int = 0       # num_experts_per_tok
    dtype: str = "fp16"  # weights and activations (fp8 checkpoints: weights only)
    source: str = ""
    max_context: int | None = None  # max_position_embeddings (tokens)
    shared_experts: int = 0  # n_shared_experts
    dense_layers: int = 0    # first_k_dense_replace (MoE models)
    dense_ffn: int = 0       # intermediate_size of those dense layers
    kv_lora_rank: int = 0    # MLA latent width (0 = grouped-query attention)
    q_lora_rank: int = 0     # MLA query low-rank width (0 = full-rank queries)
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0      # MLA value head width
    sliding_window: int = 0  # tokens a sliding-window layer attends to
    sliding_layers: int = 0  # layers with sliding-window attention (layer_types)
    expert_dtype: str = ""   # routed-expert weights ("" = dtype), e.g. "mxfp4"
    kv_dtype: str = ""       # KV-cache elements ("" = dtype)

    def __post_init__(self) -> None:
        for f in ("layers", "hidden", "heads", "kv_heads", "head_dim", "ffn", "vocab"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"LLM {self.key!r}: {f} must be a positive integer, got {v!r}")
        for f in ("experts", "top_k", "shared_experts", "dense_layers", "dense_ffn",
                  "kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "v_head_dim",
                  "sliding_window", "sliding_layers"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"LLM {self.key!r}: {f} must be an integer >= 0, got {v!r}")
        if self.heads % self.kv_heads:
            raise ValueError(f"LLM {self.key!r}: heads={self.heads} is not a multiple of "
                             f"kv_heads={self.kv_heads}")
        if self.experts > 0 and not 1 <= self.top_k <= self.experts:
            raise ValueError(f"LLM {self.key!r}: need 1 <= top_k <= experts, got "
                             f"experts={self.experts}, top_k={self.top_k}")
        if self.experts == 0 and (self.top_k or self.shared_experts or self.dense_layers):
            raise ValueError(f"LLM {self.key!r}: top_k, shared_experts and dense_layers need "
                             f"experts > 0")
        if self.dense_layers >= self.layers or (self.dense_layers > 0) != (self.dense_ffn > 0):
            raise ValueError(f"LLM {self.key!r}: dense_layers={self.dense_layers} must be below "
                             f"layers={self.layers} and come with dense_ffn > 0 (and only then)")
        if self.kv_lora_rank and not (0 < self.qk_rope_head_dim < self.head_dim
                                      and self.v_head_dim > 0):
            raise ValueError(f"LLM {self.key!r}: latent attention needs 0 < qk_rope_head_dim "
                             f"< head_dim and v_head_dim > 0")
        if not self.kv_lora_rank and (self.q_lora_rank or self.qk_rope_head_dim
                                      or self.v_head_dim):
            raise ValueError(f"LLM {self.key!r}: q_lora_rank, qk_rope_head_dim and v_head_dim "
                             "describe latent attention and need kv_lora_rank > 0")
        if self.sliding_layers > self.layers or (self.sliding_layers > 0) != (self.sliding_window > 0):
            raise ValueError(f"LLM {self.key!r}: sliding_layers={self.sliding_layers} (at most "
                             f"layers) and sliding_window={self.sliding_window} must both be > 0 "
                             "or both 0")
        if self.dtype not in MODEL_DTYPES:
            raise ValueError(f"LLM {self.key!r}: dtype must be one of {MODEL_DTYPES}, "
                             f"got {self.dtype!r}")
        if self.expert_dtype and (self.expert_dtype not in DTYPE_BYTES or not self.experts):
            raise ValueError(f"LLM {self.key!r}: expert_dtype must be one of "
                             f"{sorted(DTYPE_BYTES)} on a model with experts, got "
                             f"{self.expert_dtype!r}")
        if self.kv_dtype and self.kv_dtype not in MODEL_DTYPES:
            raise ValueError(f"LLM {self.key!r}: kv_dtype must be one of {MODEL_DTYPES}, "
                             f"got {self.kv_dtype!r}")
        mc = self.max_context
        if mc is not None and (not isinstance(mc, int) or isinstance(mc, bool) or mc < 1):
            raise ValueError(f"LLM {self.key!r}: max_context must be a positive integer, "
                             f"got {mc!r}")

    # ---- dtypes ------------------------------------------------------------------------
    @property
    def kv_dtype_bytes(self) -> float:
        """Bytes of one KV-cache element (``kv_dtype``, else ``dtype``)."""
        return DTYPE_BYTES[self.kv_dtype or self.dtype]

    # ---- attention -----------------------------------------------------------------------
    @property
    def attention(self) -> str:
        """``"mla"`` (latent KV) or ``"gqa"`` (grouped-query, MHA when kv_heads == heads)."""
        return "mla" if self.kv_lora_rank else "gqa"

    @property
    def value_dim(self) -> int:
        """Width of one value head (``v_head_dim`` for MLA, else ``head_dim``)."""
        return self.v_head_dim if self.kv_lora_rank else self.head_dim

    @property
    def attn_params_per_layer(self) -> int:
        """Weights of the attention projections of one layer (elements).

        GQA: q, k, v, o. MLA: q (through its low-rank ``q_lora_rank`` when > 0), the joint
        KV down-projection with the rotary key (``kv_a``), the up-projection of the latent
        to no-rope keys and values (``kv_b``) and o. Biases and norms are left out.
        """
        h, H, d = self.hidden, self.heads, self.head_dim
        o = H * self.value_dim * h
        if not self.kv_lora_rank:
            return h * (H * d + 2 * self.kv_heads * d) + o
        q = (h * self.q_lora_rank + self.q_lora_rank * H * d) if self.q_lora_rank else h * H * d
        kv_a = h * (self.kv_lora_rank + self.qk_rope_head_dim)
        kv_b = self.kv_lora_rank * H * (d - self.qk_rope_head_dim + self.v_head_dim)
        return q + kv_a + kv_b + o

    @property
    def attn_flops_per_pair(self) -> int:
        """FLOPs of one query attending to one key in one layer (all heads): 2 H (d_qk + d_v)."""
        return 2 * self.heads * (self.head_dim + self.value_dim)

    @property
    def decode_attn_flops_per_pair(self) -> int:
        """As :attr:`attn_flops_per_pair` for a decode query; MLA decodes in the absorbed
        form, against the latent: 2 H (kv_lora_rank + qk_rope_head_dim + kv_lora_rank)."""
        if not self.kv_lora_rank:
            return self.attn_flops_per_pair
        return 2 * self.heads * (2 * self.kv_lora_rank + self.qk_rope_head_dim)

    @property
    def kv_elems_per_token_layer(self) -> int:
        """KV-cache elements one token holds in one layer: 2 K d (GQA) or
        kv_lora_rank + qk_rope_head_dim (MLA, DeepSeek-V2 paper section 2.1.2)."""
        if self.kv_lora_rank:
            return self.kv_lora_rank + self.qk_rope_head_dim
        return 2 * self.kv_heads * self.head_dim

    @property
    def full_attention_layers(self) -> int:
        """Layers that attend to the whole context."""
        return self.layers - self.sliding_layers

    def kv_bytes(self, context_tokens: int) -> float:
        """KV-cache bytes of one sequence of ``context_tokens`` tokens over the whole model:
        full-attention layers hold every token, sliding-window layers the last
        ``sliding_window``."""
        n = int(context_tokens)
        if n < 0:
            raise ValueError(f"context_tokens must be >= 0, got {context_tokens!r}")
        held = self.full_attention_layers * n + self.sliding_layers * min(n, self.sliding_window)
        return held * self.kv_elems_per_token_layer * self.kv_dtype_bytes

    @property
    def kv_bytes_per_token(self) -> float:
        """KV bytes one more token of a long context adds, over the whole model.

        Every layer for models without sliding windows; only the full-attention layers
        where some layers slide (their window is a fixed cost per sequence, see
        :meth:`kv_bytes`); the sliding layers where every layer slides (a token within
        the window is held by all of them).
        """
        layers = self.full_attention_layers or self.sliding_layers
        return layers * self.kv_elems_per_token_layer * self.kv_dtype_bytes

    # ---- weights ---------------------------------------------------------------------------
    @property
    def mlp_params_per_expert(self) -> int:
        """Weights of one MLP of width ``ffn`` (one expert for MoE) of one layer (elements)."""
        return (3 if self.gated else 2) * self.hidden * self.ffn

    @property
    def dense_mlp_params(self) -> int:
        """Weights of the MLP of one dense layer (elements): width ``ffn`` for a dense model,
        ``dense_ffn`` for the leading dense layers of an MoE model."""
        width = self.dense_ffn if self.experts else self.ffn
        return (3 if self.gated else 2) * self.hidden * width

    @property
    def moe_layers(self) -> int:
        """Layers with routed experts (0 for a dense model)."""
        return self.layers - self.dense_layers if self.experts else 0

    @property
    def routed_expert_params(self) -> int:
        """Weights of every routed expert of the model (elements)."""
        return self.moe_layers * self.experts * self.mlp_params_per_expert

    @property
    def n_params(self) -> int:
        """Total weights (elements), embeddings included once when tied; norms and biases
        left out."""
        dense = (self.layers - self.moe_layers) * self.dense_mlp_params
        moe = self.moe_layers * (self.shared_experts * self.mlp_params_per_expert
                                 + self.hidden * self.experts)  # shared experts, router
        emb = self.vocab * self.hidden * (1 if self.tied else 2)
        return (self.layers * self.attn_params_per_layer + dense + moe
                + self.routed_expert_params + emb)

    @property
    def active_params(self) -> int:
        """Weights one token uses (elements): everything but the routed experts it is not
        sent to and the input embedding table (a lookup), LM head included."""
        unused = self.moe_layers * (self.experts - self.top_k) * self.mlp_params_per_expert
        emb_in = 0 if self.tied else self.vocab * self.hidden
        return self.n_params - unused - emb_in

    def weight_bytes(self, dtype: str | None = None) -> float:
        """Bytes of all weights: routed experts at ``expert_dtype`` (else ``dtype``), the rest
        at ``dtype`` (default: the model's)."""
        d = dtype or self.dtype
        routed = self.routed_expert_params
        return ((self.n_params - routed) * DTYPE_BYTES[d]
                + routed * DTYPE_BYTES[self.expert_dtype or d])


_USER_GPUS: dict[str, GPUSpec] = {}
_USER_LLMS: dict[str, LLMSpec] = {}


def _gpu_from_table(key: str, t: dict[str, Any]) -> GPUSpec:
    names = {f.name for f in fields(GPUSpec)} - {"key"}
    unknown = set(t) - names
    if unknown:
        raise ValueError(f"GPU {key!r}: unknown fields {sorted(unknown)}; known: {sorted(names)}")
    missing = names - set(t) - {"family", "name", "source", "fp8_tflops", "nvlink_gbps",
                                "interconnect", "vendor"}
    if missing:
        raise ValueError(f"GPU {key!r}: missing fields {sorted(missing)}")
    if float(t.get("nvlink_gbps", 0.0)) > 0 and "interconnect" not in t:
        raise ValueError(f"GPU {key!r}: nvlink_gbps > 0 needs interconnect (one of "
                         f"{INTERCONNECTS[1:]})")
    data = {"name": key, "family": key, "source": "user", "fp8_tflops": 0.0, "nvlink_gbps": 0.0,
            "interconnect": "pcie", "vendor": "nvidia"}
    data.update(t)
    text = ("name", "family", "source", "interconnect", "vendor")
    return GPUSpec(key=key, **{k: (v if k in text else float(v)) for k, v in data.items()})


def _llm_from_table(key: str, t: dict[str, Any]) -> LLMSpec:
    names = {f.name for f in fields(LLMSpec)} - {"key"}
    unknown = set(t) - names
    if unknown:
        raise ValueError(f"LLM {key!r}: unknown fields {sorted(unknown)}; known: {sorted(names)}")
    return LLMSpec(key=key, **t)


@lru_cache(maxsize=None)
def _builtin() -> tuple[dict[str, GPUSpec], dict[str, LLMSpec]]:
    data = resources.files("lpserve") / "data"
    g = tomllib.loads((data / "gpus.toml").read_text())
    m = tomllib.loads((data / "llms.toml").read_text())
    return ({k: _gpu_from_table(k, v) for k, v in g.items()},
            {k: _llm_from_table(k, v) for k, v in m.items()})


def gpu_names() -> list[str]:
    """Known GPU keys (built-in and registered)."""
    return sorted({**_builtin()[0], **_USER_GPUS})


def llm_names() -> list[str]:
    """Known LLM keys (built-in and registered)."""
    return sorted({**_builtin()[1], **_USER_LLMS})


def get_gpu(gpu: str | GPUSpec) -> GPUSpec:
    """The catalog entry for ``gpu``; a :class:`GPUSpec` passes through."""
    if isinstance(gpu, GPUSpec):
        return gpu
    table = {**_builtin()[0], **_USER_GPUS}
    if gpu not in table:
        raise KeyError(f"unknown gpu {gpu!r}; known: {', '.join(sorted(table))}")
    return table[gpu]


def get_llm(llm: str | LLMSpec) -> LLMSpec:
    """The catalog entry for ``llm``; an :class:`LLMSpec` passes through."""
    if isinstance(llm, LLMSpec):
        return llm
    table = {**_builtin()[1], **_USER_LLMS}
    if llm not in table:
        raise KeyError(f"unknown llm {llm!r}; known: {', '.join(sorted(table))}")
    return table[llm]


def register_gpu(spec: GPUSpec) -> None:
    """Make ``spec`` known by its key in this process (replaces a user entry of that key)."""
    _USER_GPUS[spec.key] = spec


def register_llm(spec: LLMSpec) -> None:
    """Make ``spec`` known by its key in this process (replaces a user entry of that key)."""
    _USER_LLMS[spec.key] = spec


def load_catalog_file(path: str | Path, *, register: bool = True) -> dict[str, Any]:
    """Read user entries from a TOML file with ``[gpu.<key>]`` and ``[llm.<key>]`` tables.

    Field names and units are those of ``lpserve/data/gpus.toml`` and ``llms.toml``.
    Returns ``{"gpu": {key: GPUSpec}, "llm": {key: LLMSpec}}``; registers them unless
    ``register=False``.
    """
    raw = tomllib.loads(Path(path).read_text())
    unknown = set(raw) - {"gpu", "llm"}
    if unknown:
        raise ValueError(f"catalog file {str(path)!r}: unknown sections {sorted(unknown)}; "
                         "use [gpu.<key>] and [llm.<key>]")
    out = {"gpu": {k: _gpu_from_table(k, v) for k, v in raw.get("gpu", {}).items()},
           "llm": {k: _llm_from_table(k, v) for k, v in raw.get("llm", {}).items()}}
    if register:
        for s in out["gpu"].values():
            register_gpu(s)
        for s in out["llm"].values():
            register_llm(s)
    return out


_HF_DTYPES = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp16", "float8_e4m3fn": "fp8"}


def llm_from_hf_config(path: str | Path, key: str | None = None, *,
                       register: bool = True) -> LLMSpec:
    """Build an :class:`LLMSpec` from a Hugging Face ``config.json`` on disk.

    Understands Llama/Mistral/Mixtral/Qwen2/Qwen3 names (``num_hidden_layers``,
    ``hidden_size``, ``num_attention_heads``, ``num_key_value_heads``,
    ``intermediate_size``, ``num_local_experts`` / ``num_experts``,
    ``moe_intermediate_size``), DeepSeek-V3 (``n_routed_experts``, ``n_shared_experts``,
    ``first_k_dense_replace``, ``kv_lora_rank``, ``q_lora_rank``, ``qk_nope_head_dim``,
    ``qk_rope_head_dim``, ``v_head_dim``), gpt-oss (``layer_types``, ``sliding_window``),
    Llama 4 (``text_config``; one shared expert per MoE layer; ``attention_chunk_size`` on
    the layers ``no_rope_layers`` marks 1, kept as a sliding window of the chunk's length),
    OPT (``ffn_dim``) and BLOOM (``n_layer``, ``n_head``); ``quantization_config`` with
    ``quant_method`` ``"fp8"`` (fp8 weights, KV at the activation dtype) or ``"mxfp4"``
    (4-bit routed experts). fp32 checkpoints are served as fp16. Layouts it cannot
    represent (MoE layers interleaved with dense ones, Qwen2-MoE shared experts) raise a
    ValueError naming the field.
    """
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    cfg = json.loads(p.read_text())
    key = key or cfg.get("_name_or_path") or p.parent.name
    if isinstance(cfg.get("text_config"), dict):  # a multimodal model: its language model
        cfg = {**{k: v for k, v in cfg.items() if k != "text_config"}, **cfg["text_config"]}

    def pick(*names: str, default: Any = None) -> Any:
        for n in names:
            if n in cfg and cfg[n] is not None:
                return cfg[n]
        if default is None:
            raise ValueError(f"config {str(p)!r}: none of {names} present")
        return default

    def unsupported(field: str, why: str) -> ValueError:
        return ValueError(f"config {str(p)!r}: {field}={cfg.get(field)!r} is not supported ({why})")

    layers = int(pick("num_hidden_layers", "n_layer", "num_layers"))
    hidden = int(pick("hidden_size", "n_embd", "d_model"))
    heads = int(pick("num_attention_heads", "n_head"))
    kv_heads = int(pick("num_key_value_heads", default=heads))
    arch = " ".join(cfg.get("architectures", [])) + " " + str(cfg.get("model_type", ""))
    gated = not any(s in arch.lower() for s in ("opt", "bloom", "gpt2", "falcon"))
    ffn = int(pick("intermediate_size", "ffn_dim", default=4 * hidden))
    mla: dict[str, int] = {}
    if cfg.get("kv_lora_rank"):
        rope = int(pick("qk_rope_head_dim"))
        mla = {"kv_lora_rank": int(cfg["kv_lora_rank"]), "q_lora_rank": int(cfg.get("q_lora_rank") or 0),
               "qk_rope_head_dim": rope, "v_head_dim": int(pick("v_head_dim"))}
        head_dim = int(pick("qk_nope_head_dim")) + rope
    else:
        head_dim = int(pick("head_dim", default=hidden // heads))
    experts = int(cfg.get("num_local_experts") or cfg.get("num_experts")
                  or cfg.get("n_routed_experts") or 0)
    moe: dict[str, int] = {}
    if experts:
        if cfg.get("mlp_only_layers") or int(cfg.get("decoder_sparse_step", 1)) != 1:
            raise unsupported("mlp_only_layers" if cfg.get("mlp_only_layers")
                              else "decoder_sparse_step", "dense layers between MoE layers")
        if int(cfg.get("moe_layer_freq", 1)) != 1:
            raise unsupported("moe_layer_freq", "dense layers between MoE layers")
        if int(cfg.get("shared_expert_intermediate_size") or 0):
            raise unsupported("shared_expert_intermediate_size", "shared experts of another width")
        if int(cfg.get("interleave_moe_layer_step", 1)) != 1:
            raise unsupported("interleave_moe_layer_step", "dense layers between MoE layers")
        dense_layers = int(cfg.get("first_k_dense_replace") or 0)
        # Llama 4: every MoE layer has one shared expert as wide as a routed one
        llama4 = "llama4" in arch.lower()
        moe = {"experts": experts, "top_k": int(pick("num_experts_per_tok", "experts_per_token")),
               "shared_experts": int(cfg.get("n_shared_experts") or (1 if llama4 else 0)),
               "dense_layers": dense_layers, "dense_ffn": ffn if dense_layers else 0}
        ffn = int(cfg.get("moe_intermediate_size") or ffn)
    window = int(cfg.get("sliding_window") or 0)
    max_ctx = cfg.get("max_position_embeddings")
    if cfg.get("attention_chunk_size"):
        # Llama 4: the RoPE layers (no_rope_layers 1) attend within chunks of this many
        # tokens, kept as a window of that length (an upper bound on a chunk's contents)
        window = int(cfg["attention_chunk_size"])
        n_slide = sum(int(x) == 1 for x in cfg.get("no_rope_layers") or [])
        if not n_slide:
            raise unsupported("no_rope_layers", "which layers attend within chunks is not listed")
    elif "layer_types" in cfg:
        n_slide = sum(t == "sliding_attention" for t in cfg["layer_types"])
    elif window and cfg.get("use_sliding_window", True) and (max_ctx is None or window < max_ctx):
        n_slide = layers  # Mistral: every layer slides
    else:
        n_slide = 0
    act = _HF_DTYPES.get(str(cfg.get("torch_dtype") or cfg.get("dtype") or "float16"), "fp16")
    quant = (cfg.get("quantization_config") or {}).get("quant_method")
    dtypes = {"dtype": act}
    if quant == "fp8":
        dtypes = {"dtype": "fp8", "kv_dtype": act}
    elif quant == "mxfp4":
        dtypes["expert_dtype"] = "mxfp4"
    elif quant is not None:
        raise unsupported("quantization_config", f"quant_method {quant!r}; known: fp8, mxfp4")
    spec = LLMSpec(
        key=str(key), layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads,
        head_dim=head_dim, ffn=ffn, vocab=int(pick("vocab_size")), gated=gated,
        tied=bool(cfg.get("tie_word_embeddings", not gated)),
        source=f"config.json at {p}", max_context=int(max_ctx) if max_ctx else None,
        sliding_window=window if n_slide else 0, sliding_layers=n_slide,
        **moe, **mla, **dtypes,
    )
    if register:
        register_llm(spec)
    return spec
