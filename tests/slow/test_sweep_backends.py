"""The same grid gives the same rows on serial, local pool, Dask and Ray backends."""
from __future__ import annotations

import logging

import pytest

from lpserve.sweep import load_grid, run_sweep
from lpserve.sweep import worker as W
from lpserve.sweep.runner import expand, load_traces
from tests.unit.sweep._grids import comparable, sim_grid

pytestmark = pytest.mark.slow

GRID = sim_grid(head=40, policies=("vllm", "sarathi"), loads=(0.5, 2.0), replications=2,
                name="backends")


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The grid run in this process: what every backend must reproduce."""
    W.clear_cache()
    rep = run_sweep(GRID, tmp_path_factory.mktemp("serial"), backend="serial")
    assert rep.n_failed == 0 and rep.n_run == 8
    return rep.table


@pytest.fixture(scope="module")
def dask_cluster():
    pytest.importorskip("distributed", reason="dask.distributed is not installed "
                        "(pip install 'lpserve[dask]')")
    from distributed import Client, LocalCluster

    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                           dashboard_address=":0", silence_logs=logging.WARNING)
    client = Client(cluster)
    yield cluster, client
    client.close()
    cluster.close()


@pytest.fixture(scope="module")
def ray_session():
    """One local Ray instance for the whole module (start-up takes seconds)."""
    ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'lpserve[ray]')")
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=128 * 1024 * 1024,
             log_to_driver=False, logging_level=logging.WARNING)
    yield ray
    ray.shutdown()


def _same(table, reference):
    assert dict(zip(table["cell"], table["result_digest"])) == \
        dict(zip(reference["cell"], reference["result_digest"]))
    assert comparable(table).equals(comparable(reference))


def test_local_pool(reference, tmp_path):
    rep = run_sweep(GRID, tmp_path, backend="local", workers=2, batch_size=1)
    assert rep.n_run == 8
    _same(rep.table, reference)


def test_dask_client_ships_payload_once_per_worker(reference, dask_cluster, tmp_path):
    _cluster, client = dask_cluster
    rep = run_sweep(GRID, tmp_path, backend="dask", client=client, batch_size=1)
    assert rep.n_run == 8
    _same(rep.table, reference)
    g = load_grid(GRID)
    traces = load_traces(g)
    from lpserve.sweep.runner import build_payload

    key = build_payload(expand(g, traces), traces).key
    installed = client.run(W.installed, key)
    assert len(installed) == 2 and all(installed.values())


def test_dask_by_scheduler_address(reference, dask_cluster, tmp_path):
    cluster, _client = dask_cluster
    rep = run_sweep(GRID, tmp_path, backend="dask", address=cluster.scheduler_address)
    _same(rep.table, reference)


def test_dask_own_local_cluster(reference, tmp_path):
    pytest.importorskip("distributed", reason="dask.distributed is not installed")
    rep = run_sweep(GRID, tmp_path, backend="dask", workers=2)
    _same(rep.table, reference)


def test_ray_local(reference, ray_session, tmp_path):
    rep = run_sweep(GRID, tmp_path, backend="ray", workers=2, batch_size=1)
    assert rep.n_run == 8
    _same(rep.table, reference)
    assert ray_session.is_initialized()  # a session the caller started is left running


def test_resume_across_backends(reference, ray_session, tmp_path):
    """Half the grid on Ray, the rest on the local pool: same rows as one serial run."""
    half = sim_grid(head=40, policies=("vllm",), loads=(0.5, 2.0), replications=2,
                    name="backends")
    first = run_sweep(half, tmp_path, backend="ray", workers=2)
    rest = run_sweep(GRID, tmp_path, backend="local", workers=2)
    assert (first.n_run, rest.n_run, rest.n_skipped) == (4, 4, 4)
    _same(rest.table, reference)
