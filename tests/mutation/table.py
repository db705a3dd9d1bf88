"""The mutation table: small bugs planted on the code paths of lpserve's claims.

Each row names the file, the exact old text (it must occur exactly once there), the new
text, the claim it breaks (its proof file) and the tests that must fail when it is
applied (:mod:`tests.mutation.runner` applies one at a time to a copy of the repository).
Keep each row's tests few and fast: the whole table runs in the slow tier.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mutation:
    """One planted bug: ``file`` (relative to the repository root), ``old`` -> ``new``
    text, the ``claim`` it breaks and the pytest node ids ``tests`` that must fail."""

    id: str
    file: str
    old: str
    new: str
    claim: str
    tests: tuple[str, ...]


P_BOUNDS = "tests/properties/test_bounds_vs_sim.py::"
P_CLASSIC = "tests/properties/test_sched_classical.py::"
P_CACHE = "tests/properties/test_cache_bounds.py::"
P_LYAP = "tests/properties/test_lyapunov_dpp.py::"
P_MCSF = "tests/properties/test_sched_mcsf.py::"
P_KVC = "tests/properties/test_kv_compress.py::"
P_CLP = "tests/properties/test_cost_lp_vs_sim.py::"

MUTATIONS: tuple[Mutation, ...] = (
    # ------------------------------------------------------------ cost-model bound
    Mutation(
        "cost-kv-capacity-shrunk", "lpserve/opt/lower_bounds.py",
        "    cap = np.array([float(c.kv_capacity_tokens(instance.cluster.gpu_memory_fraction))",
        "    cap = np.array([0.9 * float(c.kv_capacity_tokens(instance.cluster.gpu_memory_fraction))",
        "proofs/cost-bound.md: the memory term with the KV capacity shrunk by 10 %",
        (P_BOUNDS + "test_tight_kv_memory_term_is_nearly_exact",)),
    Mutation(
        "cost-whole-prompt-prefill", "lpserve/opt/lower_bounds.py",
        "    return np.maximum(t1, r * u)\n",
        "    return np.asarray(cost.batch_times_s([{'prefill_tokens': [max(int(x), 1)]}"
        " for x in u]))\n",
        "proofs/cost-bound.md (A4): the whole-prompt prefill time, which chunking can beat",
        (P_BOUNDS + "test_chunked_prefill_beats_the_whole_prompt_time",)),
    Mutation(
        "cost-shared-blocks-charged-in-full", "lpserve/opt/lower_bounds.py",
        "        ar = (T2[hi] - T2[lo]) - discount * dec",
        "        ar = (T2[hi] - T2[lo])",
        "proofs/cost-bound.md (iii): every context charged in full although shared prefix "
        "blocks are held once (the old, false bound)",
        (P_BOUNDS + "test_shared_prefix_burst_counterexample",
         P_BOUNDS + "test_cost_bound_below_every_policy_shared_prefixes_tight_kv")),
    Mutation(
        "cost-cache-only-from-earlier-requests", "lpserve/evaluate/bounds.py",
        "        cached, discount = prefix_sharing(trace, instance.cluster.block_tokens)",
        "        from lpserve.opt.lower_bounds import reusable_prefix_tokens\n"
        "        cached = reusable_prefix_tokens(trace)\n"
        "        discount = prefix_sharing(trace, instance.cluster.block_tokens)[1]",
        "proofs/cost-bound.md (i): only blocks of earlier requests counted as cacheable",
        (P_BOUNDS + "test_later_request_fills_the_cache_of_a_released_child",)),
    Mutation(
        "cost-memory-term-over-released-children", "lpserve/evaluate/bounds.py",
        "        memory_term = np.ones(n, bool) if parent is None else np.asarray(parent) < 0",
        "        memory_term = np.ones(n, bool)",
        "proofs/cost-bound.md (iii): order statistics over requests released after arrival",
        (P_BOUNDS + "test_parents_release_after_arrival",)),
    Mutation(
        "order-statistics-largest-areas-first", "lpserve/opt/lower_bounds.py",
        "    A = np.cumsum(np.sort(area))",
        "    A = np.cumsum(np.sort(area)[::-1])",
        "proofs/area-bound.md, proofs/cost-bound.md: the k first completions used at least "
        "the k smallest areas (not the largest)",
        ("tests/unit/opt/test_lower_bounds.py::test_order_statistic_bound_simple",
         "tests/unit/opt/test_lower_bounds.py::test_area_bound_below_dp")),
    # ------------------------------------------------------------ cost-model LP, srpt-bound
    Mutation(
        "cost-lp-no-prefix-credit", "lpserve/opt/cost_lp_build.py",
        "    u = np.maximum(s - cached, 1)",
        "    u = np.maximum(s, 1)",
        "proofs/cost-lp-bound.md step 1: every prompt token charged although shared prefix "
        "blocks can come from the cache",
        (P_CLP + "test_cost_lp_below_policies_shared_prefix_tight_kv",)),
    Mutation(
        "cost-lp-capacity-halved", "lpserve/opt/cost_lp_build.py",
        '    capA = b.rows(n_k, -np.inf, R * dt_s, "capA")',
        '    capA = b.rows(n_k, -np.inf, 0.5 * R * dt_s, "capA")',
        "proofs/cost-lp-bound.md step 3: the capacity row (9) with half the replica time",
        (P_CLP + "test_cost_lp_below_policies_shared_prefix_tight_kv",)),
    Mutation(
        "srpt-bound-fixed-cost-per-token", "lpserve/opt/srpt_bound.py",
        "    work_a = nd * m.dec0_a",
        "    work_a = nd * (m.dec0_a + m.F_A)",
        "proofs/cost-lp-bound.md (srpt-bound): each token charged a whole iteration's fixed "
        "cost, which batching shares",
        (P_CLP + "test_cost_lp_below_policies_shared_prefix_tight_kv",)),
    # ------------------------------------------------------------ offline schedules
    Mutation(
        "search-value-without-its-order", "lpserve/opt/schedule_search.py",
        "            val, order, e2e = v, cand, e2e_c",
        "            val, e2e = v, e2e_c",
        "proofs/schedule-search-upper.md: the value of a neighbour reported with the "
        "incumbent's order",
        ("tests/unit/opt/test_schedule_search.py::"
         "test_local_moves_keep_the_value_of_the_schedule_they_return",)),
    # ------------------------------------------------------------ schedulers
    Mutation(
        "las-rank-negated", "lpserve/policies/schedulers.py",
        "        return np.floor_divide(view.generated_tokens, self.service_quantum_tokens)",
        "        return -np.floor_divide(view.generated_tokens, self.service_quantum_tokens)",
        "proofs/sched-setf-speed.md: las serves the most attained request",
        (P_CLASSIC + "test_las_policy_is_setf_in_the_simulator",)),
    Mutation(
        "las-kernel-rank-negated", "lpserve/sim/_ranks.py",
        "            res[k] = float(gen[cand[k]] // q)",
        "            res[k] = -float(gen[cand[k]] // q)",
        "proofs/sched-setf-speed.md: the compiled las ranks serve the most attained request",
        (P_CLASSIC + "test_las_policy_is_setf_in_the_simulator",)),
    Mutation(
        "setf-serves-most-attained", "lpserve/policies/schedulers.py",
        "            low = alive[att[alive] <= att[alive].min() + 1e-9]",
        "            low = alive[att[alive] >= att[alive].max() - 1e-9]",
        "proofs/sched-setf-speed.md: the fluid SETF serves the most attained jobs",
        (P_CLASSIC + "test_setf_speed_augmentation_on_the_adversary",)),
    Mutation(
        "srpt-longest-remaining-first", "lpserve/policies/schedulers.py",
        "        return out - view.generated_tokens if self.remaining else out.copy()",
        "        return view.generated_tokens - out if self.remaining else out.copy()",
        "proofs/srpt-wspt-classical.md: SRPT ranks the longest remaining job first",
        (P_CLASSIC + "test_srpt_in_simulator_equals_brute_force_optimum",)),
    Mutation(
        "wspt-length-times-weight", "lpserve/policies/schedulers.py",
        "        return view.output_tokens.astype(np.float64) / w",
        "        return view.output_tokens.astype(np.float64) * w",
        "proofs/srpt-wspt-classical.md: Smith's rule with the ratio upside down",
        (P_CLASSIC + "test_wspt_in_simulator_is_optimal",)),
    Mutation(
        "round-robin-most-recently-served-first", "lpserve/policies/schedulers.py",
        "            out[k] = self._served.get(i, float(view.arrival_s[k]))",
        "            out[k] = -self._served.get(i, float(view.arrival_s[k]))",
        "proofs/sched-round-robin.md: round robin serves the most recently served first",
        (P_CLASSIC + "test_round_robin_within_two_of_opt",)),
    Mutation(
        "mcsf-longest-first", "lpserve/opt/mcsf_ref.py",
        "    key = list(p) if priority is None else",
        "    key = [-x for x in p] if priority is None else",
        "proofs/mcsf-memory-safety.md: MC-SF sorted longest first",
        (P_MCSF + "test_reference_mcsf_starts_the_largest_fitting_prefix_of_shortest_first",)),
    Mutation(
        "mcsf-memory-check-one-token-loose", "lpserve/opt/mcsf_ref.py",
        "        if tot > M:\n            return False",
        "        if tot > M + 1:\n            return False",
        "proofs/mcsf-memory-safety.md: the future-memory check lets one token too many in",
        (P_MCSF + "test_reference_mcsf_starts_the_largest_fitting_prefix_of_shortest_first",
         "tests/properties/test_opt_schedule.py::test_mcsf_is_memory_safe_and_never_beats_opt")),
    Mutation(
        "fastserve-naive-entry-queue", "lpserve/policies/mlfq.py",
        "                lvl = entry_level(self._entry_service_s(view, k), self._base)",
        "                lvl = 0",
        "proofs/sched-mlfq-skip-join.md: skip-join replaced by entry into queue 0",
        ("tests/unit/policies/test_schedulers.py::test_fastserve_toy_instances",)),
    Mutation(
        "plas-no-program-inheritance", "lpserve/policies/programs.py",
        '                inh = prog[0] if self.mode == "plas" else prog[1]',
        '                inh = 0.0 if self.mode == "plas" else prog[1]',
        "proofs/sched-plas-atlas.md: a new call does not inherit its program's service",
        ("tests/unit/policies/test_schedulers.py::"
         "test_plas_inherits_program_service_and_beats_fcfs_on_example",)),
    # ------------------------------------------------------------ IP / LP builders
    Mutation(
        "schedule-ip-memory-one-token-short", "lpserve/opt/schedule_ip.py",
        "        coef = np.broadcast_to(s[i] + 1 + np.arange(o[i]), rr.shape)",
        "        coef = np.broadcast_to(s[i] + np.arange(o[i]), rr.shape)",
        "proofs/schedule-ip-exact.md: the memory rows charge one token less per round",
        ("tests/properties/test_opt_schedule.py::test_ip_equals_brute_force_and_bounds_below",)),
    Mutation(
        "round-model-charges-the-whole-prompt", "lpserve/opt/exact.py",
        "        return cls.from_arrays(np.maximum(arr, 0), prompt - 1, t.output_tokens,",
        "        return cls.from_arrays(np.maximum(arr, 0), prompt, t.output_tokens,",
        "proofs/schedule-ip-exact.md: an instance's request holds prompt + j - 1 tokens (3b)",
        ("tests/properties/test_sched_mcsf.py::"
         "test_two_one_token_requests_share_a_two_token_memory",)),
    Mutation(
        "prefix-lp-no-closure-rows", "lpserve/opt/cache_flow.py",
        "    P = J[acc.depth[J] > 0]",
        "    P = J[:0]",
        "proofs/kv-prefix-lp-bound.md: the prefix-closure rows (8) dropped",
        (P_CACHE + "test_prefix_lp_is_its_formulation_with_cost_weighted_values",)),
    Mutation(
        "foo-capacity-one-unit-short", "lpserve/opt/cache_flow.py",
        "                    col_upper=np.concatenate([np.full(ng, float(capacity)), s]),",
        "                    col_upper=np.concatenate([np.full(ng, float(capacity) - 1.0), s]),",
        "proofs/foo-bounds.md: FOO's inner arcs one size unit short of the capacity",
        (P_CACHE + "test_foo_brackets_the_exact_optimum",)),
    Mutation(
        "rebalance-milp-no-capacity-rows", "lpserve/opt/rebalance.py",
        "            float(model.capacity_blocks[d]))",
        "            np.inf)",
        "proofs/rebalance-milp.md: the destination KV capacity rows (11) dropped",
        ("tests/properties/test_rebalance_milp.py::test_milp_equals_brute_force",)),
    # ------------------------------------------------------------ evictors / caches
    Mutation(
        "belady-nearest-next-use", "lpserve/opt/cache_flow.py",
        "            heapq.heappush(heap, (-nreq[a], sgn * depth[a], a, k))",
        "            heapq.heappush(heap, (nreq[a], sgn * depth[a], a, k))",
        "proofs/belady-unit-optimal.md: evict the block used soonest instead of farthest",
        (P_CACHE + "test_belady_equals_brute_force_on_unit_instances",)),
    # ------------------------------------------------------------ preemption decider
    Mutation(
        "decider-one-host-block-too-many", "lpserve/policies/kvcompress.py",
        "        if view.swap_host_blocks <= view.host_free_blocks and \\",
        "        if view.swap_host_blocks <= view.host_free_blocks + 1 and \\",
        "proofs/kv-compress-decider.md: a full swap allowed one host block over the free ones",
        (P_KVC + "test_decider_at_the_host_memory_boundary",
         P_KVC + "test_decider_never_needs_a_host_block_more_than_is_free")),
    Mutation(
        "decider-compressed-one-host-block-too-many", "lpserve/policies/kvcompress.py",
        "        if view.compress_host_blocks <= view.host_free_blocks and \\",
        "        if view.compress_host_blocks <= view.host_free_blocks + 1 and \\",
        "proofs/kv-compress-decider.md: a compressed swap allowed one host block too many",
        (P_KVC + "test_decider_at_the_host_memory_boundary",
         P_KVC + "test_decider_never_needs_a_host_block_more_than_is_free")),
    # ------------------------------------------------------------ controllers
    Mutation(
        "lyapunov-B-smaller-C-zero", "lpserve/policies/lyapunov.py",
        "    C = b ** 2 / (4 * eta_tokens ** 2)  # serving at most the backlog, eq. (13)",
        "    B, C = 0.9 * B, 0.0  # serving at most the backlog, eq. (13)",
        "proofs/lyapunov-dpp.md: the drift constant B 10 % smaller and the cap constant C 0",
        (P_LYAP + "test_drift_and_cap_steps_hold_slot_by_slot_with_the_real_constants",)),
    Mutation(
        "lyapunov-tbt-queue-ignored", "lpserve/kernels/dpp.py",
        "        if n_dec > 0 and t > S:\n            j += st[ST_ZT] * n_dec\n",
        "",
        "proofs/lyapunov-dpp.md (percentile): the TBT virtual queue left out of decision (9)",
        (P_LYAP + "test_percentile_constraint_binds_under_heavy_prefill",)),
    # ------------------------------------------------------------ bandits
    Mutation(
        "ucb1-cycles-through-arms", "lpserve/policies/bandits.py",
        "        index = s / n + np.sqrt(2.0 * math.log(n.sum()) / n)\n"
        "        return int(np.argmax(index))",
        "        return int(n.sum() % self.n_arms)",
        "proofs/speculation-ucb-regret.md: no learning (the arms in turn)",
        ("tests/properties/test_speculation_regret.py::"
         "test_ucb_regret_below_bound_where_the_bound_can_fail",)),
    # ------------------------------------------------------------ session KV duel
    Mutation(
        "duel-follower-follows-the-other-shadow", "lpserve/policies/_group_kernels.py",
        "            lead = sh_ttl if pinning else sh_lru",
        "            lead = sh_lru if pinning else sh_ttl",
        "proofs/kv-duel-follower.md lemma 2: the real cache follows the shadow that does not "
        "lead (before any switch it would not be LRU)",
        ("tests/properties/test_duel_follower.py::test_real_cache_follows_its_leader",
         "tests/properties/test_duel_follower.py::"
         "test_follower_on_composed_sessions_switches_and_keeps_its_bounds")),
    Mutation(
        "duel-boundary-without-mixture-term", "lpserve/policies/_group_kernels.py",
        "    return np.sqrt((V + y) * (np.log1p(V / y) + 2.0 * np.log(1.0 / alpha)))",
        "    return np.sqrt((V + y) * (2.0 * np.log(1.0 / alpha)))",
        "proofs/kv-duel-follower.md (boundary): a fixed threshold instead of the time-uniform "
        "one, crossed more often than its level when the duel looks after every request",
        ("tests/properties/test_duel_follower.py::"
         "test_duel_boundary_is_crossed_at_most_alpha_of_the_time_without_a_leader",)),
    Mutation(
        "duel-follower-evicts-what-the-leader-holds", "lpserve/policies/_group_kernels.py",
        "        if inc[k] and not linc[k] and lpos[k] == lsc[4] - 1:  # the key's latest entry",
        "        if inc[k] and lpos[k] == lsc[4] - 1:  # the key's latest entry",
        "proofs/kv-duel-follower.md lemma 3: the real cache also evicts blocks its leader "
        "holds (the blocks the leader holds and it does not grow between switches)",
        ("tests/properties/test_duel_follower.py::"
         "test_follower_on_composed_sessions_switches_and_keeps_its_bounds",)),
)
