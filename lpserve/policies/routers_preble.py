"""Preble's global scheduler (E2): exploit/explore placement of prefixes over a global
radix tree, with load rebalancing and replication of hot prefixes.

Follows ``WukLab/preble`` at 785bd24, ``multi_node/global_scheduler_with_time.py``
(``GlobalSchedulerWithTime.runtime_selector``, ``SlidingWindowHistogram``,
``handle_important_node_stealing``, ``TTFTWindowedOverloadedDetector``), on prompt
block keys instead of token ids:

1. The prompt is inserted into one radix tree (shared by all replicas); nodes split where
   prompts diverge. Its *leaf* is the node that ends at the prompt; its *important node*
   the deepest node on its path whose own tokens outnumber the tokens before it.
2. **Exploit** when the insertion split no node, or the leaf's new tokens are fewer than
   the matched ones before it: the candidates are the replicas the nearest allocated
   ancestor is allocated to (all replicas at the root). **Explore** otherwise: all
   replicas. Among the candidates, the least *load cost*; the leaf and its ancestors are
   then allocated to the candidate set.
3. Load cost of replica ``g`` over a 3-minute window of important nodes allocated to it:
   ``sum miss_rate x count x T_pre(node) / |alloc(node)| + active(node, g) x
   output_len(node) x TPOT_g``, with ``T_pre`` the prefill time of the node's tokens
   after its context (the cost model of the first replica, as Preble uses one profile),
   ``output_len`` the median observed output of the node (else the request's predicted
   upper bound, else Preble's default 45), ``TPOT_g`` the median of the last 200 observed
   TPOTs on ``g`` (0.15 s before any).
4. **Rebalancing** after each routing decision once 50 requests were routed: replicas
   sorted by load cost (nodes counted twice or more); while the largest exceeds 1.5x the
   smallest, move its important nodes (cheapest first, with their subtrees) to the
   smallest; when it holds only one such node, **replicate** it onto the smallest if its
   TTFT doubled between the two halves of a 3-minute window.

The router learns TTFT, TPOT, output lengths and completions from the responses
(``reads_completions``). Defaults are Preble's; no eviction (``enable_eviction=False``
there). Replicas that cannot hold the prompt are never candidates.
"""
from __future__ import annotations

import statistics
from collections import deque
from typing import Any

import numpy as np

from lpserve.policies.routers_deployed import feasible_or_largest
from lpserve.policy import Router, RouterView

__all__ = ["Preble"]


def _median(values: Any) -> float:
    """``np.median`` of a short sequence of finite numbers (the same float: the middle value,
    or the two middle ones' sum over 2), without numpy's per-call overhead."""
    return float(statistics.median(values))


class _Node:
    __slots__ = ("keys", "parent", "children", "start", "ntok", "alloc", "ref", "decode",
                 "t_pre", "contrib", "seq")

    def __init__(self, keys: list, parent: "_Node | None", start: int, ntok: int,
                 R: int, seq: int = 0) -> None:
        self.keys, self.parent, self.children = keys, parent, {}
        self.start, self.ntok = start, ntok            # tokens before the node, its own
        self.alloc: set[int] = set()
        self.ref = np.zeros(R, np.int64)               # active requests through it
        self.decode: list[int] = []                    # observed output lengths
        self.t_pre = -1.0
        self.contrib: tuple[np.ndarray, np.ndarray] | None = None
        self.seq = seq                                 # creation order (ties, determinism)

    def large(self) -> bool:
        return self.ntok > self.start


class Preble(Router):
    """Preble's E2 global scheduler (see the module docstring)."""

    name = "preble"
    reads_completions = True

    def __init__(self, window_s: float = 180.0, high_load_ratio: float = 1.5,
                 rebalance_after: int = 50, default_output_tokens: int = 45,
                 default_tpot_s: float = 0.15) -> None:
        if not (window_s > 0 and high_load_ratio >= 1 and rebalance_after >= 0
                and default_output_tokens >= 1 and default_tpot_s > 0):
            raise ValueError("Preble: window_s > 0, high_load_ratio >= 1, rebalance_after >= 0, "
                             "default_output_tokens >= 1 and default_tpot_s > 0 required, got "
                             f"{(window_s, high_load_ratio, rebalance_after)}")
        self.window_s = float(window_s)
        self.high_load_ratio = float(high_load_ratio)
        self.rebalance_after = int(rebalance_after)
        self.default_output_tokens = int(default_output_tokens)
        self.default_tpot_s = float(default_tpot_s)
        self._cost: Any = None
        self._R = 0

    def reset(self, cluster: Any, rng: np.random.Generator) -> None:
        """Take the cluster's first cost model (``T_pre`` of the load cost: Preble uses one
        profile); the tree and windows start afresh on the next ``route``."""
        from lpserve.cost import cost_models_for

        self._cost = cost_models_for(cluster)[0]
        self._R = 0

    # ------------------------------------------------------------------ state
    def _start(self, R: int) -> None:
        self._R = R
        self._root = _Node([], None, 0, 0, R)
        self._seq = 0
        self._hist: dict[_Node, list] = {}   # node -> [count, prompt, hit, decoding_size]
        self._window: deque = deque()        # (t, node, context, hit)
        self._pre = np.zeros(R)              # aggregated load costs (all, count >= 2)
        self._dec = np.zeros(R)
        self._pre2 = np.zeros(R)
        self._dec2 = np.zeros(R)
        self._two: dict[_Node, tuple[np.ndarray, np.ndarray]] = {}
        self._tpot = [deque([self.default_tpot_s], maxlen=200) for _ in range(R)]
        self._ttft: dict[tuple[_Node, int], deque] = {}
        self._inflight: dict[int, tuple[_Node, int]] = {}
        self._routed = 0

    def _tpre(self, node: _Node) -> float:
        if node.t_pre < 0:
            node.t_pre = float(self._cost.batch_time_s(prefill_tokens=[max(node.ntok, 1)],
                                                       prefill_cached=[node.start]))
        return node.t_pre

    def _contribution(self, node: _Node) -> tuple[np.ndarray, np.ndarray]:
        """(prefill part, active x output part) of ``node`` on each replica."""
        pre, dec = np.zeros(self._R), np.zeros(self._R)
        h = self._hist.get(node)
        if h is None or not node.alloc:
            return pre, dec
        miss = 1.0 - h[2] / h[1] if h[1] > 0 else 1.0
        out = _median(node.decode) if node.decode else float(h[3])
        idx = np.fromiter(node.alloc, np.int64)
        pre[idx] = miss * h[0] * self._tpre(node) / len(node.alloc)
        dec[idx] = node.ref[idx] * out
        return pre, dec

    def _refresh(self, node: _Node) -> None:
        """Re-aggregate ``node``'s contribution after a change of its statistics."""
        if node.contrib is not None:
            self._pre -= node.contrib[0]
            self._dec -= node.contrib[1]
            node.contrib = None
        two = self._two.pop(node, None)
        if two is not None:
            self._pre2 -= two[0]
            self._dec2 -= two[1]
        h = self._hist.get(node)
        if h is not None and node.alloc:
            pre, dec = self._contribution(node)
            node.contrib = (pre, dec)
            self._pre += pre
            self._dec += dec
            if h[0] >= 2:
                self._two[node] = (pre, dec)
                self._pre2 += pre
                self._dec2 += dec

    def _costs(self, at_least_two: bool = False) -> np.ndarray:
        tpot = np.array([_median(d) for d in self._tpot])
        if at_least_two:
            return self._pre2 + tpot * self._dec2
        return self._pre + tpot * self._dec

    # ------------------------------------------------------------------ tree
    def _insert(self, keys: list, kt: int) -> tuple[_Node, bool]:
        """Insert a prompt's keys; returns (leaf, whether a node was split)."""
        node, pos, split = self._root, 0, False
        while True:
            if pos == len(keys):
                return node, split
            child = node.children.get(keys[pos])
            if child is None:
                leaf = self._new(keys[pos:], node, node.start + node.ntok,
                                 (len(keys) - pos) * kt)
                node.children[keys[pos]] = leaf
                return leaf, split
            m = 0
            ck = child.keys
            while m < len(ck) and pos + m < len(keys) and ck[m] == keys[pos + m]:
                m += 1
            if m < len(ck):
                child = self._split(child, m, kt)
                split = True
            node, pos = child, pos + m

    def _split(self, child: _Node, m: int, kt: int) -> _Node:
        """Split ``child`` after ``m`` keys; the new prefix node becomes its parent (it
        copies the allocation and active counts) and takes its histogram entry when it
        becomes the larger one, as Preble's ``handle_split_node_histogram``."""
        top = self._new(child.keys[:m], child.parent, child.start, m * kt)
        top.alloc = set(child.alloc)
        top.ref = child.ref.copy()
        child.parent.children[child.keys[0]] = top
        child.keys = child.keys[m:]
        child.start += top.ntok
        child.ntok -= top.ntok
        child.t_pre = -1.0
        child.parent = top
        top.children[child.keys[0]] = child
        if top.large() and not child.large() and child in self._hist:
            self._hist[top] = self._hist.pop(child)
            self._window = deque((t, top if nd is child else nd, c, h)
                                 for t, nd, c, h in self._window)
            for (nd, g) in [k for k in self._ttft if k[0] is child]:
                self._ttft[(top, g)] = self._ttft.pop((nd, g))
        self._refresh(child)
        self._refresh(top)
        return top

    def _new(self, keys: list, parent: _Node, start: int, ntok: int) -> _Node:
        self._seq += 1
        return _Node(keys, parent, start, ntok, self._R, self._seq)

    @staticmethod
    def _important(node: _Node) -> _Node:
        while node.parent is not None and not node.large():
            node = node.parent
        return node

    @staticmethod
    def _allocation(node: _Node | None, all_gpus: set[int]) -> set[int]:
        while node is not None:
            if node.alloc:
                return node.alloc
            node = node.parent
        return all_gpus

    # ------------------------------------------------------------------ routing
    def route(self, view: RouterView) -> np.ndarray:
        """One replica per arriving request, (n,) int64: the prompt joins the global tree;
        exploit (candidates: the replicas its nearest allocated ancestor is on) or explore
        (all replicas), the least load cost among the candidates that can hold it, then
        rebalancing (module docstring, 2-4)."""
        R, n = view.n_replicas, len(view)
        if self._R != R:
            self._start(R)
        self._observe(view)
        fits = view.fits()
        kt = view.key_tokens
        keys_all = view.block_keys
        hi = view.predicted_hi
        out = np.empty(n, np.int64)
        for k in range(n):
            now = view.now_s
            P = int(view.prompt_tokens[k])
            keys = keys_all[k].tolist() if k < len(keys_all) and kt > 0 else []
            if keys:
                leaf, split = self._insert(keys, kt)
            else:  # no block ids: the prompt is a segment of its own
                rid = ("request", int(view.request[k]))
                leaf = self._new([rid], self._root, 0, P)
                self._root.children[rid] = leaf
                split = False
            ok = feasible_or_largest(fits[k], view.max_prompt_tokens)
            allowed = set(np.flatnonzero(ok).tolist())
            exploit = not split or leaf.ntok < leaf.start
            cand = self._allocation(leaf, set(range(R))) if exploit else set(range(R))
            cand = (cand & allowed) or allowed
            costs = self._costs()
            order = sorted(cand)
            g = order[int(np.argmin(costs[order]))]
            imp = self._important(leaf)
            dec = int(hi[k]) if hi is not None else self.default_output_tokens
            self._add_window(now, imp, leaf.start + leaf.ntok, leaf.start, dec)
            chosen = cand if exploit else {g}  # Preble allocates the candidate set
            node = leaf
            while node is not None and node is not self._root:
                node.alloc |= chosen
                node.ref[g] += 1
                if node in self._hist:
                    self._refresh(node)
                node = node.parent
            self._inflight[int(view.request[k])] = (leaf, g)
            self._routed += 1
            if self._routed >= self.rebalance_after:
                self._rebalance(now)
            out[k] = g
        return out

    def _add_window(self, now: float, imp: _Node, context: int, hit: int, dec: int) -> None:
        h = self._hist.setdefault(imp, [0, 0, 0, dec])
        h[0] += 1
        h[1] += context
        h[2] += hit
        h[3] = dec
        self._window.append((now, imp, context, hit))
        self._refresh(imp)
        while self._window and self._window[0][0] < now - self.window_s:
            _, nd, c, hh = self._window.popleft()
            e = self._hist.get(nd)
            if e is None:
                continue
            e[0] -= 1
            e[1] -= c
            e[2] -= hh
            if e[1] <= 0:  # out of the window: the node loses its allocation
                del self._hist[nd]
                nd.alloc = set()
            self._refresh(nd)

    def _observe(self, view: RouterView) -> None:
        done = view.completions
        if done is None:
            return
        for q in range(done["request"].size):
            item = self._inflight.pop(int(done["request"][q]), None)
            if item is None:
                continue
            leaf, g = item
            imp = self._important(leaf)
            ttft = float(done["ttft_s"][q])
            self._ttft.setdefault((imp, g), deque()).append((view.now_s, ttft))
            out = int(done["output_tokens"][q])
            if out != 1:
                imp.decode.append(out)
                tp = float(done["tpot_s"][q])
                if np.isfinite(tp) and tp > 0:
                    self._tpot[g].append(tp)
            node = leaf
            while node is not None and node is not self._root:
                node.ref[g] -= 1
                if node in self._hist:
                    self._refresh(node)
                node = node.parent

    def _overloaded(self, node: _Node, g: int, now: float) -> bool:
        d = self._ttft.get((node, g))
        if not d:
            return False
        while d and d[0][0] < now - self.window_s:
            d.popleft()
        half = now - self.window_s / 2
        first = [v for t, v in d if t < half]
        second = [v for t, v in d if t >= half]
        if not first or not second:
            return False
        return float(np.mean(second)) >= 2.0 * float(np.mean(first))

    def _rebalance(self, now: float) -> None:
        cost = self._costs(at_least_two=True)
        order = sorted(range(self._R), key=lambda g: -cost[g])
        devs = [[g, float(cost[g])] for g in order]
        while len(devs) > 1:
            (big, big_c), (small, small_c) = devs[0], devs[-1]
            if big_c < self.high_load_ratio * small_c:
                return
            tpot = _median(self._tpot[big])
            heap = []
            for node, h in self._hist.items():
                if big in node.alloc and node.large() and h[0] > 1 and node.contrib:
                    pre, dec = node.contrib
                    heap.append((float(pre[big] + tpot * dec[big]), node.seq, node))
            if len(heap) == 1:
                c, _, node = heap[0]
                c /= 2
                if small not in node.alloc and self._overloaded(node, big, now):
                    big_c -= c
                    small_c += c
                    node.alloc.add(small)
                    self._ttft.pop((node, big), None)
                    self._refresh(node)
            else:
                heap.sort()
                for c, _, node in heap:
                    if big_c - c < small_c + c:
                        break
                    big_c -= c
                    small_c += c
                    self._move(node, small)
            devs[0][1], devs[-1][1] = big_c, small_c
            devs = devs[1:]

    def _move(self, node: _Node, g: int) -> None:
        stack = [node]
        while stack:
            nd = stack.pop()
            nd.alloc = {g}
            if nd in self._hist:
                self._refresh(nd)
            stack.extend(nd.children.values())
