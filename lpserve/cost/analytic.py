"""The analytic (calibrated roofline) cost model; math in ``models/cost-model.md``."""
from __future__ import annotations

import tomllib
from functools import lru_cache
from importlib import resources
from typing import Any

import numpy as np

from lpserve.cost import _kernels as K
from lpserve.cost.base import ArrayLike, CostModel, check_batch, check_ratio
from lpserve.cost.catalog import GPUSpec, LLMSpec, get_gpu, get_llm

VALID_TP = (1, 2, 4, 8)

# calibrated parameters: name -> index into params (models/cost-model.md, symbol table)
CALIBRATED = {
    "eff_compute": K.P_EFF_COMPUTE,
    "eff_weights": K.P_EFF_WEIGHTS,
    "plateau_tokens": K.P_PLATEAU_TOKENS,
    "eff_attn": K.P_EFF_ATTN,
    "attn_plateau_tokens": K.P_ATTN_PLATEAU,
    "eff_kv": K.P_EFF_KV,
    "attn_seq_s": K.P_ATTN_SEQ_S,
    "attn_fixed_s": K.P_ATTN_FIXED_S,
    "multi_prompt_token_s": K.P_MULTI_PROMPT_S,
    "attn_chunk_s": K.P_ATTN_CHUNK_S,
    "attn_token_s": K.P_ATTN_TOKEN_S,
    "ar_latency_s": K.P_AR_LATENCY_S,
    "layer_overhead_s": K.P_LAYER_OVERHEAD_S,
    "iter_overhead_s": K.P_ITER_OVERHEAD_S,
    "seq_overhead_s": K.P_SEQ_OVERHEAD_S,
}
# not in params directly: all-reduce bus bandwidth = ar_link_efficiency x link (one way)
EXTRA_CALIBRATED = ("ar_link_efficiency",)
OTHER_OVERRIDES = ("dtype", "kv_dtype", "pcie_efficiency", "calibration")
BOUNDED_01 = ("eff_compute", "eff_weights", "eff_attn", "eff_kv", "ar_link_efficiency",
              "pcie_efficiency")


@lru_cache(maxsize=None)
def calibrations() -> tuple[dict[str, Any], ...]:
    """Calibrated parameter sets from ``lpserve/data/calibration/fitted.toml``."""
    text = (resources.files("lpserve") / "data" / "calibration" / "fitted.toml").read_text()
    return tuple(tomllib.loads(text)["calibration"])


def calibration_for(gpu: GPUSpec, llm: LLMSpec) -> dict[str, Any]:
    """The most specific calibration: (gpu key, llm), (family, llm), (gpu, *), (family, *), *."""
    entries = calibrations()
    for g, m in ((gpu.key, llm.key), (gpu.family, llm.key), (gpu.key, "*"),
                 (gpu.family, "*"), ("*", "*")):
        for e in entries:
            if e["gpu"] == g and e["llm"] == m:
                return e
    raise LookupError("fitted.toml has no default ('*', '*') calibration")


class AnalyticCost(CostModel):
    """Calibrated roofline of one replica: ``gpu`` x ``llm`` at tensor-parallel ``tp``.

    Parameters beyond the catalog (efficiencies, overheads) come from the calibration
    that best matches the pair; any of them can be overridden by keyword (names in
    ``CALIBRATED`` and ``ar_link_efficiency``), as can ``dtype`` (``"fp16"``, ``"bf16"``,
    ``"fp8"``: weights and activations; routed experts stored in another dtype, such as
    gpt-oss's MXFP4, keep it), ``kv_dtype`` (KV-cache elements; default the model's
    ``kv_dtype``, else ``dtype``) and ``pcie_efficiency`` (share of PCIe peak reached by
    swaps; default 1.0, i.e. swaps at peak, since no swap timing is in the calibration data).
    """

    kind = K.KIND_ANALYTIC

    def __init__(self, gpu: str | GPUSpec = "a100-80gb", llm: str | LLMSpec = "llama-2-7b",
                 tp: int = 1, **overrides: Any) -> None:
        self.gpu = get_gpu(gpu)
        self.llm = get_llm(llm)
        known = set(CALIBRATED) | set(EXTRA_CALIBRATED) | set(OTHER_OVERRIDES)
        unknown = set(overrides) - known
        if unknown:
            raise ValueError(f"unknown cost-model overrides {sorted(unknown)}; known: {sorted(known)}")
        if isinstance(tp, bool) or tp not in VALID_TP:
            raise ValueError(f"tp must be one of {VALID_TP}, got {tp!r}")
        self.tp = int(tp)
        m = self.llm
        if m.heads % self.tp:
            raise ValueError(f"tp={self.tp} does not divide the {m.heads} attention heads of {m.key}")
        if m.attention == "gqa" and m.kv_heads % self.tp and self.tp % m.kv_heads:
            raise ValueError(f"tp={self.tp} and the {m.kv_heads} KV heads of {m.key} do not "
                             "divide one another")
        from lpserve.cost.catalog import MODEL_DTYPES
        self.dtype = overrides.get("dtype", m.dtype)
        self.kv_dtype = overrides.get("kv_dtype", m.kv_dtype or self.dtype)
        for name, v in (("dtype", self.dtype), ("kv_dtype", self.kv_dtype)):
            if v not in MODEL_DTYPES:
                raise ValueError(f"{name} must be one of {MODEL_DTYPES}, got {v!r}")
        self.peak_flops = self.gpu.peak_flops(self.dtype)
        calib = dict(calibration_for(self.gpu, m))
        if "calibration" in overrides:
            calib = self._named_calibration(overrides["calibration"])
        self.calibration = calib
        merged = {**calib, **{k: v for k, v in overrides.items()
                              if k in CALIBRATED or k in EXTRA_CALIBRATED}}
        missing = [k for k in (*CALIBRATED, *EXTRA_CALIBRATED) if k not in merged]
        if missing:
            raise ValueError(f"calibration {calib.get('name')!r} lacks {missing}")
        values = {k: float(merged[k]) for k in (*CALIBRATED, *EXTRA_CALIBRATED)}
        self.pcie_efficiency = float(overrides.get("pcie_efficiency", 1.0))
        for k in BOUNDED_01:
            v = self.pcie_efficiency if k == "pcie_efficiency" else values[k]
            if not 0.0 < v <= 1.0:
                raise ValueError(f"{k} must be in (0, 1], got {v!r}")
        for k, v in values.items():
            if v < 0 or not np.isfinite(v):
                raise ValueError(f"{k} must be a finite number >= 0, got {v!r}")
        self.values = values
        if self.weight_bytes_per_gpu >= self.gpu.memory_bytes:
            raise ValueError(
                f"{m.key} weights need {self.weight_bytes_per_gpu / 2**30:.1f} GiB per GPU at "
                f"tp={self.tp} ({self.dtype}), more than the {self.gpu.memory_gib:g} GiB of "
                f"{self.gpu.key}; use a larger tp or GPU")
        self.params = self._build_params()

    @staticmethod
    def _named_calibration(name: str) -> dict[str, Any]:
        for e in calibrations():
            if e.get("name") == name:
                return dict(e)
        names = sorted(e.get("name", "") for e in calibrations())
        raise KeyError(f"unknown calibration {name!r}; known: {', '.join(names)}")

    # ---- sizes ---------------------------------------------------------------------
    @property
    def bytes_per_weight(self) -> float:
        """Bytes of one weight at ``dtype`` (routed experts may differ: ``LLMSpec.expert_dtype``)."""
        from lpserve.cost.catalog import DTYPE_BYTES

        return DTYPE_BYTES[self.dtype]

    @property
    def kv_dtype_bytes(self) -> float:
        """Bytes of one KV-cache element (``kv_dtype``: the model's, else the weight dtype)."""
        from lpserve.cost.catalog import DTYPE_BYTES

        return DTYPE_BYTES[self.kv_dtype]

    @property
    def weight_bytes_per_gpu(self) -> float:
        """All weights of the model on one GPU (embeddings and LM head included; routed
        experts at their own dtype where the model stores them in another)."""
        return self.llm.weight_bytes(self.dtype) / self.tp

    @property
    def kv_heads_per_gpu(self) -> float:
        """KV heads one GPU holds (replicated when tp exceeds them); latent attention keeps
        its one latent per token on every GPU, counted as 1."""
        if self.llm.attention == "mla":
            return 1.0
        return max(self.llm.kv_heads / self.tp, 1.0)

    @property
    def kv_layer_bytes_per_gpu(self) -> float:
        """models/cost-model.md (11): KV bytes one token holds in one layer on one GPU:
        2 max(K/tp, 1) d b (grouped-query) or (kv_lora_rank + qk_rope_head_dim) b (latent,
        replicated on every GPU)."""
        m = self.llm
        if m.attention == "mla":
            return m.kv_elems_per_token_layer * self.kv_dtype_bytes
        return 2.0 * self.kv_heads_per_gpu * m.head_dim * self.kv_dtype_bytes

    @property
    def kv_bytes_per_token_per_gpu(self) -> float:
        """models/cost-model.md (11): KV bytes one more token of a long context puts on one
        GPU (the layers :attr:`LLMSpec.kv_bytes_per_token` counts)."""
        m = self.llm
        return (m.full_attention_layers or m.sliding_layers) * self.kv_layer_bytes_per_gpu

    @property
    def kv_bytes_per_token(self) -> float:
        """models/cost-model.md (11): KV bytes per token over the whole replica (replicated
        heads and latents counted on every GPU)."""
        return self.kv_bytes_per_token_per_gpu * self.tp

    def kv_capacity_tokens(self, gpu_memory_fraction: float = 0.9) -> int:
        """models/cost-model.md (12): floor((f x memory - weights) / KV bytes), per GPU."""
        f = self._check_fraction(gpu_memory_fraction)
        free = f * self.gpu.memory_bytes - self.weight_bytes_per_gpu
        if free <= 0:
            raise ValueError(
                f"{self.llm.key} weights ({self.weight_bytes_per_gpu / 2**30:.1f} GiB per GPU at "
                f"tp={self.tp}) exceed gpu_memory_fraction={f} of {self.gpu.key} "
                f"({f * self.gpu.memory_gib:.1f} GiB)")
        return int(free // self.kv_bytes_per_token_per_gpu)

    def swap_time_s(self, n_blocks: int, block_tokens: int = 16) -> float:
        """models/cost-model.md (13): each GPU moves its KV shard over its own PCIe link."""
        n = self._check_count(n_blocks, "n_blocks")
        b = self._check_count(block_tokens, "block_tokens")
        bw = self.gpu.pcie_gbps / 2.0 * 1e9 * self.pcie_efficiency
        return n * b * self.kv_bytes_per_token_per_gpu / bw

    def kv_quantize_time_s(self, n_blocks: int, block_tokens: int = 16,
                           compression_ratio: float = 4.0) -> float:
        """models/kv-compression-swap.md (3): seconds to quantize (or dequantize) the KV of
        ``n_blocks`` blocks on the GPU by ``compression_ratio``; memory-bound, each GPU
        reads and writes its shard (full plus compressed bytes) at the KV bandwidth
        (peak HBM x ``eff_kv``)."""
        n = self._check_count(n_blocks, "n_blocks")
        b = self._check_count(block_tokens, "block_tokens")
        r = check_ratio(compression_ratio)
        bw = self.gpu.hbm_gbps * 1e9 * self.values["eff_kv"]
        return n * b * self.kv_bytes_per_token_per_gpu * (1.0 + 1.0 / r) / bw

    def default_link_gbps(self) -> float:
        """One-way GB/s between replicas: NVLink (else PCIe) of each of the tp GPUs."""
        per_gpu = self.gpu.nvlink_gbps if self.gpu.nvlink_gbps > 0 else self.gpu.pcie_gbps
        return self.tp * per_gpu / 2.0

    def transfer_time_s(self, n_tokens: int, link_gbps: float | None = None) -> float:
        """models/cost-model.md (14): KV of ``n_tokens`` over a link of ``link_gbps`` GB/s."""
        n = self._check_count(n_tokens, "n_tokens")
        bw = self.default_link_gbps() if link_gbps is None else float(link_gbps)
        if not bw > 0:
            raise ValueError(f"link_gbps must be > 0, got {link_gbps!r}")
        return n * self.kv_bytes_per_token / (bw * 1e9)

    # ---- params --------------------------------------------------------------------
    def _build_params(self) -> np.ndarray:
        m, tp, b = self.llm, float(self.tp), float(self.bytes_per_weight)
        v = self.values
        p = np.zeros(K.N_ANALYTIC_PARAMS)
        p[K.P_KIND] = K.KIND_ANALYTIC
        p[K.P_LAYERS] = m.layers
        p[K.P_TP] = tp
        p[K.P_HIDDEN] = m.hidden
        from lpserve.cost.catalog import DTYPE_BYTES

        # per-layer averages: dense MLPs of an MoE model's leading layers and its experts
        # spread over all L layers (exact in FLOPs and bytes summed over the layers)
        moe_share = m.moe_layers / m.layers
        dense = m.attn_params_per_layer + (m.layers - m.moe_layers) / m.layers * m.dense_mlp_params
        dense += moe_share * (m.shared_experts * m.mlp_params_per_expert + m.hidden * m.experts)
        b_e = DTYPE_BYTES[m.expert_dtype or self.dtype]
        p[K.P_LIN_FLOPS] = 2.0 * dense / tp
        p[K.P_LIN_BYTES] = dense * b / tp
        p[K.P_MOE_EXPERTS] = m.experts
        p[K.P_MOE_TOPK] = m.top_k
        p[K.P_MOE_FLOPS] = moe_share * 2.0 * m.mlp_params_per_expert / tp if m.experts else 0.0
        p[K.P_MOE_BYTES] = moe_share * m.mlp_params_per_expert * b_e / tp if m.experts else 0.0
        p[K.P_HEAD_FLOPS] = 2.0 * m.vocab * m.hidden / tp
        p[K.P_HEAD_BYTES] = m.vocab * m.hidden * b / tp
        p[K.P_ATTN_FLOPS] = m.attn_flops_per_pair / tp
        p[K.P_KV_BYTES] = self.kv_layer_bytes_per_gpu
        p[K.P_PEAK_FLOPS] = self.peak_flops
        p[K.P_PEAK_BW] = self.gpu.hbm_gbps * 1e9
        for name, idx in CALIBRATED.items():
            p[idx] = v[name]
        link = self.gpu.nvlink_gbps if self.gpu.nvlink_gbps > 0 else self.gpu.pcie_gbps
        p[K.P_AR_BW] = v["ar_link_efficiency"] * link / 2.0 * 1e9
        p[K.P_ACT_BYTES] = 2.0
        return p

    # ---- breakdown -----------------------------------------------------------------
    def breakdown(self, prefill_tokens: ArrayLike = (), prefill_cached: ArrayLike | None = None,
                  decode_context: ArrayLike = ()) -> dict[str, Any]:
        """``time_s`` and its parts, with ``*_bound`` naming what limits each part.

        ``linear_bound`` / ``attention_bound`` are ``"compute"`` or ``"memory"``;
        ``communication_bound`` is ``"latency"`` or ``"bandwidth"`` (``"none"`` at tp=1).
        Also ``roofline_s``: max(FLOPs / peak FLOP/s, bytes / peak bandwidth) of the batch.
        """
        pt, pc, dc = check_batch(prefill_tokens, prefill_cached, decode_context)
        parts = K.analytic_parts_ref(self.params, pt, pc, dc)
        out = {k: parts[k] for k in ("time_s", "linear_s", "attention_s", "communication_s",
                                     "overhead_s")}
        out["linear_bound"] = ("compute" if parts["linear_compute_s"] > parts["linear_memory_s"]
                               else "memory")
        out["attention_bound"] = ("compute" if parts["attention_compute_s"]
                                  > parts["attention_memory_s"] else "memory")
        if self.tp == 1 or parts["communication_s"] == 0:
            out["communication_bound"] = "none"
        else:
            out["communication_bound"] = ("latency" if parts["comm_latency_s"]
                                          >= 0.5 * parts["communication_s"] else "bandwidth")
        flops, nbytes = self.roofline_work(pt, pc, dc)
        out["flops"] = flops
        out["bytes"] = nbytes
        out["roofline_s"] = max(flops / self.peak_flops, nbytes / (self.gpu.hbm_gbps * 1e9))
        return out

    def roofline_work(self, prefill_tokens: ArrayLike, prefill_cached: ArrayLike | None,
                      decode_context: ArrayLike) -> tuple[float, float]:
        """models/cost-model.md (9): (FLOPs, HBM bytes) of the batch on one GPU."""
        pt, pc, dc = check_batch(prefill_tokens, prefill_cached, decode_context)
        p = self.params
        live = pt > 0
        n_tokens = float(pt.sum() + dc.size)
        n_seqs = float(live.sum() + dc.size)
        if n_tokens == 0:
            return 0.0, 0.0
        L = p[K.P_LAYERS]
        f_tok, w = p[K.P_LIN_FLOPS], p[K.P_LIN_BYTES]
        if p[K.P_MOE_EXPERTS] > 0:
            e, k = p[K.P_MOE_EXPERTS], p[K.P_MOE_TOPK]
            w += e * (1.0 - (1.0 - k / e) ** n_tokens) * p[K.P_MOE_BYTES]
            f_tok += k * p[K.P_MOE_FLOPS]
        c = pt[live].astype(float)
        h = pc[live].astype(float)
        attn_pairs = float((c * (h + c)).sum() + dc.sum())
        flops = (L * f_tok * n_tokens + p[K.P_HEAD_FLOPS] * n_seqs
                 + L * p[K.P_ATTN_FLOPS] * attn_pairs)
        kv_tokens = float((h + c).sum() + dc.sum())
        nbytes = L * w + p[K.P_HEAD_BYTES] + L * p[K.P_KV_BYTES] * kv_tokens
        return flops, nbytes

    def __repr__(self) -> str:
        return (f"AnalyticCost(gpu={self.gpu.key!r}, llm={self.llm.key!r}, tp={self.tp}, "
                f"dtype={self.dtype!r}, calibration={self.calibration.get('name')!r})")
