"""The analytic (calibrated roofline) cost model; math in ``models/cost-model.md``."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from lpserve.cost import _kernels as K
from lpserve.cost.base import ArrayLike, CostModel, check_batch, check_ratio
from lpserve.cost.calibration import calibration_for, calibrations, resolve
from lpserve.cost.catalog import GPUSpec, LLMSpec, get_gpu, get_llm
from lpserve.cost.links import get_engine, get_link

__all__ = ["AnalyticCost", "CALIBRATED", "LINK_PARAMETERS", "VALID_TP", "calibration_for",
           "calibrations"]

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
    "layer_overhead_s": K.P_LAYER_OVERHEAD_S,
    "iter_overhead_s": K.P_ITER_OVERHEAD_S,
    "seq_overhead_s": K.P_SEQ_OVERHEAD_S,
}
# communication: a calibration may fix them; otherwise the interconnect's defaults for the
# engine's algorithm (links.toml). Bandwidths are efficiency x one-way link bandwidth.
LINK_PARAMETERS = ("ar_fixed_s", "ar_latency_s", "ar_link_efficiency", "a2a_fixed_s",
                   "a2a_link_efficiency")
# the replica's expert layout (not calibrated): expert-parallel degree and load imbalance
MOE_LAYOUT = ("ep", "moe_imbalance")
OTHER_OVERRIDES = ("dtype", "kv_dtype", "pcie_efficiency", "calibration")
# terms around the engine, fitted to serving measurements (models/simulator.md (33)):
# a calibration may set them; absent, 0
SERVING_TERMS = ("frontend_latency_s",)
BOUNDED_01 = ("eff_compute", "eff_weights", "eff_attn", "eff_kv", "ar_link_efficiency",
              "a2a_link_efficiency", "pcie_efficiency")


def link_defaults(gpu: GPUSpec, engine: str) -> dict[str, float]:
    """Communication parameters of ``gpu``'s interconnect under ``engine``'s algorithm."""
    link = get_link(gpu.interconnect)
    fixed, step, eff = link.all_reduce(get_engine(engine).all_reduce)
    return {"ar_fixed_s": fixed, "ar_latency_s": step, "ar_link_efficiency": eff,
            "a2a_fixed_s": link.a2a_fixed_s, "a2a_link_efficiency": link.a2a_efficiency}


class AnalyticCost(CostModel):
    """Calibrated roofline of one replica: ``gpu`` x ``llm`` at tensor-parallel ``tp``.

    ``engine`` (``"vllm"``, ``"trtllm"``, ``"sglang"``, ``"kernels"``; see
    ``lpserve/data/engines.toml``) selects that engine's calibrations; ``None`` keeps the
    package's default set (operator profiles on A100, vLLM-based engine fits where they
    exist), and ``self.engine`` then names the engine of the entry used. Parameters beyond
    the catalog (efficiencies, overheads) come from the calibration that best matches the
    pair; communication parameters it leaves out come from the GPU's interconnect
    (``links.toml``) for the engine's all-reduce algorithm. Any of them can be overridden
    by keyword (names in ``CALIBRATED`` and ``LINK_PARAMETERS``), as can ``calibration``
    (a shipped calibration's name, or a TOML file written by ``lpserve calibrate``),
    ``dtype`` (``"fp16"``, ``"bf16"``, ``"fp8"``: weights and activations; routed experts
    stored in another dtype, such as gpt-oss's MXFP4, keep it), ``kv_dtype`` (KV-cache
    elements; default the model's ``kv_dtype``, else ``dtype``) and ``pcie_efficiency``
    (share of PCIe peak reached by swaps; default 1.0, since no swap timing is in the
    calibration data). For mixture-of-experts models, ``ep`` is the expert-parallel degree
    (1: every GPU holds a 1/tp slice of every expert; tp: each holds whole experts, and
    tokens travel to them by all-to-all) and ``moe_imbalance`` the most loaded GPU's share
    of routed tokens over the mean (>= 1; 1 is uniform routing). ``frontend_latency_s``
    (seconds the serving front end adds around the engine, ``models/simulator.md`` (33))
    comes from the calibration (0 in those fitted to iteration timings) or by keyword.
    """

    kind = K.KIND_ANALYTIC

    def __init__(self, gpu: str | GPUSpec = "a100-80gb", llm: str | LLMSpec = "llama-2-7b",
                 tp: int = 1, engine: str | None = None, **overrides: Any) -> None:
        self.gpu = get_gpu(gpu)
        self.llm = get_llm(llm)
        known = (set(CALIBRATED) | set(LINK_PARAMETERS) | set(MOE_LAYOUT) | set(OTHER_OVERRIDES)
                 | set(SERVING_TERMS))
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
        if engine is not None:
            spec = get_engine(engine)
            if self.gpu.vendor not in spec.vendors:
                raise ValueError(f"engine {engine!r} ({spec.name}) does not run on "
                                 f"{self.gpu.vendor} GPUs ({self.gpu.key}); it supports "
                                 f"{', '.join(spec.vendors)}")
        from lpserve.cost.catalog import MODEL_DTYPES
        self.dtype = overrides.get("dtype", m.dtype)
        self.kv_dtype = overrides.get("kv_dtype", m.kv_dtype or self.dtype)
        for name, v in (("dtype", self.dtype), ("kv_dtype", self.kv_dtype)):
            if v not in MODEL_DTYPES:
                raise ValueError(f"{name} must be one of {MODEL_DTYPES}, got {v!r}")
        self.peak_flops = self.gpu.peak_flops(self.dtype)
        if "calibration" in overrides:
            calib = resolve(overrides["calibration"], self.gpu, m, engine,
                            fields=(*CALIBRATED, *LINK_PARAMETERS, *SERVING_TERMS))
            if engine is not None and calib.get("engine") != engine:
                raise ValueError(f"calibration {calib.get('name')!r} stands for engine "
                                 f"{calib.get('engine')!r}, not {engine!r}")
        else:
            try:
                calib = calibration_for(self.gpu, m, engine)
            except LookupError:
                if engine is None or not all(k in overrides for k in CALIBRATED):
                    raise
                # every calibrated value given (a fit in progress): no entry needed
                calib = {"name": "given", "gpu": self.gpu.key, "llm": m.key, "engine": engine}
        self.calibration = calib
        self.engine = str(calib.get("engine", engine or "kernels"))
        base = calib
        missing = [k for k in CALIBRATED if k not in calib and k not in overrides]
        if missing:  # a user's file fixes some parameters: the rest from the engine's default
            base = {**calibration_for(self.gpu, m, self.engine), **calib}
        merged = {**link_defaults(self.gpu, self.engine), **base,
                  **{k: v for k, v in overrides.items() if k in CALIBRATED or k in LINK_PARAMETERS}}
        values = {k: float(merged[k]) for k in (*CALIBRATED, *LINK_PARAMETERS)}
        self.pcie_efficiency = float(overrides.get("pcie_efficiency", 1.0))
        for k in BOUNDED_01:
            v = self.pcie_efficiency if k == "pcie_efficiency" else values[k]
            if not 0.0 < v <= 1.0:
                raise ValueError(f"{k} must be in (0, 1], got {v!r}")
        for k, v in values.items():
            if v < 0 or not np.isfinite(v):
                raise ValueError(f"{k} must be a finite number >= 0, got {v!r}")
        self.values = values
        front = overrides.get("frontend_latency_s", calib.get("frontend_latency_s", 0.0))
        if (isinstance(front, bool) or not isinstance(front, (int, float, np.number))
                or not (math.isfinite(front) and front >= 0)):
            raise ValueError(f"frontend_latency_s must be a finite number >= 0 (seconds), got "
                             f"{front!r}"[:200])
        self.frontend_latency_s = float(front)
        self.ep = overrides.get("ep", 1)
        if isinstance(self.ep, bool) or self.ep not in (1, self.tp):
            raise ValueError(f"ep must be 1 or tp={self.tp}, got {self.ep!r}")
        if self.ep > 1 and (not m.experts or m.experts % self.ep):
            raise ValueError(f"ep={self.ep} needs a mixture-of-experts model whose experts it "
                             f"divides; {m.key} has {m.experts}")
        self.moe_imbalance = float(overrides.get("moe_imbalance", 1.0))
        if not (math.isfinite(self.moe_imbalance) and self.moe_imbalance >= 1.0):
            raise ValueError(f"moe_imbalance must be a finite number >= 1, got "
                             f"{overrides.get('moe_imbalance')!r}")
        if self.weight_bytes_per_gpu >= self.gpu.memory_bytes:
            raise ValueError(
                f"{m.key} weights need {self.weight_bytes_per_gpu / 2**30:.1f} GiB per GPU at "
                f"tp={self.tp} ({self.dtype}), more than the {self.gpu.memory_gib:g} GiB of "
                f"{self.gpu.key}; use a larger tp or GPU")
        self.params = self._build_params()

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

    def swap_times_s(self, n_blocks: np.ndarray, block_tokens: int = 16) -> np.ndarray:
        """:meth:`swap_time_s` for an int64 ``(K,)`` array of counts, float64 ``(K,)``
        (the same floats: the same operations in the same order)."""
        n = self._check_counts(n_blocks, "n_blocks")
        b = self._check_count(block_tokens, "block_tokens")
        bw = self.gpu.pcie_gbps / 2.0 * 1e9 * self.pcie_efficiency
        return n * b * self.kv_bytes_per_token_per_gpu / bw

    def kv_quantize_times_s(self, n_blocks: np.ndarray, block_tokens: int = 16,
                            compression_ratio: float = 4.0) -> np.ndarray:
        """:meth:`kv_quantize_time_s` for an int64 ``(K,)`` array of counts, float64
        ``(K,)`` (the same floats as the scalar)."""
        n = self._check_counts(n_blocks, "n_blocks")
        b = self._check_count(block_tokens, "block_tokens")
        r = check_ratio(compression_ratio)
        bw = self.gpu.hbm_gbps * 1e9 * self.values["eff_kv"]
        return n * b * self.kv_bytes_per_token_per_gpu * (1.0 + 1.0 / r) / bw

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
        from lpserve.cost.catalog import DTYPE_BYTES

        m, tp, b = self.llm, float(self.tp), float(self.bytes_per_weight)
        v = self.values
        p = np.zeros(K.N_ANALYTIC_PARAMS)
        p[K.P_KIND] = K.KIND_ANALYTIC
        p[K.P_LAYERS] = m.layers
        p[K.P_TP] = tp
        p[K.P_HIDDEN] = m.hidden
        # (2): every layer's attention projections; a dense model's MLP with them; an MoE
        # model's leading dense layers add their MLP, its MoE layers shared experts, router
        # and the routed experts they touch
        common = m.attn_params_per_layer + (m.dense_mlp_params if not m.experts else 0)
        p[K.P_LIN_FLOPS] = 2.0 * common / tp
        p[K.P_LIN_BYTES] = common * b / tp
        p[K.P_MOE_LAYERS] = m.moe_layers
        if m.experts:
            b_e = DTYPE_BYTES[m.expert_dtype or self.dtype]
            dense_mlp = m.dense_mlp_params if m.dense_layers else 0
            shared = m.shared_experts * m.mlp_params_per_expert + m.hidden * m.experts
            p[K.P_DENSE_MLP_FLOPS] = 2.0 * dense_mlp / tp
            p[K.P_DENSE_MLP_BYTES] = dense_mlp * b / tp
            p[K.P_MOE_SHARED_FLOPS] = 2.0 * shared / tp
            p[K.P_MOE_SHARED_BYTES] = shared * b / tp
            p[K.P_MOE_EXPERTS] = m.experts
            p[K.P_MOE_TOPK] = m.top_k
            p[K.P_MOE_FLOPS] = 2.0 * m.mlp_params_per_expert / tp
            p[K.P_MOE_BYTES] = m.mlp_params_per_expert * b_e / tp
        p[K.P_EP] = self.ep
        p[K.P_MOE_IMBALANCE] = self.moe_imbalance
        p[K.P_HEAD_FLOPS] = 2.0 * m.vocab * m.hidden / tp
        p[K.P_HEAD_BYTES] = m.vocab * m.hidden * b / tp
        p[K.P_ATTN_FLOPS] = m.attn_flops_per_pair / tp
        p[K.P_DA_FLOPS] = m.decode_attn_flops_per_pair / tp
        p[K.P_KV_BYTES] = self.kv_layer_bytes_per_gpu
        p[K.P_SLIDE_LAYERS] = m.sliding_layers
        p[K.P_WINDOW] = m.sliding_window
        p[K.P_PEAK_FLOPS] = self.peak_flops
        p[K.P_PEAK_BW] = self.gpu.hbm_gbps * 1e9
        for name, idx in CALIBRATED.items():
            p[idx] = v[name]
        link = get_link(self.gpu.interconnect)
        p[K.P_AR_FIXED_S] = v["ar_fixed_s"]
        p[K.P_AR_LATENCY_S] = v["ar_latency_s"]
        p[K.P_AR_BW] = v["ar_link_efficiency"] * link.one_way_gbps(self.gpu, self.tp) * 1e9
        p[K.P_A2A_FIXED_S] = v["a2a_fixed_s"]
        p[K.P_A2A_BW] = v["a2a_link_efficiency"] * link.one_way_gbps(self.gpu, self.ep) * 1e9
        p[K.P_ACT_BYTES] = 2.0
        return p

    # ---- breakdown -----------------------------------------------------------------
    def named_params(self) -> dict[str, float]:
        """The kernel's parameters by name (``models/cost-model.md`` symbol table): the
        ``P_*`` layout of ``lpserve.cost._kernels`` lower-cased without the prefix, e.g.
        ``"layers"``, ``"lin_bytes"``, ``"eff_kv"``; units as there (bytes, FLOP, s)."""
        return {n[2:].lower(): float(self.params[getattr(K, n)]) for n in dir(K)
                if n.startswith("P_") and n != "P_KIND"}

    def breakdown(self, prefill_tokens: ArrayLike = (), prefill_cached: ArrayLike | None = None,
                  decode_context: ArrayLike = ()) -> dict[str, Any]:
        """``time_s`` and its parts, with ``*_bound`` naming what limits each part.

        ``linear_bound`` / ``attention_bound`` are ``"compute"`` or ``"memory"``;
        ``communication_bound`` is ``"latency"`` or ``"bandwidth"`` (``"none"`` at tp=1);
        ``all_to_all_s`` is the part of ``communication_s`` spent in MoE dispatch and combine.
        Also ``roofline_s``: max(FLOPs / peak FLOP/s, bytes / peak bandwidth) of the batch.
        """
        pt, pc, dc = check_batch(prefill_tokens, prefill_cached, decode_context)
        parts = K.analytic_parts_ref(self.params, pt, pc, dc)
        out = {k: parts[k] for k in ("time_s", "linear_s", "attention_s", "communication_s",
                                     "all_to_all_s", "overhead_s")}
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
        """models/cost-model.md (9): (FLOPs, HBM bytes) of the batch on one GPU (routed
        experts at their expected touched count under uniform routing)."""
        pt, pc, dc = check_batch(prefill_tokens, prefill_cached, decode_context)
        p = self.params
        live = pt > 0
        n_tokens = float(pt.sum() + dc.size)
        n_seqs = float(live.sum() + dc.size)
        if n_tokens == 0:
            return 0.0, 0.0
        L, L_moe = p[K.P_LAYERS], p[K.P_MOE_LAYERS]
        f_dense = p[K.P_LIN_FLOPS] + p[K.P_DENSE_MLP_FLOPS]
        w_dense = p[K.P_LIN_BYTES] + p[K.P_DENSE_MLP_BYTES]
        flops = (L - L_moe) * f_dense * n_tokens + p[K.P_HEAD_FLOPS] * n_seqs
        nbytes = (L - L_moe) * w_dense + p[K.P_HEAD_BYTES]
        if L_moe > 0:
            e, k = p[K.P_MOE_EXPERTS], p[K.P_MOE_TOPK]
            touched = e * (1.0 - (1.0 - k / e) ** n_tokens)
            flops += L_moe * ((p[K.P_LIN_FLOPS] + p[K.P_MOE_SHARED_FLOPS]) * n_tokens
                              + k * p[K.P_MOE_FLOPS] * n_tokens)
            nbytes += L_moe * (p[K.P_LIN_BYTES] + p[K.P_MOE_SHARED_BYTES] + touched * p[K.P_MOE_BYTES])
        c = pt[live].astype(float)
        h = pc[live].astype(float)
        x = dc.astype(float)
        slide, w = p[K.P_SLIDE_LAYERS], p[K.P_WINDOW]
        keys_w, x_w = (np.minimum(h + c, w), np.minimum(x, w)) if slide else (h + c, x)
        flops += ((L - slide) * p[K.P_ATTN_FLOPS] * float((c * (h + c)).sum())
                  + slide * p[K.P_ATTN_FLOPS] * float((c * keys_w).sum())
                  + (L - slide) * p[K.P_DA_FLOPS] * float(x.sum())
                  + slide * p[K.P_DA_FLOPS] * float(x_w.sum()))
        nbytes += p[K.P_KV_BYTES] * ((L - slide) * float((h + c).sum() + x.sum())
                                     + slide * float(keys_w.sum() + x_w.sum()))
        return flops, nbytes

    def __repr__(self) -> str:
        return (f"AnalyticCost(gpu={self.gpu.key!r}, llm={self.llm.key!r}, tp={self.tp}, "
                f"engine={self.engine!r}, dtype={self.dtype!r}, "
                f"calibration={self.calibration.get('name')!r})")
