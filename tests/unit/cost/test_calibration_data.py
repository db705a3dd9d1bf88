"""The packaged Splitwise repeat ranges agree with the packaged medians."""
import csv
from importlib import resources

KEYS = ("model", "hardware", "tensor_parallel", "prompt_size", "batch_size", "token_size")


def _rows(name):
    path = resources.files("lpserve") / "data" / "calibration" / name
    with path.open() as fh:
        return {tuple(r[k] for k in KEYS): r for r in csv.DictReader(fh)}


def test_spread_brackets_every_median():
    med = _rows("splitwise_perf_model_medians.csv")
    spread = _rows("splitwise_perf_model_spread.csv")
    assert set(med) == set(spread)
    for key, m in med.items():
        s = spread[key]
        assert int(s["repeats"]) >= 5, key
        for col in ("prompt_time", "token_time"):
            lo, hi = float(s[f"{col}_ms_min"]), float(s[f"{col}_ms_max"])
            # medians and ranges are rounded to 0.01 ms
            assert lo - 0.01 <= float(m[f"{col}_ms_median"]) <= hi + 0.01, (key, col)
