"""GPU and LLM catalog: datasheet and ``config.json`` figures, with their sources.

The built-in entries live in ``lpserve/data/gpus.toml`` and ``lpserve/data/llms.toml``.
Users add their own with :func:`load_catalog_file` (a TOML file with ``[gpu.<key>]`` and
``[llm.<key>]`` tables) or :func:`llm_from_hf_config` (a Hugging Face ``config.json`` on
disk); :func:`register_gpu` / :func:`register_llm` make an entry known by name.
"""
from __future__ import annotations

import json
import tomllib
from dataclasses import asdict, dataclass, fields
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1}


@dataclass(frozen=True)
class GPUSpec:
    """One GPU model. Bandwidths in GB/s (10^9 bytes/s), NVLink/PCIe bidirectional."""

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

    def __post_init__(self) -> None:
        for f in ("bf16_tflops", "hbm_gbps", "memory_gib", "pcie_gbps"):
            v = getattr(self, f)
            if not (isinstance(v, (int, float)) and v > 0):
                raise ValueError(f"GPU {self.key!r}: {f} must be > 0, got {v!r}")
        for f in ("fp8_tflops", "nvlink_gbps"):
            v = getattr(self, f)
            if not (isinstance(v, (int, float)) and v >= 0):
                raise ValueError(f"GPU {self.key!r}: {f} must be >= 0, got {v!r}")

    @property
    def memory_bytes(self) -> float:
        return self.memory_gib * 2.0**30

    def peak_flops(self, dtype: str) -> float:
        """Dense peak FLOP/s for weights of ``dtype``."""
        if dtype == "fp8":
            if self.fp8_tflops <= 0:
                raise ValueError(f"GPU {self.key!r} has no FP8 tensor cores (dtype='fp8')")
            return self.fp8_tflops * 1e12
        return self.bf16_tflops * 1e12


@dataclass(frozen=True)
class LLMSpec:
    """One decoder-only LLM's shape (Hugging Face ``config.json`` names in comments)."""

    key: str
    layers: int          # num_hidden_layers
    hidden: int          # hidden_size
    heads: int           # num_attention_heads
    kv_heads: int        # num_key_value_heads
    head_dim: int
    ffn: int             # intermediate_size (per expert for MoE)
    vocab: int           # vocab_size
    gated: bool = True   # SwiGLU three-matrix MLP
    tied: bool = False   # tie_word_embeddings
    experts: int = 0     # num_local_experts (0 = dense)
    top_k: int = 0       # num_experts_per_tok
    dtype: str = "fp16"
    source: str = ""

    def __post_init__(self) -> None:
        for f in ("layers", "hidden", "heads", "kv_heads", "head_dim", "ffn", "vocab"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"LLM {self.key!r}: {f} must be a positive integer, got {v!r}")
        if self.heads % self.kv_heads:
            raise ValueError(f"LLM {self.key!r}: heads={self.heads} is not a multiple of "
                             f"kv_heads={self.kv_heads}")
        if self.experts < 0 or (self.experts > 0 and not 1 <= self.top_k <= self.experts):
            raise ValueError(f"LLM {self.key!r}: need 1 <= top_k <= experts, got "
                             f"experts={self.experts}, top_k={self.top_k}")
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"LLM {self.key!r}: dtype must be one of {sorted(DTYPE_BYTES)}, "
                             f"got {self.dtype!r}")

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def attn_params_per_layer(self) -> int:
        """Weights of q, k, v and output projections of one layer (elements)."""
        q = self.heads * self.head_dim
        kv = 2 * self.kv_heads * self.head_dim
        return self.hidden * (q + kv) + q * self.hidden

    @property
    def mlp_params_per_expert(self) -> int:
        """Weights of one MLP (one expert for MoE) of one layer (elements)."""
        return (3 if self.gated else 2) * self.hidden * self.ffn

    @property
    def n_params(self) -> int:
        """Total weights (elements), embeddings included once when tied."""
        mlp = self.mlp_params_per_expert * max(self.experts, 1)
        router = self.hidden * self.experts
        emb = self.vocab * self.hidden * (1 if self.tied else 2)
        return self.layers * (self.attn_params_per_layer + mlp + router) + emb


_USER_GPUS: dict[str, GPUSpec] = {}
_USER_LLMS: dict[str, LLMSpec] = {}


def _gpu_from_table(key: str, t: dict[str, Any]) -> GPUSpec:
    names = {f.name for f in fields(GPUSpec)} - {"key"}
    unknown = set(t) - names
    if unknown:
        raise ValueError(f"GPU {key!r}: unknown fields {sorted(unknown)}; known: {sorted(names)}")
    missing = names - set(t) - {"family", "name", "source", "fp8_tflops", "nvlink_gbps"}
    if missing:
        raise ValueError(f"GPU {key!r}: missing fields {sorted(missing)}")
    data = {"name": key, "family": key, "source": "user", "fp8_tflops": 0.0, "nvlink_gbps": 0.0}
    data.update(t)
    return GPUSpec(key=key, **{k: (float(v) if k not in ("name", "family", "source") else v)
                               for k, v in data.items()})


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

    Understands Llama/Mistral/Mixtral/Qwen2 names (``num_hidden_layers``, ``hidden_size``,
    ``num_attention_heads``, ``num_key_value_heads``, ``intermediate_size``,
    ``num_local_experts``), OPT (``ffn_dim``, ``word_embed_proj_dim``) and BLOOM
    (``n_layer``, ``n_head``). fp32 checkpoints are served as fp16.
    """
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    cfg = json.loads(p.read_text())
    key = key or cfg.get("_name_or_path") or p.parent.name

    def pick(*names: str, default: Any = None) -> Any:
        for n in names:
            if n in cfg and cfg[n] is not None:
                return cfg[n]
        if default is None:
            raise ValueError(f"config {str(p)!r}: none of {names} present")
        return default

    layers = int(pick("num_hidden_layers", "n_layer", "num_layers"))
    hidden = int(pick("hidden_size", "n_embd", "d_model"))
    heads = int(pick("num_attention_heads", "n_head"))
    kv_heads = int(pick("num_key_value_heads", default=heads))
    head_dim = int(pick("head_dim", default=hidden // heads))
    arch = " ".join(cfg.get("architectures", [])) + " " + str(cfg.get("model_type", ""))
    gated = not any(s in arch.lower() for s in ("opt", "bloom", "gpt2", "falcon"))
    ffn = int(pick("intermediate_size", "ffn_dim", default=4 * hidden))
    spec = LLMSpec(
        key=str(key), layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads,
        head_dim=head_dim, ffn=ffn, vocab=int(pick("vocab_size")), gated=gated,
        tied=bool(cfg.get("tie_word_embeddings", not gated)),
        experts=int(cfg.get("num_local_experts", 0) or 0),
        top_k=int(cfg.get("num_experts_per_tok", 0) or 0),
        dtype=_HF_DTYPES.get(str(cfg.get("torch_dtype", "float16")), "fp16"),
        source=f"config.json at {p}",
    )
    if register:
        register_llm(spec)
    return spec


def spec_dict(spec: GPUSpec | LLMSpec) -> dict[str, Any]:
    """Plain dict of a spec (for JSON output)."""
    return asdict(spec)
