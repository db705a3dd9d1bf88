"""Measured calibration data as rows (see :mod:`lpserve.cost.fit` for the row format).

The package ships small copies in ``lpserve/data/calibration`` (licenses in the README
there); :meth:`CalibrationData.from_dir` reads the same files from another folder, and
:meth:`CalibrationData.from_shared` reads the original layout of a full calibration
folder (Vidur's ``attention_samples/`` and ``profiling/`` tree).
"""
from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Callable

SPLITWISE_HARDWARE = {"a100-80gb": "a100-80gb", "h100-80gb": "h100-sxm"}
SPLITWISE_LLM = {"llama2-70b": "llama-2-70b", "bloom-176b": "bloom-176b"}
# the source's caveat: prompt time below batch 32's, probably an OOM fallback
SPLITWISE_EXCLUDED = {("llama2-70b", "a100-80gb", 2, 512, 64, 128)}


@dataclass(frozen=True)
class CalibrationData:
    """Reader of the calibration CSVs: ``read(name)`` returns the file's text."""

    read: Callable[[str], str]
    origin: str

    @classmethod
    def packaged(cls) -> "CalibrationData":
        """The summaries shipped inside the package (``lpserve/data/calibration``)."""
        base = resources.files("lpserve") / "data" / "calibration"
        return cls(read=lambda n: (base / n).read_text(), origin="lpserve/data/calibration")

    @classmethod
    def from_dir(cls, path: str | Path) -> "CalibrationData":
        """Calibration CSVs under ``path``, read by their package file names (no
        fallback: a missing file raises when it is read)."""
        base = Path(path)
        return cls(read=lambda n: (base / n).read_text(), origin=str(base))

    @classmethod
    def from_shared(cls, path: str | Path) -> "CalibrationData":
        """A calibration folder in its original layout (falls back to package copies for
        files that only exist as summaries inside the package)."""
        base = Path(path)
        names = {
            "vidur_a100_llama2_7b_prefill_attention_tp1.csv": "vidur/attention_samples/prefill_tp1.csv",
            "vidur_a100_llama2_7b_decode_attention_tp1.csv": "vidur/attention_samples/decode_tp1.csv",
        }
        packaged = cls.packaged()

        def read(n: str) -> str:
            if n == "nccl_a100_dgx_all_reduce_summary.csv":
                full = base / "vidur/profiling/network/a100_dgx/all_reduce.csv"
                if full.exists():
                    return _summarise_all_reduce(full.read_text())
            p = base / names.get(n, n)
            return p.read_text() if p.exists() else packaged.read(n)

        return cls(read=read, origin=str(base))

    def _rows(self, name: str) -> list[dict[str, str]]:
        return list(csv.DictReader(io.StringIO(self.read(name))))

    # ---- row builders ------------------------------------------------------------------
    def vidur_linear_rows(self) -> list[dict[str, Any]]:
        """Per-layer linear+norm ops of Llama-2-7B on A100 at TP 1/2/4/8."""
        return [{"scope": "layer_linear", "source": "vidur", "engine": "kernels", "tp": int(r["tp"]),
                 "prefill_tokens": int(r["tokens"]), "prefill_chunks": 1,
                 "measured_s": float(r["linear_ms_per_layer"]) * 1e-3,
                 "phase": "prefill" if int(r["tokens"]) >= 128 else "decode",
                 "gpu": "a100-80gb", "llm": "llama-2-7b",
                 "point": f"vidur-linear-tp{r['tp']}-n{r['tokens']}"}
                for r in self._rows("vidur_a100_llama2_7b_linear_ops_summary.csv")]

    def vidur_attention_rows(self) -> list[dict[str, Any]]:
        """Measured per-layer attention rows of Llama-2-7B on A100 (TP 1)."""
        out = []
        for r in self._rows("vidur_a100_llama2_7b_prefill_attention_tp1.csv"):
            c, h = int(r["prefill_chunk_size"]), int(r["kv_cache_size"])
            out.append({"scope": "layer_prefill_attention", "source": "vidur", "engine": "kernels",
                        "tp": 1,
                        "prefill_tokens": c, "prefill_chunks": 1, "prefill_cached": h,
                        "measured_s": float(r["attn_prefill_median_ms"]) * 1e-3,
                        "phase": "prefill", "gpu": "a100-80gb", "llm": "llama-2-7b",
                        "point": f"vidur-attn-prefill-c{c}-kv{h}"})
        for r in self._rows("vidur_a100_llama2_7b_decode_attention_tp1.csv"):
            b, kv = int(r["batch_size"]), int(r["kv_cache_size"])
            out.append({"scope": "layer_decode_attention", "source": "vidur", "engine": "kernels",
                        "tp": 1,
                        "decode_batch": b, "decode_context": kv,
                        "measured_s": float(r["attn_decode_median_ms"]) * 1e-3,
                        "phase": "decode", "gpu": "a100-80gb", "llm": "llama-2-7b",
                        "point": f"vidur-attn-decode-b{b}-kv{kv}"})
        return out

    def all_reduce_rows(self) -> list[dict[str, Any]]:
        """NCCL all-reduce medians on one DGX-A100 node (TP 2/4/8)."""
        return [{"scope": "all_reduce", "source": "vidur-nccl", "engine": "kernels",
                 "tp": int(r["tp"]),
                 "message_bytes": int(r["message_bytes"]),
                 "measured_s": float(r["all_reduce_median_ms"]) * 1e-3, "phase": "comm",
                 "gpu": "a100-80gb", "llm": "llama-2-7b",
                 "point": f"nccl-tp{r['tp']}-{r['message_bytes']}B"}
                for r in self._rows("nccl_a100_dgx_all_reduce_summary.csv")]

    def splitwise_rows(self, llm: str | None = None, hardware: str | None = None
                       ) -> list[dict[str, Any]]:
        """Splitwise TTFT (one prefill iteration of the batch) and mean decode-step rows.

        ``fit_split`` alternates train / test by row of the source file within each
        (model, hardware) group; ``excluded`` marks the source's anomalous row.
        """
        out = []
        index: dict[tuple[str, str], int] = {}
        for r in self._rows("splitwise_perf_model_medians.csv"):
            m, hw = SPLITWISE_LLM[r["model"]], r["hardware"]
            if (llm and m != llm) or (hardware and hw != hardware):
                continue
            i = index.get((m, hw), 0)
            index[(m, hw)] = i + 1
            tp, p, b, t = (int(r[k]) for k in ("tensor_parallel", "prompt_size", "batch_size",
                                               "token_size"))
            common = {"source": "splitwise", "engine": "vllm", "tp": tp,
                      "gpu": SPLITWISE_HARDWARE[hw], "llm": m,
                      "fit_split": "train" if i % 2 == 0 else "test",
                      "excluded": (r["model"], hw, tp, p, b, t) in SPLITWISE_EXCLUDED}
            tag = f"splitwise-{m}-{hw}-tp{tp}-p{p}-b{b}-o{t}"
            out.append({**common, "scope": "iteration", "phase": "prefill",
                        "prefill_tokens": p, "prefill_chunks": b,
                        "measured_s": float(r["prompt_time_ms_median"]) * 1e-3,
                        "point": tag + "-ttft"})
            out.append({**common, "scope": "iteration", "phase": "decode", "decode_batch": b,
                        "decode_context": p + 1, "decode_iters": max(t - 1, 1),
                        "measured_s": float(r["token_time_ms_median"]) * 1e-3,
                        "excluded": False, "point": tag + "-tpot"})
        return out

    def published_rows(self) -> list[dict[str, Any]]:
        """Published points of ``reference/cost-model.md`` section 7 not in the CSVs above."""
        out = []
        for r in self._rows("published_points.csv"):
            b = int(r["batch_size"])
            engine = "trtllm" if r["source"].startswith("TensorRT-LLM") else None
            row = {"scope": "iteration", "source": r["source"], "engine": engine, "tp": int(r["tp"]),
                   "gpu": r["gpu"], "llm": r["llm"], "dtype": r["dtype"], "phase": r["phase"],
                   "measured_s": float(r["measured_ms"]) * 1e-3, "point": r["point"],
                   "fit_split": "test"}
            if r["phase"] == "prefill":
                row.update(prefill_tokens=int(r["prompt_tokens"]), prefill_chunks=b)
            else:
                row.update(decode_batch=b, decode_context=int(r["decode_context"]))
            out.append(row)
        return out

    def nemo_rows(self) -> list[dict[str, Any]]:
        """NeMo Framework's TensorRT-LLM latencies of Llama-2 (128 in, 20 out, batch 1-8).

        Each row is a whole static batch: one prefill of ``batch_size`` x 128 tokens, then
        19 decode iterations. ``fit_split`` is ``test`` for the H100 batch-1 rows (the
        tensor-parallel scaling the trtllm profile is checked on) and ``train`` otherwise;
        ``excluded`` marks rows faster than their fp16 weights can be read (Llama-2-13B).
        """
        out = []
        for r in self._rows("nemo_trtllm_llama2_inference.csv"):
            tp, b = int(r["tp"]), int(r["batch_size"])
            inp, outp = int(r["input_len"]), int(r["output_len"])
            held_out = r["gpu"] == "h100-sxm" and b == 1
            out.append({"scope": "static_batch", "source": "nemo-trtllm", "engine": "trtllm",
                        "tp": tp, "gpu": r["gpu"], "llm": r["model"], "phase": "request",
                        "prefill_tokens": inp, "prefill_chunks": b, "decode_batch": b,
                        "decode_context": inp + 1, "decode_iters": outp - 1,
                        "measured_s": float(r["latency_ms"]) * 1e-3,
                        "fit_split": "test" if held_out else "train",
                        "excluded": r["excluded"] == "1",
                        "point": f"nemo-{r['model']}-{r['gpu']}-tp{tp}-b{b}"})
        return out

    def trtllm_rows(self) -> list[dict[str, Any]]:
        """TensorRT-LLM v0.5 first-token latencies at 128 and 2048 prompt tokens (batch 1)
        that ``published_points.csv`` does not already hold. Held out of the trtllm fits
        (another release than NeMo's rows, and FP8 on H100): validation points."""
        return [{"scope": "iteration", "source": "TensorRT-LLM v0.5 docs/source/performance.md",
                 "engine": "trtllm", "tp": int(r["tp"]), "gpu": r["gpu"], "llm": r["llm"],
                 "dtype": r["dtype"], "phase": "prefill", "prefill_tokens": int(r["prompt_tokens"]),
                 "prefill_chunks": int(r["batch_size"]), "measured_s": float(r["measured_ms"]) * 1e-3,
                 "point": r["point"], "fit_split": "test"}
                for r in self._rows("trtllm_v05_first_token_latency.csv")]

    def sglang_rows(self) -> list[dict[str, Any]]:
        """SGLang mean decode-iteration time (TPOT) at concurrency 1 on 8 x B200: a decode
        batch of 1 whose context grows from the input length over the output. gpt-oss-120b
        is the fit row, Qwen3-235B-A22B held out."""
        out = []
        for r in self._rows("sglang_b200_tpot_c1.csv"):
            inp, outp = int(r["input_len"]), int(r["output_len"])
            out.append({"scope": "iteration", "source": "sglang-b200-sweep", "engine": "sglang",
                        "tp": int(r["tp"]), "gpu": r["gpu"], "llm": r["llm"], "dtype": r["dtype"],
                        "phase": "decode", "decode_batch": int(r["concurrency"]),
                        "decode_context": inp + 1, "decode_iters": outp - 1,
                        "measured_s": float(r["tpot_ms"]) * 1e-3, "point": r["point"],
                        "fit_split": "train" if "gpt-oss" in r["llm"] else "test"})
        return out

    def all_rows(self) -> list[dict[str, Any]]:
        """Every calibration row of every source (Vidur linear and attention operators,
        all-reduce, Splitwise, published figures, NeMo, TensorRT-LLM, SGLang), one dict per
        measurement with ``measured_s`` in seconds, in that source order."""
        return (self.vidur_linear_rows() + self.vidur_attention_rows() + self.all_reduce_rows()
                + self.splitwise_rows() + self.published_rows() + self.nemo_rows()
                + self.trtllm_rows() + self.sglang_rows())


def _summarise_all_reduce(text: str) -> str:
    """Median per (tp, size) of single-node rows, at ~32 log-spaced sizes per tp."""
    import math
    from collections import defaultdict

    groups: dict[tuple[int, int], list[float]] = defaultdict(list)
    for r in csv.DictReader(io.StringIO(text)):
        n, d = int(r["num_workers"]), int(r["devices_per_node"])
        if n == d and n in (2, 4, 8):
            groups[(n, int(r["size"]))].append(float(r["time_stats.all_reduce.median"]))
    sizes = sorted({s for _, s in groups})
    targets = [math.exp(math.log(2048) + i * (math.log(67108864) - math.log(2048)) / 31)
               for i in range(32)]
    keep = {min(sizes, key=lambda s: abs(math.log(s) - math.log(t))) for t in targets}
    lines = ["tp,message_bytes,all_reduce_median_ms"]
    for (n, s), v in sorted(groups.items()):
        if s in keep:
            v = sorted(v)
            med = v[len(v) // 2] if len(v) % 2 else 0.5 * (v[len(v) // 2 - 1] + v[len(v) // 2])
            lines.append(f"{n},{s},{med!r}")
    return "\n".join(lines) + "\n"
