"""A user's own measurements as fit rows, and the calibration fitted to them.

Two inputs (``lpserve calibrate``, :func:`calibrate_to`):

- a CSV of iterations, one row per engine iteration: ``time_ms`` (or ``time_s``), and the
  batch as ``;``-separated token counts: ``prefill_tokens`` (new tokens of each prefill
  chunk), ``prefill_cached`` (tokens of each chunk already in the KV cache; the column may
  be left out when nothing was cached), ``decode_context`` (context of each decode
  request); optionally ``tp`` (a tensor-parallel degree per row);
- the JSON that vLLM's serving benchmark writes (``benchmark_serving.py --save-result`` /
  ``vllm bench serve --save-result``). With per-request results (``input_lens``,
  ``output_lens``, ``ttfts``, ``itls``, and ``start_times`` where the version writes
  them; read and checked by :func:`lpserve.trace.serving_requests.bench_serve_fields`,
  as ``lpserve calibrate --serving`` reads them) every inter-token gap becomes an
  iteration row whose batch is rebuilt from the requests then running (exact at
  ``max_concurrency`` 1); a summary-only file (no
  ``--save-detailed``) gives two mean-field rows: a decode iteration at the mean decode
  batch (output throughput x mean ITL, Little's law) at the mean context, and the mean
  TTFT as one prefill of the mean input (of every prompt at once when the benchmark sent
  them all at once, ``request_rate`` inf).

Bad files get errors that name the file, the line (CSV, JSON syntax) and the field.
"""
from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from lpserve.trace import TraceError
from lpserve.trace.serving_requests import bench_serve_fields

#: cap on the iteration rows taken from one serving benchmark (evenly strided, in order)
MAX_JSON_ROWS = 4000


class MeasurementError(ValueError):
    """A measurement file that cannot be read; the message names file, line and field."""


def _ints(text: str, where: str, field: str) -> list[int]:
    text = (text or "").strip()
    if not text:
        return []
    out = []
    for part in text.replace(",", ";").split(";"):
        part = part.strip()
        try:
            v = int(part)
        except ValueError:
            raise MeasurementError(f"{where}, field {field!r}: {part!r} is not a whole number of "
                                   "tokens") from None
        if v < 0:
            raise MeasurementError(f"{where}, field {field!r}: token counts must be >= 0, got {v}")
        out.append(v)
    return out


def read_iterations_csv(path: str | Path, tp: int = 1) -> list[dict[str, Any]]:
    """Rows (scope ``"batch"``) of a CSV of iterations; see the module docstring."""
    p = Path(path)
    try:
        fh = p.open(newline="")
    except FileNotFoundError:
        raise MeasurementError(f"{p}: no such file") from None
    with fh:
        reader = csv.DictReader(fh)
        cols = set(reader.fieldnames or [])
        time_col = "time_ms" if "time_ms" in cols else "time_s" if "time_s" in cols else None
        if time_col is None:
            raise MeasurementError(f"{p}, line 1: needs a 'time_ms' (or 'time_s') column; "
                                   f"found {sorted(cols)}")
        if not cols & {"prefill_tokens", "decode_context"}:
            raise MeasurementError(f"{p}, line 1: needs a 'prefill_tokens' or 'decode_context' "
                                   "column")
        rows = []
        for line, r in enumerate(reader, start=2):
            where = f"{p}, line {line}"
            try:
                t = float(r[time_col])
            except (TypeError, ValueError):
                raise MeasurementError(f"{where}, field {time_col!r}: {r[time_col]!r} is not a "
                                       "number") from None
            if not (math.isfinite(t) and t > 0):
                raise MeasurementError(f"{where}, field {time_col!r}: must be > 0, got {t!r}")
            pre = _ints(r.get("prefill_tokens", ""), where, "prefill_tokens")
            cached = _ints(r.get("prefill_cached", ""), where, "prefill_cached")
            if "prefill_cached" not in cols:
                cached = [0] * len(pre)
            if len(cached) != len(pre):
                raise MeasurementError(f"{where}, field 'prefill_cached': {len(cached)} values for "
                                       f"{len(pre)} prefill chunks")
            dec = _ints(r.get("decode_context", ""), where, "decode_context")
            if not pre and not dec:
                raise MeasurementError(f"{where}: an iteration needs prefill tokens or decode "
                                       "requests")
            row_tp = tp
            if r.get("tp", "").strip():
                try:
                    row_tp = int(r["tp"])
                except ValueError:
                    raise MeasurementError(f"{where}, field 'tp': {r['tp']!r} is not an "
                                           "integer") from None
            rows.append(_batch_row(pre, cached, dec, t * (1e-3 if time_col == "time_ms" else 1.0),
                                   row_tp, f"{p.name}:{line}"))
    if not rows:
        raise MeasurementError(f"{p}: no iterations after the header")
    return rows


def _batch_row(pre: list[int], cached: list[int], dec: list[int], seconds: float, tp: int,
               point: str) -> dict[str, Any]:
    phase = "mixed" if pre and dec else "prefill" if pre else "decode"
    return {"scope": "batch", "prefill_list": list(pre), "cached_list": list(cached),
            "decode_list": list(dec), "measured_s": float(seconds), "tp": int(tp),
            "phase": phase, "point": point}


def _field(doc: dict[str, Any], name: str, where: str, kind: type | tuple = (int, float)) -> Any:
    if name not in doc:
        raise MeasurementError(f"{where}: field {name!r} is missing")
    v = doc[name]
    if isinstance(v, bool) or not isinstance(v, kind):
        raise MeasurementError(f"{where}: field {name!r} has the wrong type ({type(v).__name__})")
    return v


def read_vllm_benchmark_json(path: str | Path, tp: int = 1) -> list[dict[str, Any]]:
    """Rows of a vLLM serving-benchmark result JSON; see the module docstring."""
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise MeasurementError(f"{p}: no such file") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise MeasurementError(f"{p}, line {exc.lineno}, column {exc.colno}: not valid JSON "
                               f"({exc.msg})") from None
    if not isinstance(doc, dict):
        raise MeasurementError(f"{p}: the top level must be a JSON object")
    where = str(p)
    if all(k in doc for k in ("input_lens", "output_lens", "ttfts", "itls")):
        return _detailed_rows(doc, where, tp, p.name)
    return _summary_rows(doc, where, tp, p.name)


def _summary_rows(doc: dict[str, Any], where: str, tp: int, name: str) -> list[dict[str, Any]]:
    completed = int(_field(doc, "completed", where, int))
    if completed < 1:
        raise MeasurementError(f"{where}: field 'completed' must be >= 1, got {completed}")
    mean_in = _field(doc, "total_input_tokens", where) / completed
    mean_out = _field(doc, "total_output_tokens", where) / completed
    itl = _field(doc, "mean_itl_ms", where) * 1e-3
    ttft = _field(doc, "mean_ttft_ms", where) * 1e-3
    thr = _field(doc, "output_throughput", where)
    for k, v in (("mean_itl_ms", itl), ("mean_ttft_ms", ttft), ("output_throughput", thr)):
        if not (math.isfinite(v) and v > 0):
            raise MeasurementError(f"{where}: field {k!r} must be > 0, got {v!r}")
    cap = completed
    if isinstance(doc.get("max_concurrency"), int) and doc["max_concurrency"] > 0:
        cap = min(cap, doc["max_concurrency"])
    batch = int(min(cap, max(1, round(thr * itl))))  # Little's law: tokens per iteration
    ctx = int(round(mean_in + mean_out / 2))
    inp = int(round(mean_in))
    rows = [_batch_row([], [], [ctx] * batch, itl, tp, f"{name}:mean_itl_ms")]
    if str(doc.get("request_rate", "")).lower() == "inf":
        # every request sent at once: the first iteration prefills `cap` prompts together
        rows.append(_batch_row([inp] * cap, [0] * cap, [], ttft, tp, f"{name}:mean_ttft_ms"))
    else:  # arrivals spread out: a prompt joins the requests decoding
        rows.append(_batch_row([inp], [0], [ctx] * (batch - 1), ttft, tp, f"{name}:mean_ttft_ms"))
    return rows


def _detailed_rows(doc: dict[str, Any], where: str, tp: int, name: str) -> list[dict[str, Any]]:
    try:
        f = bench_serve_fields(doc, where)
    except TraceError as exc:
        raise MeasurementError(str(exc)) from None
    starts = f["start_times"]
    conc = doc.get("max_concurrency")
    if starts is None and conc != 1:
        raise MeasurementError(f"{where}: field 'start_times' is missing and 'max_concurrency' is "
                               f"{conc!r}: without start times only a one-at-a-time benchmark "
                               "(max_concurrency 1) tells which requests shared an iteration")
    reqs = []
    clock = 0.0
    for i in np.flatnonzero(f["ok"]).tolist():
        inp, ttft = int(f["input_lens"][i]), float(f["ttfts"][i])
        if inp < 1:
            raise MeasurementError(f"{where}: field 'input_lens'[{i}] must be a positive integer")
        if not ttft > 0:
            raise MeasurementError(f"{where}: field 'ttfts'[{i}] must be > 0, got {ttft!r}")
        start = float(starts[i]) if starts is not None else clock
        times = start + ttft + np.concatenate([[0.0], np.cumsum(f["itls"][i])])
        clock = float(times[-1])
        reqs.append((start, inp, times))
    if not reqs:
        raise MeasurementError(f"{where}: no successful request (every 'errors' entry is set)")
    return _timeline_rows(reqs, tp, name)


def _timeline_rows(reqs: list[tuple[float, int, np.ndarray]], tp: int,
                   name: str) -> list[dict[str, Any]]:
    """Iteration rows from per-request token times: each gap between two tokens of a
    request is one iteration; its batch holds every request decoding at the gap's
    midpoint (context: prompt plus tokens emitted so far) and the prompts whose first
    token lands in the gap (their prefills); each first token's wait is a prefill
    iteration with the requests then decoding."""
    firsts = np.array([t[0] for _, _, t in reqs])
    ends = np.array([t[-1] for _, _, t in reqs])
    gaps = [(i, k) for i, (_, _, t) in enumerate(reqs) for k in range(1, len(t))]
    stride = max(1, math.ceil((len(gaps) + len(reqs)) / MAX_JSON_ROWS))
    rows = []

    def decoding(at: float, since: float, skip: int = -1) -> list[int]:
        """Contexts of the requests that had their first token by ``since`` and were still
        generating at ``at``."""
        live = np.nonzero((firsts <= since) & (ends >= at))[0]
        return [reqs[j][1] + int(np.searchsorted(reqs[j][2], at, side="right"))
                for j in live if j != skip]

    for i in range(0, len(reqs), stride):  # prefill rows: prompt i, with the others decoding
        start, inp, t = reqs[i]
        rows.append(_batch_row([inp], [0], decoding(t[0], start, skip=i), t[0] - start, tp,
                               f"{name}:ttfts[{i}]"))
    for i, k in gaps[::stride]:
        t = reqs[i][2]
        lo, hi = t[k - 1], t[k]
        if hi <= lo:
            continue  # tokens delivered together (one stream chunk): no iteration boundary
        mid = 0.5 * (lo + hi)
        pre = [reqs[j][1] for j in np.nonzero((firsts > lo) & (firsts <= hi))[0]]
        rows.append(_batch_row(pre, [0] * len(pre), decoding(mid, lo), hi - lo, tp,
                               f"{name}:itls[{i}][{k - 1}]"))
    return rows


# ---- fitting a user's calibration ------------------------------------------------------

#: what ``lpserve calibrate`` fits unless told otherwise (then pruned to what the rows
#: identify, see :func:`default_parameters`)
#: The small-batch GEMM plateau (``plateau_tokens``) is not among them: from iteration
#: times alone it trades exactly against the weight-streaming efficiency and the per-layer
#: overhead (both weight-bound and compute-bound iterations are then fitted equally well),
#: so it stays at the starting calibration's value unless named with ``--fit``.
#: In order of priority: with fewer rows than candidates the first ones are fitted.
USER_PARAMETERS = ("layer_overhead_s", "multi_prompt_token_s", "eff_compute", "eff_weights",
                   "seq_overhead_s", "eff_kv", "eff_attn", "iter_overhead_s", "ar_latency_s")


def default_parameters(rows: list[dict[str, Any]]) -> tuple[str, ...]:
    """The parameters of :data:`USER_PARAMETERS` that ``rows`` can identify, at most one
    per row: compute efficiencies only with iterations prefilling 512+ tokens, KV efficiency only with decode
    contexts that vary, the per-sequence overhead only with batches of varying size, and
    :func:`lpserve.cost.fit.engine_parameters`' rules (all-reduce latency needs several
    tensor-parallel degrees; one model: per-layer, not per-iteration, overhead)."""
    from lpserve.cost.fit import engine_parameters

    long_prefill = any(sum(r["prefill_list"]) >= 512 for r in rows)
    ctx_sums = {sum(r["decode_list"]) for r in rows if r["decode_list"]}
    sizes = {len(r["prefill_list"]) + len(r["decode_list"]) for r in rows}
    drop = set()
    if not long_prefill:
        drop |= {"eff_compute", "eff_attn"}
    if len(ctx_sums) < 2:
        drop.add("eff_kv")
    if len(sizes) < 2:
        drop.add("seq_overhead_s")
    if not any(len(r["prefill_list"]) > 1 for r in rows):
        drop.add("multi_prompt_token_s")  # no iteration prefills several prompts
    keep = [c for c in engine_parameters(rows, USER_PARAMETERS) if c not in drop]
    return tuple(keep[:max(1, len(rows))])


def _phase_errors(rows: list[dict[str, Any]], rel: np.ndarray) -> dict[str, dict[str, float]]:
    out = {}
    for phase in ("prefill", "mixed", "decode"):
        e = np.array([abs(x) for r, x in zip(rows, rel) if r["phase"] == phase])
        if e.size:
            out[phase] = {"n": int(e.size), "median_abs": float(np.median(e)),
                          "max_abs": float(e.max())}
    return out


def calibrate_to(rows: list[dict[str, Any]], gpu: str, llm: str, tp: int = 1,
                 engine: str | None = None, parameters: tuple[str, ...] | None = None,
                 name: str | None = None, data: str = "") -> dict[str, Any]:
    """Fit a calibration to ``rows`` (from :func:`read_iterations_csv` or
    :func:`read_vllm_benchmark_json`), starting from the calibration ``lp.cost_model``
    picks for the pair (and ``engine``).

    Returns ``{"entry": ..., "before": ..., "after": ..., "moved": ...}``: the calibration
    entry (write it with :func:`lpserve.cost.fit.write_fitted`; ``lp.cost_model(...,
    calibration=PATH)`` loads it), the median and max |predicted / measured - 1| per phase
    before and after, and ``(parameter, before, after)`` for every fitted parameter.
    """
    import datetime as _dt

    from lpserve.cost.analytic import CALIBRATED, AnalyticCost
    from lpserve.cost.fit import BOUNDS, fit, predict_row

    start = AnalyticCost(gpu=gpu, llm=llm, tp=tp, engine=engine)
    params = tuple(parameters) if parameters else default_parameters(rows)
    unknown = [p for p in params if p not in BOUNDS]
    if unknown:
        raise ValueError(f"cannot fit {unknown}; fittable: {sorted(BOUNDS)}")
    for r in rows:
        r.setdefault("gpu", start.gpu.key)
        r.setdefault("llm", start.llm.key)
    base = dict(start.values)
    res = fit(rows, start.gpu, start.llm, parameters=params, base=base, engine=start.engine)
    models = {t: AnalyticCost(gpu=start.gpu, llm=start.llm, tp=t, engine=start.engine, **base)
              for t in {int(r["tp"]) for r in rows}}
    rel_before = np.array([predict_row(models[int(r["tp"])], r) / r["measured_s"] - 1.0
                           for r in rows])
    keep = sorted(set(CALIBRATED) | {p for p in params if p not in CALIBRATED})
    entry = {"name": name or f"user-{start.gpu.key}-{start.llm.key}", "gpu": start.gpu.key,
             "llm": start.llm.key, "engine": start.engine}
    entry.update({k: float(f"{res.values[k]:.6g}") for k in keep})
    entry["provenance"] = {
        "data": data, "date": _dt.date.today().isoformat(), "rows": res.n_rows,
        "fitted": list(params), "started_from": str(start.calibration.get("name")),
        "note": "lpserve calibrate: least squares on log-ratios of the user's measurements",
        "median_abs_error": round(res.median_abs_error, 4),
        "max_abs_error": round(res.max_abs_error, 4),
    }
    moved = [(p, base[p], res.values[p]) for p in params]
    return {"entry": entry, "before": _phase_errors(rows, rel_before),
            "after": _phase_errors(rows, res.rel_errors), "moved": moved,
            "success": res.success, "message": res.message}
