"""Execution backends of a sweep: ``serial``, ``local`` (process pool), ``dask``, ``ray``.

Each backend takes batches of cells and the heavy-input :class:`Payload`, ships the
payload once per worker, and yields the rows of each batch as it completes (in completion
order). Cells are pure functions of their inputs, so the rows do not depend on which
backend ran them. Dask and Ray are imported only here, inside the functions.
"""
from __future__ import annotations

import logging
import os
from typing import Any, Iterator

from lpserve.sweep.grid import Cell
from lpserve.sweep.worker import Payload, init_worker, install, run_batch, run_batch_boxed

BACKENDS = ("serial", "local", "dask", "ray")
#: object store of a Ray instance started by a sweep (bytes; Ray's minimum is 75 MiB)
RAY_OBJECT_STORE_BYTES = 256 * 1024 * 1024

Rows = list[dict[str, Any]]


def default_workers() -> int:
    """CPUs this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def run_batches(backend: str, batches: list[list[Cell]], payload: Payload, *,
                workers: int, address: str | None = None, client: Any = None
                ) -> Iterator[Rows]:
    """Yield the rows of every batch as it completes, on ``backend``.

    Args:
        backend: one of :data:`BACKENDS`.
        batches: the cells, grouped; each batch is one task.
        payload: traces and cost models, shipped once per worker.
        workers: processes to start (ignored with ``address`` or ``client``).
        address: Dask scheduler or Ray cluster address (default: start a local one).
        client: an existing ``distributed.Client`` to use (Dask only; left open).
    """
    if backend not in BACKENDS:
        raise ValueError(f"sweep backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if not isinstance(workers, int) or workers < 1:
        raise ValueError(f"sweep workers must be an integer >= 1, got {workers!r}")
    if backend == "serial":
        return _serial(batches, payload)
    if backend == "local":
        return _local(batches, payload, workers)
    if backend == "dask":
        return _dask(batches, payload, workers, address, client)
    return _ray(batches, payload, workers, address)


def _serial(batches: list[list[Cell]], payload: Payload) -> Iterator[Rows]:
    install(payload)
    for b in batches:
        yield run_batch(b)


def _local(batches: list[list[Cell]], payload: Payload, workers: int) -> Iterator[Rows]:
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor, as_completed

    # spawn: workers start clean (no inherited threads or locks from the caller)
    ex = ProcessPoolExecutor(max_workers=min(workers, max(1, len(batches))),
                             mp_context=mp.get_context("spawn"), initializer=init_worker,
                             initargs=(payload,))
    try:
        futures = [ex.submit(run_batch, b) for b in batches]
        for fut in as_completed(futures):
            yield fut.result()
    finally:
        ex.shutdown(wait=True, cancel_futures=True)


def _dask(batches: list[list[Cell]], payload: Payload, workers: int, address: str | None,
          client: Any) -> Iterator[Rows]:
    try:
        from distributed import Client, LocalCluster, as_completed
    except ImportError as exc:
        raise RuntimeError("the dask backend needs dask.distributed "
                           "(pip install 'lpserve[dask]')") from exc
    owned: list[Any] = []
    if client is None:
        if address:
            client = Client(address)
        else:
            cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                                   dashboard_address=":0", silence_logs=logging.WARNING)
            owned.append(cluster)
            client = Client(cluster)
        owned.insert(0, client)
    futures: list[Any] = []
    try:
        # one copy of the payload on every worker; tasks receive the worker-local object
        remote = client.scatter(payload, broadcast=True, hash=False)
        futures = [client.submit(run_batch, b, remote, pure=False) for b in batches]
        for _fut, rows in as_completed(futures, with_results=True):
            yield rows
    finally:
        if futures:
            client.cancel(futures)
        for obj in owned:
            obj.close()


def _ray(batches: list[list[Cell]], payload: Payload, workers: int,
         address: str | None) -> Iterator[Rows]:
    try:
        import ray
    except ImportError as exc:
        raise RuntimeError("the ray backend needs ray (pip install 'lpserve[ray]')") from exc
    started = False
    if not ray.is_initialized():
        kw: dict[str, Any] = dict(include_dashboard=False, log_to_driver=False,
                                  logging_level=logging.WARNING)
        if address:
            ray.init(address=address, **kw)
        else:
            ray.init(num_cpus=workers, object_store_memory=RAY_OBJECT_STORE_BYTES, **kw)
        started = True
    pending: dict[Any, int] = {}
    try:
        ref = ray.put(payload)  # one copy in the object store, fetched once per worker
        task = ray.remote(num_cpus=1, max_retries=0)(run_batch_boxed)
        # the reference travels boxed in a list so that Ray does not resolve it per task
        pending = {task.remote(b, payload.key, [ref]): i for i, b in enumerate(batches)}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for d in done:
                pending.pop(d)
                yield ray.get(d)
    finally:
        for r in pending:
            ray.cancel(r, force=True)
        if started:
            ray.shutdown()
