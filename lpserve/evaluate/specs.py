"""Engine parameters and rejections of a comparison (layer 5).

* :func:`engine_for` -- the :class:`~lpserve.policy.EngineConfig` overrides of one policy
  from a comparison's ``engine`` mapping: ``{field: value}`` for every policy, and
  ``{label: {field: value}}`` for one policy (its label in the table), the latter winning.
* :func:`parse_engine_flags` -- the same mapping from ``--engine [POLICY[,POLICY...]:]KEY=VALUE``
  texts (the CLI and sweep grids).
* :func:`shared_engine_overrides` -- the overrides that run a policy on another policy's
  engine, its own decisions kept (``lp.compare``'s ``shared_engine``).
* :func:`rejection_warnings` -- one loud line per policy that rejected more than
  :data:`REJECTION_WARN_SHARE` of a trace, with the reasons and what would serve them.
"""
from __future__ import annotations

import warnings
from typing import Any, Mapping, Sequence

#: a policy that rejects more than this share of a trace's requests gets a warning
REJECTION_WARN_SHARE = 0.01


class RejectionWarning(UserWarning):
    """A policy rejected more than :data:`REJECTION_WARN_SHARE` of the requests."""


def _fields() -> set[str]:
    from dataclasses import fields

    from lpserve.policy import EngineConfig

    return {f.name for f in fields(EngineConfig)}


def check_engine(engine: Mapping[str, Any] | None, labels: Sequence[str], *,
                 where: str = "engine") -> None:
    """Refuse keys of ``engine`` that are neither EngineConfig fields nor policy labels
    (with a mapping as value), naming ``where`` and the key."""
    if engine is None:
        return
    if not isinstance(engine, Mapping):
        raise ValueError(f"{where}: expected a mapping of EngineConfig fields (or policy "
                         f"label -> mapping), got {type(engine).__name__}")
    names = _fields()
    for key, value in engine.items():
        if isinstance(value, Mapping):
            if key not in labels:
                raise ValueError(f"{where}: {key!r} is not a policy of this comparison "
                                 f"({', '.join(labels)})")
            bad = sorted(set(value) - names)
            if bad:
                raise ValueError(f"{where}[{key!r}]: unknown engine parameter(s) {bad}; "
                                 f"EngineConfig fields: {', '.join(sorted(names))}")
        elif key not in names:
            raise ValueError(f"{where}: unknown engine parameter {key!r}; EngineConfig "
                             f"fields: {', '.join(sorted(names))} (or a policy label with "
                             "a mapping of them)")


def engine_for(engine: Mapping[str, Any] | None, label: str) -> dict[str, Any]:
    """The overrides of policy ``label``: the shared fields, then its own mapping."""
    if not engine:
        return {}
    out = {k: v for k, v in engine.items() if not isinstance(v, Mapping)}
    own = engine.get(label)
    if isinstance(own, Mapping):
        out.update(own)
    return out


def apply_engine(policy: Any, overrides: Mapping[str, Any], *, where: str) -> Any:
    """``policy`` with its engine updated by ``overrides`` (validated; errors name
    ``where`` and the key); the policy's name and meta are kept."""
    if not overrides:
        return policy
    cfg = policy.engine.updated(overrides, where=where)
    return policy.with_(engine=cfg, meta=policy.meta)


def parse_engine_flags(items: Sequence[str], policies: Sequence[str], *,
                       flag: str = "--engine") -> dict[str, Any]:
    """``[POLICY[,POLICY...]:]KEY=VALUE`` texts -> the ``engine`` mapping of
    :func:`~lpserve.evaluate.compare` (values parsed and validated against
    :class:`~lpserve.policy.EngineConfig`; errors name ``flag`` and the key). Without a
    ``POLICY:`` prefix a value applies to every policy."""
    from lpserve.policy.engine import parse_engine_value

    out: dict[str, Any] = {}
    for item in items:
        lhs, sep, text = item.partition("=")
        scope, colon, key = lhs.rpartition(":")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"{flag} must look like [POLICY[,POLICY...]:]KEY=VALUE, got "
                             f"{item!r}")
        value = parse_engine_value(key, text, f"{flag} {item!r}")
        if not colon:
            out[key] = value
            continue
        for pol in (p.strip() for p in scope.split(",")):
            if pol not in policies:
                raise ValueError(f"{flag} {item!r}: policy {pol!r} is not among the "
                                 f"policies compared ({', '.join(policies)})")
            out.setdefault(pol, {})[key] = value
    return out


def shared_engine_overrides(anchor: Any, policy: Any, owned: Sequence[str],
                            cluster: Any) -> dict[str, Any]:
    """The overrides that put ``policy`` on ``anchor``'s engine on ``cluster`` (both
    :class:`~lpserve.policy.Policy`; each engine as it runs there, GPU-set fields
    included): every EngineConfig field but ``owned`` takes the anchor's value, where it
    differs from the policy's."""
    mine = policy.engine_on(cluster)
    theirs = anchor.engine_on(cluster)
    return {k: v for k, v in theirs.machine_fields().items()
            if k not in owned and getattr(mine, k) != v}


def describe_overrides(overrides: Mapping[str, Any]) -> str:
    """``"max_num_batched_tokens=131072, max_num_seqs=128"`` (sorted)."""
    return ", ".join(f"{k}={v}" for k, v in sorted(overrides.items()))


_HINTS = {
    "prompt_exceeds_token_budget": "prompts longer than max_num_batched_tokens={budget:,} "
        "(the longest is {max_prompt:,} tokens) are never scheduled without chunked "
        "prefill: raise it (engine={{{label!r}: {{'max_num_batched_tokens': N}}}}, CLI "
        "--engine {label}:max_num_batched_tokens=N with N >= {max_prompt:,})",
    "prompt_exceeds_kv": "the prompt does not fit in one replica's KV memory: more GPU "
        "memory, tensor parallelism or a smaller model",
    "exceeds_max_model_len": "prompt + output above max_model_len={max_model_len}",
}


def rejection_warnings(rows: Sequence[Mapping[str, Any]], instance: Any,
                       policies: Mapping[str, Any], n_common: int, over: str,
                       case: str = "") -> list[str]:
    """One line per policy (``rows``: first seed of each) that rejected more than
    :data:`REJECTION_WARN_SHARE` of the requests, each also issued as a
    :class:`RejectionWarning`."""
    import json

    out = []
    n = len(instance.trace)
    max_prompt = int(instance.trace.prompt_tokens.max()) if n else 0
    for r in rows:
        rej = int(r["n_rejected"])
        if n == 0 or rej / n <= REJECTION_WARN_SHARE:
            continue
        label = r["policy"]
        eng = policies[label].engine
        reasons = json.loads(r.get("rejection_reasons") or "{}")
        hints = [h.format(budget=eng.max_num_batched_tokens, max_prompt=max_prompt,
                          label=label, max_model_len=eng.max_model_len)
                 for k, h in _HINTS.items() if k in reasons]
        scope = (f"the latency columns compare the {n_common:,} requests every policy "
                 "served" if over == "common" else
                 "its latency columns cover only the requests it served")
        msg = (f"{label} rejected {rej:,} of {n:,} requests ({100 * rej / n:.1f} %)"
               f"{' at ' + case if case else ''}: "
               + ", ".join(f"{k} {v:,}" for k, v in reasons.items())
               + f"; {scope}" + ("; " + "; ".join(hints) if hints else ""))
        warnings.warn(msg, RejectionWarning, stacklevel=3)
        out.append(msg)
    return out


__all__ = ["REJECTION_WARN_SHARE", "RejectionWarning", "apply_engine", "check_engine",
           "describe_overrides", "engine_for", "parse_engine_flags", "rejection_warnings",
           "shared_engine_overrides"]
