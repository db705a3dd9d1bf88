"""Measured serving runs: a real server's benchmark, its workload and what it measured
(layer 0: numpy and the standard library; YAML through PyYAML).

A :class:`ServingStage` is one constant-rate stage of a serving benchmark: the engine's
settings (model, tensor parallelism, ``max_num_batched_tokens``, ``max_num_seqs``), the
workload's generator parameters (arrival rate and duration, prompt and output lengths,
shared-prefix groups) and the client-side measurements (mean and p90 of end-to-end
latency, time to first token, inter-token latency). :func:`stage_trace` rebuilds the
workload the client sent, request by request, so the simulator can run it.

Sources read:

* inference-perf runs (``load_inference_perf``): a folder with ``exp-config.yaml``
  (vLLM's server arguments), ``results/config.yaml`` (inference-perf's resolved config)
  and ``results/stage_K_lifecycle_metrics.json`` (one per load stage).
* the bundled table (``bundled_serving_runs``): ``lpserve/data/serving/*.json``, the
  stages of public runs in this module's JSON form (provenance in
  ``lpserve/data/serving/README.md``).

Units: seconds (``_s``), requests per second (``_rps``), tokens.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from lpserve.trace import LoadReport, Trace, TraceError
from lpserve.trace.columns import pack_blocks

#: client-side metrics every stage carries: ``{metric: {"mean": s, "p90": s}}``
METRICS = ("e2e_s", "ttft_s", "itl_s")
#: inference-perf's names of :data:`METRICS`
_IP_METRICS = {"e2e_s": "request_latency", "ttft_s": "time_to_first_token",
               "itl_s": "inter_token_latency"}
#: Hugging Face model ids of the public runs -> catalog keys
HF_MODELS = {
    "meta-llama/llama-2-7b-hf": "llama-2-7b",
    "meta-llama/llama-2-13b-hf": "llama-2-13b",
    "meta-llama/llama-2-70b-hf": "llama-2-70b",
    "mistralai/mixtral-8x7b-v0.1": "mixtral-8x7b",
    "mistralai/mixtral-8x22b-v0.1": "mixtral-8x22b",
    "mistralai/mixtral-8x22b-instruct-v0.1": "mixtral-8x22b",
    "mistralai/mistral-nemo-instruct-2407": "mistral-nemo-12b",
    "mistralai/mistral-nemo-base-2407": "mistral-nemo-12b",
    "qwen/qwen3-14b": "qwen3-14b",
    "meta-llama/llama-4-scout-17b-16e-instruct": "llama-4-scout-17b-16e",
    "codellama/codellama-34b-instruct-hf": "codellama-34b",
    "meta-llama/meta-llama-3-8b": "llama-3-8b",
    "meta-llama/llama-3.1-8b-instruct": "llama-3.1-8b",
    "meta-llama/llama-3.1-70b-instruct": "llama-3.1-70b",
}
_QUANTILES = ("min", "p1", "p5", "p10", "p25", "median", "p75", "p90", "p95", "p99", "max")
#: the levels of ``ServingStage.prompt_quantiles`` (inference-perf's prompt-length quantiles)
Q_LEVELS = (0.0, 0.01, 0.05, 0.10, 0.25, 0.50, 0.75, 0.90, 0.95, 0.99, 1.0)


def serving_error(source: str, msg: str) -> TraceError:
    """A :class:`TraceError` whose message starts with ``source`` (cut to 400 characters)."""
    return TraceError(f"{source}: {msg}"[:400])


@dataclass(frozen=True)
class ServingStage:
    """One constant-rate stage of a measured serving run.

    Attributes:
        run: the run's name (its folder); ``stage``: the stage's index in the run.
        model: the served model as the run names it; ``llm``: its catalog key.
        gpu: catalog GPU key; ``tp``: tensor-parallel degree.
        engine: serving engine (``"vllm"``); ``engine_version``: what the source says of it.
        max_num_batched_tokens, max_num_seqs, max_model_len: the engine's limits.
        prefix_caching: whether the engine cached prompt prefixes.
        schedule_ahead: whether the engine fixed each batch one iteration ahead (vLLM's
            async scheduling, its default from 0.14 on).
        rate_rps, duration_s: the stage's constant arrival rate and its length;
            ``start_s``: when the stage began, from the run's start.
        arrivals: ``"constant"`` (evenly spaced) or ``"poisson"``.
        num_groups, prompts_per_group, system_prompt_tokens, question_tokens: the
            shared-prefix generator (``num_groups * prompts_per_group`` distinct prompts,
            each a group's system prompt then its own question, cycled in a shuffled order).
        output_tokens: tokens generated per request (``ignore_eos``: exactly this many).
        prompt_quantiles: the measured prompt length at the levels of ``Q_LEVELS``.
        measured: ``{metric: {"mean": s, "p90": s}}`` over the stage's successful requests;
            a stage read from per-request results also has ``tpot_s`` (seconds per
            generated token after the first, per request).
        n_ok, n_failed: successful and failed requests of the stage.
        requests: for a stage read request by request (``vllm bench serve`` results, a
            per-request CSV: :mod:`lpserve.trace.serving_requests`), its successful
            requests: ``{"offset_s": [...], "prompt_tokens": [...], "output_tokens":
            [...]}`` (send times from the stage's start); ``None`` for a generated
            workload. ``max_num_batched_tokens`` and ``max_num_seqs`` are 0 where the run
            does not say (the engine's defaults for the GPU).
    """

    run: str
    stage: int
    model: str
    llm: str
    gpu: str
    tp: int
    engine: str
    engine_version: str
    max_num_batched_tokens: int
    max_num_seqs: int
    max_model_len: int
    prefix_caching: bool
    schedule_ahead: bool
    rate_rps: float
    duration_s: float
    start_s: float
    arrivals: str
    num_groups: int
    prompts_per_group: int
    system_prompt_tokens: int
    question_tokens: int
    output_tokens: int
    prompt_quantiles: tuple[float, ...]
    measured: dict[str, dict[str, float]] = field(default_factory=dict)
    n_ok: int = 0
    n_failed: int = 0
    requests: dict[str, list] | None = None

    @property
    def key(self) -> str:
        """``run/stage`` as printed in tables."""
        return f"{self.run}/{self.stage}"

    @property
    def n_requests(self) -> int:
        """Requests the client sent in the stage: ``round(rate_rps * duration_s)`` (the
        successful ones of a stage read request by request)."""
        if self.requests is not None:
            return len(self.requests["offset_s"])
        return int(round(self.rate_rps * self.duration_s))

    @property
    def overloaded(self) -> bool:
        """Whether the real server fell behind: more than 1 % of the stage's requests failed,
        or the mean wait for the first token exceeded the mean time spent generating."""
        m = self.measured
        waited = m["ttft_s"]["mean"] > m["e2e_s"]["mean"] - m["ttft_s"]["mean"]
        return self.n_failed > 0.01 * max(self.n_ok + self.n_failed, 1) or waited

    def tpot_s(self) -> float:
        """Measured seconds per generated token after the first: ``(E2E - TTFT) / (n - 1)``
        from the means (every request generates exactly ``output_tokens``, so this is
        the mean of the per-request ratios too); measured per request where the stage was
        read request by request."""
        m = self.measured
        if "tpot_s" in m:
            return m["tpot_s"]["mean"]
        return (m["e2e_s"]["mean"] - m["ttft_s"]["mean"]) / max(self.output_tokens - 1, 1)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dict (the bundled table's row form)."""
        d = asdict(self)
        d["prompt_quantiles"] = list(self.prompt_quantiles)
        return d


# ------------------------------------------------------------------------------ reading
def _num(source: str, where: str, v: Any, *, integer: bool = False,
         positive: bool = True) -> Any:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    if ok and integer:
        ok = float(v).is_integer()
    if ok and positive:
        ok = v > 0
    if not ok:
        kind = "an integer" if integer else "a finite number"
        raise serving_error(source, f"field {where!r} must be {kind}{' > 0' if positive else ''}, "
                                    f"got {v!r}")
    return int(v) if integer else float(v)


def _get(source: str, obj: Any, path: str) -> Any:
    cur = obj
    for part in path.split("."):
        if not isinstance(cur, dict) or part not in cur:
            raise serving_error(source, f"missing field {path!r}")
        cur = cur[part]
    return cur


def _read_yaml(path: Path) -> Any:
    import yaml

    try:
        text = path.read_text()
    except FileNotFoundError:
        raise TraceError(f"{str(path)!r} does not exist") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise TraceError(f"{str(path)!r}: not valid YAML ({str(exc)[:200]})") from None


def read_json(path: Path) -> Any:
    """The JSON document at ``path``; a missing, malformed or too deeply nested file is a
    :class:`TraceError` naming it."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise TraceError(f"{str(path)!r} does not exist") from None
    except json.JSONDecodeError as exc:
        raise TraceError(f"{str(path)!r}: not valid JSON ({exc})") from None
    except RecursionError:
        raise TraceError(f"{str(path)!r}: JSON nested too deeply") from None


def stage_measurements(path: str | Path) -> tuple[dict[str, dict[str, float]], int, int,
                                                     tuple[float, ...]]:
    """``(measured, n_ok, n_failed, prompt_quantiles)`` from one inference-perf lifecycle
    metrics file (``stage_K_lifecycle_metrics.json`` or ``summary_lifecycle_metrics.json``).

    ``measured`` maps :data:`METRICS` to their mean and p90 in seconds over the successful
    requests; ``prompt_quantiles`` is the measured prompt length at ``Q_LEVELS``."""
    p = Path(path)
    src = str(p)
    data = read_json(p)
    ok = _num(src, "successes.count", _get(src, data, "successes.count"), integer=True,
              positive=False)
    failed = _num(src, "failures.count", _get(src, data, "failures.count"), integer=True,
                  positive=False)
    if ok == 0:
        raise serving_error(src, "no successful request (successes.count is 0): nothing was "
                                 "measured")
    measured = {}
    for m, ip in _IP_METRICS.items():
        block = _get(src, data, f"successes.latency.{ip}")
        measured[m] = {s: _num(src, f"successes.latency.{ip}.{s}", _get(src, block, s),
                               positive=False) for s in ("mean", "p90")}
    pl = _get(src, data, "successes.prompt_len")
    quants = tuple(_num(src, f"successes.prompt_len.{q}", _get(src, pl, q)) for q in _QUANTILES)
    if any(b < a for a, b in zip(quants, quants[1:])):
        raise serving_error(src, f"successes.prompt_len quantiles are not non-decreasing: {quants}")
    return measured, ok, failed, quants


def load_inference_perf(folder: str | Path, *, gpu: str = "h100-sxm",
                        engine_version: str = "",
                        schedule_ahead: bool = True) -> list[ServingStage]:
    """The stages of one inference-perf run against vLLM, from its folder.

    Reads ``exp-config.yaml`` (``model``, ``tensor_parallelism``, ``max_num_batched_tokens``,
    ``max_num_seqs``, ``max_model_len``), ``results/config.yaml`` (``data.shared_prefix``,
    ``load.type`` and ``load.stages``, ``server.ignore_eos``) and each
    ``results/stage_K_lifecycle_metrics.json``. Only the ``shared_prefix`` data generator
    with ``ignore_eos`` is understood (the output length is then exact); anything else is
    an error naming the file and field. ``schedule_ahead``: the server's async scheduling
    (vLLM's default from 0.14 on; ``--no-async-scheduling`` turns it off)."""
    root = Path(folder)
    ecfg_path, cfg_path = root / "exp-config.yaml", root / "results" / "config.yaml"
    ecfg, cfg = _read_yaml(ecfg_path), _read_yaml(cfg_path)
    esrc, csrc = str(ecfg_path), str(cfg_path)
    model = str(_get(esrc, ecfg, "model"))
    llm = HF_MODELS.get(model.lower())
    if llm is None:
        raise serving_error(esrc, f"field 'model' is {model!r}, which has no catalog entry; known: "
                                  f"{', '.join(sorted(HF_MODELS))}")
    dtype = _get(csrc, cfg, "data.type")
    if dtype != "shared_prefix":
        raise serving_error(csrc, f"field 'data.type' is {dtype!r}; only 'shared_prefix' is "
                                  "supported")
    if _get(csrc, cfg, "server.ignore_eos") is not True:
        raise serving_error(csrc, "field 'server.ignore_eos' must be true (otherwise output "
                                  "lengths are not known)")
    load_type = _get(csrc, cfg, "load.type")
    if load_type not in ("constant", "poisson"):
        raise serving_error(csrc, f"field 'load.type' is {load_type!r}; known: constant, poisson")
    sp = _get(csrc, cfg, "data.shared_prefix")
    common = dict(
        model=model, llm=llm, gpu=gpu, engine="vllm", engine_version=engine_version,
        tp=_num(esrc, "tensor_parallelism", _get(esrc, ecfg, "tensor_parallelism"),
                integer=True),
        max_num_batched_tokens=_num(esrc, "max_num_batched_tokens",
                                    _get(esrc, ecfg, "max_num_batched_tokens"), integer=True),
        max_num_seqs=_num(esrc, "max_num_seqs", _get(esrc, ecfg, "max_num_seqs"), integer=True),
        max_model_len=_num(esrc, "max_model_len", _get(esrc, ecfg, "max_model_len"),
                           integer=True),
        prefix_caching=not bool(ecfg.get("no_enable_prefix_caching", False)),
        schedule_ahead=bool(schedule_ahead),
        arrivals=load_type,
        **{k: _num(csrc, f"data.shared_prefix.{src_k}", _get(csrc, sp, src_k), integer=True)
           for k, src_k in (("num_groups", "num_groups"),
                            ("prompts_per_group", "num_prompts_per_group"),
                            ("system_prompt_tokens", "system_prompt_len"),
                            ("question_tokens", "question_len"),
                            ("output_tokens", "output_len"))},
    )
    stages = _get(csrc, cfg, "load.stages")
    if not isinstance(stages, list) or not stages:
        raise serving_error(csrc, f"field 'load.stages' must be a non-empty list, got {stages!r}")
    out, start = [], 0.0
    for k, st in enumerate(stages):
        rate = _num(csrc, f"load.stages[{k}].rate", _get(csrc, st, "rate"))
        dur = _num(csrc, f"load.stages[{k}].duration", _get(csrc, st, "duration"))
        measured, ok, failed, quants = stage_measurements(
            root / "results" / f"stage_{k}_lifecycle_metrics.json")
        out.append(ServingStage(run=root.name, stage=k, rate_rps=rate, duration_s=dur,
                                start_s=start, prompt_quantiles=quants, measured=measured,
                                n_ok=ok, n_failed=failed, **common))
        start += dur
    return out


def stages_from_dicts(rows: Iterable[dict[str, Any]], source: str) -> list[ServingStage]:
    """:class:`ServingStage` objects from the bundled table's JSON rows; an unknown or
    missing field is an error naming ``source``, the row and the field."""
    names = set(ServingStage.__dataclass_fields__)
    out = []
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise serving_error(source, f"row {i} is not an object")
        extra = set(row) - names
        missing = {n for n in names - set(row)
                   if n not in ("measured", "n_ok", "n_failed", "requests")}
        if extra or missing:
            raise serving_error(source, f"row {i}: unknown fields {sorted(extra)}, missing "
                                        f"{sorted(missing)}")
        out.append(ServingStage(**{**row, "prompt_quantiles": tuple(row["prompt_quantiles"])}))
    return out


def load_serving_runs(path: str | Path) -> list[ServingStage]:
    """The stages of a serving-run table (this module's JSON: ``{"provenance": {...},
    "stages": [row, ...]}``)."""
    p = Path(path)
    data = read_json(p)
    if not isinstance(data, dict) or not isinstance(data.get("stages"), list):
        raise serving_error(str(p), "expected an object with a 'stages' list")
    return stages_from_dicts(data["stages"], str(p))


def bundled_serving_runs(name: str = "inference_sim_h100_vllm") -> list[ServingStage]:
    """The bundled public serving runs (``lpserve/data/serving/NAME.json``)."""
    folder = resources.files("lpserve") / "data" / "serving"
    path = folder / f"{name}.json"
    if not path.is_file():
        known = sorted(f.name[:-5] for f in folder.iterdir() if f.name.endswith(".json"))
        raise KeyError(f"unknown serving-run table {name!r}; bundled: {', '.join(known)}")
    return stages_from_dicts(json.loads(path.read_text())["stages"], f"bundled {name}")


# ---------------------------------------------------------------------------- workload
def _prompt_lengths(stage: ServingStage, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` prompt lengths drawn from the measured quantiles (piecewise-linear inverse CDF)."""
    u = rng.random(n)
    return np.maximum(np.rint(np.interp(u, Q_LEVELS, stage.prompt_quantiles)), 1).astype(
        np.int64)


def stage_trace(stages: Sequence[ServingStage], *, block_tokens: int = 16,
                seed: int = 0) -> tuple[Trace, np.ndarray]:
    """The workload the client sent in ``stages`` (one run's stages, in order), as one
    trace, and each request's stage index (int64, shape ``(n,)``).

    The shared-prefix generator's ``num_groups * prompts_per_group`` distinct prompts are
    drawn once (lengths from the measured quantiles; the group's system prompt leads) and
    sent in a shuffled order, cycling, as the client does: request ``i`` sends prompt
    ``order[i % P]``. Block ids follow the content: a group's full system-prompt blocks are
    shared by its prompts, every other block belongs to one prompt (and to its repeats).
    Arrivals: evenly spaced at each stage's rate (``constant``) or Poisson, each stage
    starting at its ``start_s``. Every request generates ``output_tokens`` tokens."""
    if not stages:
        raise TraceError("stage_trace needs at least one stage")
    first = stages[0]
    for s in stages[1:]:
        if s.run != first.run:
            raise TraceError(f"stage_trace takes one run's stages; got {first.run!r} and "
                             f"{s.run!r}")
    if first.requests is not None:
        return _recorded_trace(stages)
    rng = np.random.default_rng(seed)
    n_prompts = first.num_groups * first.prompts_per_group
    lengths = _prompt_lengths(first, n_prompts, rng)
    group = np.repeat(np.arange(first.num_groups), first.prompts_per_group)
    shared_blocks = first.system_prompt_tokens // block_tokens
    prompt_blocks: list[list[int]] = []
    next_id = first.num_groups * shared_blocks
    for j in range(n_prompts):
        nb = -(-int(lengths[j]) // block_tokens)
        k = min(shared_blocks, nb)
        row = [int(group[j]) * shared_blocks + b for b in range(k)]
        row.extend(range(next_id, next_id + nb - k))
        next_id += nb - k
        prompt_blocks.append(row)
    order = rng.permutation(n_prompts)
    arrivals, stage_of = [], []
    for idx, s in enumerate(stages):
        n = s.n_requests
        if s.arrivals == "constant":
            t = s.start_s + np.arange(n) / s.rate_rps
        else:
            t = s.start_s + np.cumsum(rng.exponential(1.0 / s.rate_rps, n))
            t = t[t < s.start_s + s.duration_s]
        arrivals.append(t)
        stage_of.append(np.full(t.size, idx, np.int64))
    arr = np.concatenate(arrivals)
    which = order[np.arange(arr.size) % n_prompts]
    flat, offs = pack_blocks([prompt_blocks[j] for j in which], arr.size)
    out = np.full(arr.size, first.output_tokens, np.int64)
    report = LoadReport(source=f"serving run {first.run}", format="serving-run",
                        n_read=arr.size, n_kept=arr.size)
    trace = Trace(arrival_s=arr, prompt_tokens=lengths[which], output_tokens=out,
                  block_flat=flat, block_offsets=offs, block_tokens=block_tokens,
                  name=first.run, report=report)
    return trace, np.concatenate(stage_of)


def _recorded_trace(stages: Sequence[ServingStage]) -> tuple[Trace, np.ndarray]:
    """The requests of stages read request by request, at their recorded send times (the
    prompts' content is not recorded: the trace has no block ids, so no two prompts share
    a cached prefix)."""
    parts = []
    for idx, s in enumerate(stages):
        if s.requests is None:
            raise TraceError(f"stage_trace: stage {s.key} has no recorded requests, "
                             f"{stages[0].key} has")
        r = s.requests
        parts.append((s.start_s + np.asarray(r["offset_s"], np.float64),
                      np.asarray(r["prompt_tokens"], np.int64),
                      np.asarray(r["output_tokens"], np.int64),
                      np.full(len(r["offset_s"]), idx, np.int64)))
    arr, prompt, out, stage_of = (np.concatenate(x) for x in zip(*parts))
    order = np.argsort(arr, kind="stable")
    arr, prompt, out, stage_of = arr[order], prompt[order], out[order], stage_of[order]
    report = LoadReport(source=f"serving run {stages[0].run}", format="serving-run",
                        n_read=arr.size, n_kept=arr.size)
    trace = Trace(arrival_s=arr, prompt_tokens=prompt, output_tokens=out,
                  name=stages[0].run, report=report)
    return trace, stage_of


def runs(stages: Iterable[ServingStage]) -> dict[str, list[ServingStage]]:
    """Stages grouped by run, each run's stages in order."""
    out: dict[str, list[ServingStage]] = {}
    for s in stages:
        out.setdefault(s.run, []).append(s)
    return {k: sorted(v, key=lambda s: s.stage) for k, v in out.items()}
