"""Engine parameters and predictors wherever a policy is named: parsing and validation
(errors name the flag and key), per-policy scoping, the registered defaults untouched, and
the refusal to run a prediction-reading policy without predictions."""
from __future__ import annotations

import numpy as np
import pytest

import lpserve as lp
from lpserve.evaluate import compare
from lpserve.evaluate.specs import (
    RejectionWarning,
    check_engine,
    engine_for,
    parse_engine_flags,
)
from lpserve.policies.predictors import History, NoisyOracle, parse_predictor
from lpserve.policy import EngineConfig
from lpserve.policy.engine import parse_engine_value
from lpserve.registry import MissingPredictions, make_policy

PREDICTION_READERS = ("sjf-predicted", "mlfq-predicted", "mcsf", "a-max", "a-min",
                      "slo-aware")


@pytest.fixture(scope="module")
def inst():
    trace = lp.bundled_trace().window(0.0, 25.0)
    return lp.Instance(trace=trace, cluster=lp.Cluster(gpu="a100-80gb", llm="llama-2-7b",
                                                       replicas=2))


# ------------------------------------------------------------------ engine parameters
@pytest.mark.parametrize("key, text, value", [
    ("max_num_batched_tokens", "131072", 131072), ("max_num_batched_tokens", "131_072", 131072),
    ("chunked_prefill", "true", True), ("prefix_caching", "off", False),
    ("max_model_len", "none", None), ("watermark", "0.05", 0.05),
    ("preemption", "swap", "swap"), ("batching", "decode-first", "decode-first")])
def test_engine_values_parse(key, text, value):
    assert parse_engine_value(key, text) == value


@pytest.mark.parametrize("key, text, words", [
    ("max_num_batched_tokens", "lots", ["--engine", "max_num_batched_tokens='lots'",
                                        "integer"]),
    ("chunked_prefill", "maybe", ["chunked_prefill", "true or false"]),
    ("preemption", "drop", ["preemption", "recompute, swap, compress-swap"]),
    ("max_num_sqs", "4", ["unknown engine parameter", "'max_num_sqs'"]),
    ("speculation", "ucb", ["object", "Python"])])
def test_engine_value_errors_name_flag_and_key(key, text, words):
    with pytest.raises(ValueError) as e:
        parse_engine_value(key, text, "--engine")
    for w in words:
        assert w in str(e.value)


def test_engine_updated_validates_the_whole_config():
    e = make_policy("vllm-v0").engine  # prefill-first: chunked prefill is refused
    assert e.updated({"max_num_batched_tokens": "131072"}).max_num_batched_tokens == 131072
    with pytest.raises(ValueError, match=r"--engine \(max_num_seqs='0'\).*max_num_seqs must"):
        e.updated({"max_num_seqs": "0"}, where="--engine")
    with pytest.raises(ValueError, match="chunked_prefill needs batching='decode-first'"):
        e.updated({"chunked_prefill": True})
    with pytest.raises(ValueError, match="integer, not a boolean"):
        e.updated({"max_num_seqs": True})


def test_engine_flags_scope_to_policies():
    pols = ["vllm", "sarathi", "mcsf"]
    eng = parse_engine_flags(["max_num_seqs=128", "vllm,mcsf:max_num_batched_tokens=131072",
                              "mcsf:max_num_seqs=64"], pols)
    assert engine_for(eng, "vllm") == {"max_num_seqs": 128, "max_num_batched_tokens": 131072}
    assert engine_for(eng, "sarathi") == {"max_num_seqs": 128}
    assert engine_for(eng, "mcsf") == {"max_num_seqs": 64, "max_num_batched_tokens": 131072}
    with pytest.raises(ValueError, match="'orca' is not among the policies compared"):
        parse_engine_flags(["orca:max_num_seqs=4"], pols)
    with pytest.raises(ValueError, match=r"\[POLICY\[,POLICY...\]:\]KEY=VALUE"):
        parse_engine_flags(["max_num_seqs"], pols)
    with pytest.raises(ValueError, match="unknown engine parameter 'budget'"):
        check_engine({"budget": 3}, pols)
    with pytest.raises(ValueError, match="'orca' is not a policy of this comparison"):
        check_engine({"orca": {"max_num_seqs": 4}}, pols)


def test_compare_applies_engine_per_policy_and_leaves_defaults(inst):
    before = {n: make_policy(n).engine for n in ("vllm-v0", "sarathi")}
    with pytest.warns(RejectionWarning, match="vllm-v0 rejected"):
        t = compare(inst, ["vllm-v0", "sarathi"], [], engine={
            "max_num_seqs": 64, "vllm-v0": {"max_num_batched_tokens": 2048}})
    d = dict(zip(t["policy"], t["description"]))
    assert "2048 tokens/iteration, 64 seqs" in d["vllm-v0"]
    assert "512 tokens/iteration, 64 seqs" in d["sarathi"] and "2048" not in d["sarathi"]
    # a 2,048-token budget rejects the longer prompts of the non-chunked engine
    n_long = int((inst.trace.prompt_tokens > 2048).sum())
    assert n_long > 0
    assert int(t.set_index("policy").loc["vllm-v0", "n_rejected"]) == n_long
    assert {n: make_policy(n).engine for n in before} == before  # registry untouched
    assert EngineConfig().max_num_batched_tokens == 8192


# ------------------------------------------------------------------ predictors
def test_predictor_specs():
    assert isinstance(parse_predictor("history"), History)
    p = parse_predictor("noisy-oracle:sigma=0.3,interval_z=1")
    assert isinstance(p, NoisyOracle) and p.sigma == 0.3 and p.interval_z == 1.0
    assert parse_predictor("history:prior=8/512/128").prior == (8, 512, 128)
    for spec, words in [("histori", ["unknown predictor", "'histori'", "history"]),
                        ("history:q=0.2", ["no parameter 'q'", "q_lo"]),
                        ("noisy-oracle:sigma=wide", ["sigma='wide'", "float"]),
                        ("noisy-oracle:sigma=-1", ["sigma must be >= 0"])]:
        with pytest.raises(ValueError) as e:
            parse_predictor(spec, "--predictor")
        assert all(w in str(e.value) for w in words), str(e.value)
        assert "--predictor" in str(e.value)


@pytest.mark.parametrize("name", PREDICTION_READERS)
def test_prediction_readers_refuse_a_trace_without_predictions(inst, name):
    assert make_policy(name).reads_predictions
    with pytest.raises(MissingPredictions) as e:
        lp.simulate(inst, name)
    assert repr(name) in str(e.value) and "predictor" in str(e.value)


def test_other_policies_do_not_read_predictions():
    for name in ("vllm", "sarathi", "srpt-oracle", "mlfq", "fastserve", "lyapunov",
                 "mcsf-oracle"):
        assert not make_policy(name).reads_predictions, name


def test_predictor_spec_object_and_none(inst):
    a = lp.simulate(inst, "sjf-predicted", predictor="noisy-oracle:sigma=0.3")
    b = lp.simulate(inst, "sjf-predicted", predictor=NoisyOracle(sigma=0.3))
    assert a.digest() == b.digest()
    # "none" runs the documented fallback on purpose: FCFS, i.e. vLLM V0's order (the
    # engine sjf-predicted runs on)
    fb = lp.simulate(inst, "sjf-predicted", predictor="none")
    ref = lp.simulate(inst, "vllm-v0")
    assert np.array_equal(fb.arrays["finish_s"], ref.arrays["finish_s"])
    with pytest.raises(MissingPredictions):
        compare(inst, ["vllm", "sjf-predicted"], [])
    t = compare(inst, ["vllm", "sjf-predicted"], [], predictor="history")
    assert list(t["policy"]) == ["vllm", "sjf-predicted"]
