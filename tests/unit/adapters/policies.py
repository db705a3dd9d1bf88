"""Small non-FCFS schedulers the adapter tests run inside vLLM and Vidur, importable by
``module:attr`` spec (``tests.unit.adapters.policies:shortest_prompt_first``) from an
engine process started in the repository root.

None needs output lengths, so each runs in a real engine.
"""
from __future__ import annotations

import numpy as np

from lpserve.policy import Meta, Policy, SchedulerView, as_scheduler


def _shortest_prompt(view: SchedulerView) -> np.ndarray:
    # fewest uncached prompt tokens first; ties keep the engine's (arrival) order
    return (view.prompt_tokens - view.cached_tokens).astype(np.float64)


#: shortest-prompt-first: a waiting request with the fewest uncached prompt tokens is
#: admitted first; among running requests the longest prompt is the preemption victim.
shortest_prompt_first = as_scheduler(_shortest_prompt, name="shortest-prompt-first",
                                     meta=Meta(online=True, clairvoyant=False))


def longest_prompt_first() -> Policy:
    """A factory (a Policy with the default router): most prompt tokens first."""
    return Policy(scheduler=as_scheduler(lambda v: -v.prompt_tokens.astype(np.float64),
                                         name="longest-prompt-first"),
                  name="longest-prompt-first")


def hold_above(max_prompt_tokens: int):
    """Shortest prompt first, holding back (rank ``+inf``) waiting prompts longer than
    ``max_prompt_tokens`` while anything else is queued or running."""
    if not isinstance(max_prompt_tokens, int) or max_prompt_tokens < 1:
        raise ValueError(f"hold_above: max_prompt_tokens must be a positive integer, got "
                         f"{max_prompt_tokens!r}")

    def rank(view: SchedulerView) -> np.ndarray:
        r = view.prompt_tokens.astype(np.float64)
        long_ = (view.prompt_tokens > max_prompt_tokens) & ~view.running
        if (~long_).any():
            r[long_] = np.inf
        return r

    return as_scheduler(rank, name=f"hold-above-{max_prompt_tokens}")


def _explode(view: SchedulerView) -> np.ndarray:
    raise RuntimeError("policy bug: division by zero in rank")


#: a scheduler whose rank() always raises (fault-injection tests)
exploding = as_scheduler(_explode, name="exploding")

#: a scheduler returning one rank too few
short_ranks = as_scheduler(lambda v: np.zeros(max(len(v) - 1, 0)), name="short-ranks")

#: a clairvoyant scheduler (refused by engine adapters)
needs_output = as_scheduler(lambda v: v.output_tokens.astype(float), name="needs-output",
                            meta=Meta(clairvoyant=True))
