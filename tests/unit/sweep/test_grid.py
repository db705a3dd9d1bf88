"""Sweep grids: parsing, clear errors that name the key and value, expansion, digests."""
from __future__ import annotations

import copy

import numpy as np
import pytest

from lpserve.sweep import Grid, GridError, bundled_grids, cell_digest, load_grid, replication_seeds
from lpserve.sweep.runner import expand, load_traces

from ._grids import sim_grid, stats_grid

FAKE_DIGESTS = {"conv": "0" * 64}


def test_parse_dict_and_count_cells():
    g = load_grid(sim_grid(policies=("vllm", "sarathi", "orca"), loads=(1.0, 2.0),
                           replications=4))
    assert g.n_cells == 3 * 2 * 4
    cells = g.cells(FAKE_DIGESTS)
    assert len(cells) == g.n_cells
    assert len({c.digest for c in cells}) == g.n_cells
    # first axis outermost, replications innermost
    assert [c.inputs["policy"] for c in cells[:8]] == ["vllm"] * 8
    assert [c.inputs["rep"] for c in cells[:4]] == [0, 1, 2, 3]


def test_parse_toml_file_with_relative_trace_path(tmp_path, fixtures):
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "code.csv").write_text((fixtures / "azure_code_40.csv").read_text())
    p = tmp_path / "g.toml"
    p.write_text('name = "file"\nkind = "stats"\n[traces.code]\nsource = "traces/code.csv"\n'
                 '[axes]\nload = [1, 2.5]\n')
    g = load_grid(p)
    assert g.traces["code"].source == str((tmp_path / "traces" / "code.csv").resolve())
    assert g.axes["load"] == [1.0, 2.5] and all(isinstance(x, float) for x in g.axes["load"])


def test_bundled_grids_parse_and_sizes():
    assert {"default", "bench200"} <= set(bundled_grids())
    assert load_grid("bench200").n_cells == 200
    assert 20 <= load_grid("default").n_cells <= 60


@pytest.mark.parametrize("change, words", [
    (lambda g: g["axes"].update(polcy=["vllm"]), ["unknown axis", "'polcy'"]),
    (lambda g: g["axes"].update(policy=["vllm", "vlm"]), ["axes.policy[1]", "unknown policy",
                                                         "'vlm'"]),
    (lambda g: g["axes"].update(load=[]), ["axes.load", "empty"]),
    (lambda g: g["axes"].update(load=[1.0, -2.0]), ["axes.load[1]", "> 0", "-2.0"]),
    (lambda g: g["axes"].update(load=[1.0, 1]), ["axes.load[1]", "duplicate", "1"]),
    (lambda g: g["axes"].update(load="1.0"), ["axes.load", "list", "'1.0'"]),
    (lambda g: g["axes"].update(replicas=[1, 1.5]), ["axes.replicas[1]", "integer", "1.5"]),
    (lambda g: g["axes"].update(trace=["nope"]), ["axes.trace[0]", "unknown trace", "'nope'"]),
    (lambda g: g.update(kind="simulat"), ["kind", "unknown cell kind", "'simulat'"]),
    (lambda g: g.update(replications=0), ["replications", "0"]),
    (lambda g: g.update(colour="red"), ["unknown key", "'colour'"]),
    (lambda g: g["slo"].update(ttft=1.0), ["[slo]", "'ttft'"]),
    (lambda g: g.update(cluster={"gpus": "a100-80gb"}), ["[cluster]", "'gpus'"]),
    (lambda g: g.update(params={"load": 1.0}), ["axes.load", "also given a fixed value"]),
    (lambda g: g["traces"]["conv"].update(arrivals="bursty"), ["traces.conv.arrivals",
                                                               "'bursty'"]),
    (lambda g: g["traces"]["conv"].update(source="no/such.csv"), ["traces.conv.source",
                                                                  "'no/such.csv'"]),
    (lambda g: g["traces"]["conv"].update(head=0), ["traces.conv.head", "0"]),
    (lambda g: g["axes"].update(seed=[1, 2]), ["axes.seed", "replications = 1"]),
    (lambda g: g["axes"].update(rate_per_s=[3.0]), ["load", "rate_per_s", "not both"]),
    (lambda g: g["axes"].pop("policy"), ["policy"]),
])
def test_bad_grids_name_key_and_value(change, words):
    g = sim_grid()
    change(g)
    with pytest.raises(GridError) as e:
        Grid.from_dict(g)
    for w in words:
        assert w in str(e.value), (w, str(e.value))


def test_unknown_bundled_grid_and_bad_toml(tmp_path):
    with pytest.raises(GridError, match="no such file or bundled grid.*default"):
        load_grid("defualt")
    p = tmp_path / "bad.toml"
    p.write_text("name = \n")
    with pytest.raises(GridError, match="invalid TOML"):
        load_grid(p)


def test_cell_digest_is_stable_across_versions():
    """A fixed set of canonical inputs has a fixed key (changing it orphans stored cells)."""
    inputs = {"schema": 1, "kind": "simulate", "policy": "vllm", "load": 2.0, "seed": 5,
              "rep": 0, "trace": {"name": "t", "digest": "ab", "head": 10, "start": 0,
                                  "arrivals": "trace"}}
    expected = "694b0f39687c10b17f1dbdc76b54d479e9ddd2b138fe37c23f8d989f383d7f94"
    assert cell_digest(inputs) == expected
    shuffled = dict(reversed(list(copy.deepcopy(inputs).items())))
    assert cell_digest(shuffled) == expected
    assert cell_digest({**inputs, "load": 2.5}) != expected
    assert cell_digest({**inputs, "seed": 6}) != expected


def test_cell_keys_do_not_depend_on_axis_order_or_other_values():
    a = load_grid(sim_grid(policies=("vllm", "sarathi"), loads=(0.5, 2.0)))
    b_dict = sim_grid(policies=("orca", "sarathi", "vllm"), loads=(2.0, 4.0, 0.5))
    b_dict["axes"] = dict(reversed(list(b_dict["axes"].items())))
    b = load_grid(b_dict)
    keys_a = {c.digest for c in a.cells(FAKE_DIGESTS)}
    keys_b = {c.digest for c in b.cells(FAKE_DIGESTS)}
    assert keys_a < keys_b
    # a different trace content changes every key
    keys_c = {c.digest for c in a.cells({"conv": "1" * 64})}
    assert not keys_a & keys_c


def test_keys_hold_only_what_the_kind_reads():
    g = load_grid(stats_grid())
    for c in g.cells(FAKE_DIGESTS):
        assert "policy" not in c.inputs and "cluster" not in c.inputs
    sim = load_grid(sim_grid()).cells(FAKE_DIGESTS)[0].inputs
    assert sim["cluster"]["gpu"] == "a100-80gb" and sim["policy"] == "vllm"
    assert sim["slo_ttft_s"] == 1.0


def test_cluster_axis_values_reach_the_cells():
    g = load_grid(sim_grid(axes={"policy": ["vllm"], "replicas": [1, 2], "load": [1.0]}))
    assert [c.inputs["cluster"]["replicas"] for c in g.cells(FAKE_DIGESTS)] == [1, 1, 2, 2]


def test_replication_seeds_are_spawned_and_shared_across_points():
    seeds = replication_seeds(0, 3)
    assert seeds == [3757552657, 673228719, 3241444873]
    assert replication_seeds(0, 5)[:3] == seeds  # spawning more keeps the first ones
    assert len(set(replication_seeds(1, 50))) == 50
    cells = load_grid(sim_grid(replications=3)).cells(FAKE_DIGESTS)
    by_rep = {}
    for c in cells:
        by_rep.setdefault(c.inputs["rep"], set()).add(c.inputs["seed"])
    assert all(len(s) == 1 for s in by_rep.values())  # common random numbers
    assert len({next(iter(s)) for s in by_rep.values()}) == 3


def test_explicit_seed_axis_is_used_as_is():
    g = load_grid(sim_grid(replications=1, axes={"policy": ["vllm"], "seed": [4, 9]}))
    assert [c.inputs["seed"] for c in g.cells(FAKE_DIGESTS)] == [4, 9]


def test_expand_uses_trace_content_digest():
    g = load_grid(stats_grid())
    traces = load_traces(g)
    cells = expand(g, traces)
    assert all(c.inputs["trace"]["digest"] == traces["conv"].digest() for c in cells)
    assert np.all([len(c.digest) == 64 for c in cells])


def test_axis_the_kind_does_not_read_is_an_error():
    g = stats_grid()
    g["axes"]["replicas"] = [1, 2]
    with pytest.raises(GridError, match=r"axes.replicas: not read by stats cells"):
        Grid.from_dict(g)
    g = stats_grid()
    g["axes"]["kind"] = ["stats", "simulate"]
    g["axes"]["policy"] = ["vllm", "sarathi"]
    # policy is read by simulate cells only: stats cells appear once, not per policy
    cells = Grid.from_dict(g).cells(FAKE_DIGESTS)
    kinds = [c.inputs["kind"] for c in cells]
    assert kinds.count("stats") == 3 * 2 and kinds.count("simulate") == 3 * 2 * 2
    assert len({c.digest for c in cells}) == len(cells)
