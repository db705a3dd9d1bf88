"""The published anchors on the shared Mooncake 30-minute slice (512-token blocks, capacity
5,859 blocks, cold start): LRU 13.47 %, Belady 33.26 %, prefix-LP bound 33.53 %, rounded LP
33.53 %, infinite cache 34.09 % (reproduced within 0.3 points), and the bound chain
online <= Belady <= LP <= infinite for every online evictor. Skipped with a reason where
../shared is absent; the bundled-slice tests cover the same code then."""
from __future__ import annotations

import json
import subprocess
import sys

ANCHORS = {"lru": 0.1347, "belady": 0.3326, "lp": 0.3353, "lp-rounded": 0.3353,
           "infinite": 0.3409}


def test_mooncake_anchors_and_bound_chain(shared_traces):
    out = subprocess.run(
        [sys.executable, "-m", "lpserve.cli", "cache", "--trace",
         str(shared_traces / "mooncake_fast25_conversation_first30min.jsonl.gz"),
         "--capacity-blocks", "5859", "--block-tokens", "512", "--json"],
        check=True, capture_output=True, text=True, timeout=600).stdout
    d = json.loads(out)
    rate = {r["policy"]: r["hit_rate"] for r in d["results"]}
    for name, want in ANCHORS.items():
        assert abs(rate[name] - want) <= 0.003, (name, rate[name], want)
    offline = {"infinite", "lp", "lp-rounded", "foo-l", "foo-u", "belady", "belady-prefix"}
    online = {k: v for k, v in rate.items() if k not in offline}
    assert "lru" in online and len(online) >= 5
    for name, r in online.items():
        assert r <= rate["belady-prefix"] + 1e-12 <= rate["lp"] + 1e-9, name
        assert r >= rate["lru"] - 1e-12, f"{name} loses to LRU: {r} < {rate['lru']}"
    assert rate["lp-rounded"] <= rate["lp"] + 1e-12 <= rate["infinite"] + 1e-9
