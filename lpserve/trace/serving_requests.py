"""Serving benchmarks recorded request by request, as measured stages (layer 0).

Two sources, each read as one :class:`lpserve.trace.serving_runs.ServingStage` whose
``requests`` holds the successful requests (send time, prompt and output tokens) and whose
``measured`` figures are computed from them:

* ``vllm bench serve --save-result --save-detailed`` JSON (:func:`load_vllm_bench_serve`):
  per request ``start_times`` (the client's clock, s), ``input_lens``, ``output_lens``,
  ``ttfts`` (s), ``latencies`` (s, end to end), ``itls`` (gaps between streamed chunks,
  s) and ``errors`` (empty for a success). The file does not record the server's
  settings: the model (``model_id``, or ``llm=``), tensor parallelism, batching limits,
  prefix caching and async scheduling are given by the caller.
* a per-request CSV (:func:`load_request_csv`), one row per request: ``arrival_s``,
  ``prompt_tokens``, ``output_tokens``, ``ttft_s``, ``e2e_s`` and optionally ``ok``
  (1/0, true/false; a failed request's row may leave the latencies empty).

Failed requests are counted (``n_failed``) and left out of the workload, whose outputs
they never produced; more than 1 % of them marks the stage as overloaded
(``ServingStage.overloaded``), which fits and error tables leave out. The measured
figures: mean and p90 of E2E and TTFT, ``itl_s`` (the mean and p90 gap between streamed
chunks, ``itls``; the CSV has none and repeats ``tpot_s``) and ``tpot_s``, per request
``(E2E - TTFT) / max(output - 1, 1)``, which is what ``lpserve.evaluate.sim_to_real``
compares. Every error names the file, the field and the request.
"""
from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

import numpy as np

from lpserve.trace import TraceError
from lpserve.trace.columns import quote
from lpserve.trace.serving_runs import (
    HF_MODELS,
    Q_LEVELS,
    ServingStage,
    read_json,
    serving_error,
)

__all__ = ["BENCH_FIELDS", "bench_serve_fields", "load_request_csv", "load_vllm_bench_serve"]

#: the per-request CSV's columns (``ok`` optional)
CSV_COLUMNS = ("arrival_s", "prompt_tokens", "output_tokens", "ttft_s", "e2e_s")


def _stat(x: np.ndarray) -> dict[str, float]:
    return {"mean": float(x.mean()), "p90": float(np.percentile(x, 90))}


def _stage(source: str, run: str, *, model: str, llm: str | None, gpu: str, tp: int,
           arrival_s: np.ndarray, prompt: np.ndarray, output: np.ndarray, ttft_s: np.ndarray,
           e2e_s: np.ndarray, ok: np.ndarray, chunk_gaps_s: np.ndarray | None,
           settings: dict[str, Any]) -> ServingStage:
    """One stage from per-request arrays (shape ``(n,)``; ``ok`` boolean)."""
    key = llm or HF_MODELS.get(model.lower())
    if key is None:
        raise serving_error(source, f"the served model {model!r} has no catalog entry: give the "
                                    "catalog LLM (--llm)")
    if not ok.any():
        raise serving_error(source, "no successful request: nothing was measured")
    bad = np.flatnonzero(ok & ((prompt < 1) | (output < 1)))
    if bad.size:
        raise serving_error(source, f"request {int(bad[0])}: prompt and output tokens must "
                                    f"be >= 1, got {int(prompt[bad[0]])} and "
                                    f"{int(output[bad[0]])}")
    for name, v in (("ttft", ttft_s), ("e2e", e2e_s)):
        bad = np.flatnonzero(ok & ~(np.isfinite(v) & (v > 0)))
        if bad.size:
            raise serving_error(source, f"request {int(bad[0])}: {name} must be a positive "
                                        f"number of seconds, got {v[bad[0]]!r}")
    bad = np.flatnonzero(ok & (e2e_s < ttft_s))
    if bad.size:
        raise serving_error(source, f"request {int(bad[0])}: end-to-end latency "
                                    f"{e2e_s[bad[0]]!r} s is below its TTFT {ttft_s[bad[0]]!r} s")
    t0 = float(arrival_s.min())
    offsets = arrival_s[ok] - t0
    span = float(arrival_s.max() - t0)
    n = int(arrival_s.size)
    duration = span * n / (n - 1) if n > 1 and span > 0 else 1.0
    p, o = prompt[ok], output[ok]
    per_token = (e2e_s[ok] - ttft_s[ok]) / np.maximum(o - 1, 1)
    measured = {"e2e_s": _stat(e2e_s[ok]), "ttft_s": _stat(ttft_s[ok]),
                "tpot_s": _stat(per_token)}
    gaps = chunk_gaps_s if chunk_gaps_s is not None and chunk_gaps_s.size else per_token
    measured["itl_s"] = _stat(gaps)
    return ServingStage(
        run=run, stage=0, model=model, llm=key, gpu=gpu, tp=int(tp), engine="vllm",
        engine_version=str(settings.get("engine_version", "")),
        max_num_batched_tokens=int(settings.get("max_num_batched_tokens") or 0),
        max_num_seqs=int(settings.get("max_num_seqs") or 0),
        max_model_len=int(max(p.max() + o.max(), 1)),
        prefix_caching=bool(settings.get("prefix_caching", True)),
        schedule_ahead=bool(settings.get("schedule_ahead", True)),
        rate_rps=n / duration, duration_s=duration, start_s=0.0, arrivals="recorded",
        num_groups=0, prompts_per_group=0, system_prompt_tokens=0, question_tokens=0,
        output_tokens=int(round(float(o.mean()))),
        prompt_quantiles=tuple(float(q) for q in np.quantile(p, Q_LEVELS)),
        measured=measured, n_ok=int(ok.sum()), n_failed=int((~ok).sum()),
        requests={"offset_s": offsets.tolist(), "prompt_tokens": p.tolist(),
                  "output_tokens": o.tolist()})


def _numbers(source: str, doc: dict[str, Any], name: str, n: int | None) -> list[Any]:
    v = doc.get(name)
    if not isinstance(v, list):
        raise serving_error(source, f"field {name!r} is missing or not a list (vllm bench "
                                    "serve writes per-request results with --save-result "
                                    "--save-detailed)")
    if n is not None and len(v) != n:
        raise serving_error(source, f"field {name!r} has {len(v)} entries, 'input_lens' {n}")
    return v


def _as_array(source: str, name: str, v: list[Any], ok: np.ndarray, *,
              integer: bool) -> np.ndarray:
    out = np.zeros(len(v), np.int64 if integer else np.float64)
    for i, x in enumerate(v):
        good = isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
        if integer:
            good = good and float(x).is_integer() and 0 <= x < 2**53
        if not good:
            if not ok[i]:
                continue  # a failed request's fields are not read
            raise serving_error(source, f"field {name!r}[{i}] must be "
                                        f"{'a non-negative integer' if integer else 'a number'}, "
                                        f"got {quote(x)}")
        out[i] = x
    return out


#: per-request fields of a ``vllm bench serve --save-detailed`` JSON that every reader needs
BENCH_FIELDS = ("input_lens", "output_lens", "ttfts", "itls")


def bench_serve_fields(doc: Any, source: str, required: tuple[str, ...] = ()) -> dict[str, Any]:
    """The per-request fields of a ``vllm bench serve --save-detailed`` JSON object, checked
    once for both of its readers (:func:`load_vllm_bench_serve` and
    ``lpserve.cost.measure.read_vllm_benchmark_json``).

    Returns ``ok`` (bool ``(n,)``: no error recorded), ``input_lens`` and ``output_lens``
    (int64 ``(n,)``), ``ttfts`` (float64 ``(n,)``, s), ``itls`` (per request a float64
    array of gaps >= 0, s; empty for a failed request), and ``start_times`` and
    ``latencies`` (float64 ``(n,)``, s) or ``None`` where the file has none and they are not
    in ``required``. A failed request's fields are not read, except its start time. A
    :class:`TraceError` names ``source``, the field and the request."""
    if not isinstance(doc, dict):
        raise serving_error(source, "the top level must be a JSON object")
    inp = _numbers(source, doc, "input_lens", None)
    n = len(inp)
    if n == 0:
        raise serving_error(source, "field 'input_lens' is empty: no request was recorded")
    errors = doc.get("errors", [""] * n)
    if not isinstance(errors, list) or len(errors) != n:
        raise serving_error(source, f"field 'errors' must be a list of {n} entries")
    ok = np.array([not e for e in errors], bool)
    out: dict[str, Any] = {"ok": ok, "input_lens": _as_array(source, "input_lens", inp, ok,
                                                              integer=True)}
    for name in ("output_lens", "ttfts", "latencies", "start_times"):
        if name not in BENCH_FIELDS and name not in required and doc.get(name) is None:
            out[name] = None
            continue
        mask = np.ones(n, bool) if name == "start_times" else ok
        out[name] = _as_array(source, name, _numbers(source, doc, name, n), mask,
                              integer=name == "output_lens")
    gaps = _numbers(source, doc, "itls", n)
    out["itls"] = []
    for i in range(n):
        g = gaps[i] if ok[i] else []
        if not isinstance(g, list) or any(isinstance(x, bool) or not isinstance(x, (int, float))
                                          or not math.isfinite(x) or x < 0 for x in g):
            raise serving_error(source, f"field 'itls'[{i}] must be a list of gaps >= 0 (s)")
        out["itls"].append(np.asarray(g, np.float64))
    return out


def load_vllm_bench_serve(path: str | Path, *, gpu: str, llm: str | None = None, tp: int = 1,
                          **settings: Any) -> list[ServingStage]:
    """The stage of one ``vllm bench serve`` result JSON (see the module docstring).

    ``settings``: the server's ``max_num_batched_tokens`` and ``max_num_seqs`` (0 or absent:
    vLLM's defaults for the GPU), ``prefix_caching`` and ``schedule_ahead`` (default on, as
    in vLLM from 0.14), ``engine_version``."""
    p = Path(path)
    src = str(p)
    doc = read_json(p)
    f = bench_serve_fields(doc, src, required=("start_times", "latencies"))
    ok = f["ok"]
    gaps = np.concatenate([f["itls"][i] for i in np.flatnonzero(ok)] or [np.zeros(0)])
    model = str(doc.get("model_id") or llm or "")
    return [_stage(src, p.stem, model=model, llm=llm, gpu=gpu, tp=tp,
                   arrival_s=f["start_times"], prompt=f["input_lens"],
                   output=f["output_lens"], ttft_s=f["ttfts"], e2e_s=f["latencies"], ok=ok,
                   chunk_gaps_s=gaps, settings=settings)]


def _csv_value(src: str, line: int, col: str, text: str, integer: bool) -> float:
    try:
        v = float(text)
    except ValueError:
        raise serving_error(src, f"line {line}, column {col!r}: not a number: "
                                 f"{quote(text)}") from None
    if not math.isfinite(v) or (integer and (not v.is_integer() or not 0 <= v < 2**53)):
        kind = "a non-negative integer" if integer else "a finite number"
        raise serving_error(src, f"line {line}, column {col!r}: must be {kind}, got "
                                 f"{quote(text)}")
    return v


def load_request_csv(path: str | Path, *, gpu: str, llm: str, tp: int = 1,
                     **settings: Any) -> list[ServingStage]:
    """The stage of a per-request CSV (columns :data:`CSV_COLUMNS`, optional ``ok``);
    ``settings`` as in :func:`load_vllm_bench_serve`."""
    p = Path(path)
    src = str(p)
    try:
        fh = p.open(newline="")
    except FileNotFoundError:
        raise TraceError(f"{src!r} does not exist") from None
    with fh:
        reader = csv.DictReader(fh)
        cols = reader.fieldnames or []
        missing = [c for c in CSV_COLUMNS if c not in cols]
        if missing:
            raise serving_error(src, f"missing columns {missing}; a per-request CSV has "
                                     f"{', '.join(CSV_COLUMNS)} (and optionally ok); found "
                                     f"{quote(cols)}")
        rows = []
        for line, row in enumerate(reader, start=2):
            okv = (row.get("ok") or "1").strip().lower()
            if okv not in ("1", "0", "true", "false"):
                raise serving_error(src, f"line {line}, column 'ok': must be 1/0 or "
                                         f"true/false, got {quote(okv)}")
            good = okv in ("1", "true")  # a failed request: only its send time is read
            rows.append([_csv_value(src, line, c, row[c] or "", c.endswith("tokens"))
                         if good or c == "arrival_s" else 0.0 for c in CSV_COLUMNS]
                        + [float(good)])
    if not rows:
        raise serving_error(src, "no request rows")
    arr = np.array(rows, dtype=np.float64)
    ok = arr[:, 5].astype(bool)
    return [_stage(src, p.stem, model=llm, llm=llm, gpu=gpu, tp=tp, arrival_s=arr[:, 0],
                   prompt=arr[:, 1].astype(np.int64), output=arr[:, 2].astype(np.int64),
                   ttft_s=arr[:, 3], e2e_s=arr[:, 4], ok=ok, chunk_gaps_s=None,
                   settings=settings)]
