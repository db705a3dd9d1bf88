"""``lpserve list``: every list prints, JSON has the items, and LLMs carry context lengths."""
from __future__ import annotations

import json

import pytest

from lpserve.cli import main
from lpserve.commands.list_cmd import WHAT


@pytest.mark.parametrize("what", WHAT)
def test_every_list_prints_and_has_json(what, capsys):
    assert main(["list", what]) == 0
    text = capsys.readouterr().out
    assert text.startswith("name") and len(text.splitlines()) >= 3
    assert main(["list", what, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["what"] == what and d["items"] and all("name" in r for r in d["items"])


def test_lists_hold_what_other_commands_accept(capsys):
    from lpserve.evaluate.compare import SOLVED_POLICIES
    from lpserve.opt import FORMULATIONS
    from lpserve.registry import policy_names

    def items(what):
        assert main(["list", what, "--json"]) == 0
        return {r["name"]: r for r in json.loads(capsys.readouterr().out)["items"]}

    llms = items("llms")
    assert llms["llama-3-8b"]["max_context"] == 8192
    assert llms["llama-2-7b"]["max_context"] == 4096
    assert llms["llama-3-8b"]["kv_kib_per_token"] == 128.0   # 2 x 32 x 8 x 128 x 2 bytes
    # every packaged LLM has its context length (entries other tests registered from a
    # config.json or TOML file without one are listed with None)
    from lpserve.cost import catalog

    assert all(r["max_context"] for k, r in llms.items() if k not in catalog._USER_LLMS)
    pols = items("policies")
    # lpserve gap --policies accepts the registered names and the policies it solves
    assert set(policy_names()) | set(SOLVED_POLICIES) == set(pols)
    assert {"lp-index", "lp-split", "lp-locality"} <= set(pols)
    assert pols["sjf-predicted"]["reads_predictions"] and not pols["vllm"]["reads_predictions"]
    # vLLM V0's fixed budget; V1 (vllm) picks its budget by the GPU (2,048 without one)
    assert pols["vllm-v0"]["max_num_batched_tokens"] == 4096
    assert pols["vllm-v0"]["set_by_gpu"] is None and not pols["vllm-v0"]["chunked_prefill"]
    assert pols["vllm"]["max_num_batched_tokens"] == 2048 and pols["vllm"]["chunked_prefill"]
    assert pols["vllm"]["set_by_gpu"] == "max_num_batched_tokens,max_num_seqs"
    # the solved policies run behind the vllm engine, and the list says so
    assert pols["lp-index"]["batching"] == pols["vllm"]["batching"] == "decode-first"
    assert set(items("formulations")) == set(FORMULATIONS)
    assert items("traces")["mooncake-conv-5min"]["n_requests"] == 918
    assert items("gpus")["h100-sxm"]["memory_gib"] == 80
    eng = items("engine")
    assert eng["speculation"]["values"] == "object (Python only)"
    assert items("predictors")["history"]["clairvoyant"] is False
