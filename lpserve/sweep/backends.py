"""Execution backends of a sweep: ``serial``, ``local`` (process pool), ``dask``, ``ray``.

Each backend takes batches of cells (an iterable, consumed lazily: at most
:data:`IN_FLIGHT_PER_WORKER` batches per worker are submitted ahead, so a driver can claim
each batch just before it is handed out) and the heavy-input :class:`Payload`, ships the
payload once per worker, and yields the rows of each batch as it completes (in completion
order). Cells are pure functions of their inputs, so the rows do not depend on which
backend ran them. Dask and Ray are imported only here, inside the functions.
"""
from __future__ import annotations

import logging
import os
from typing import Any, Iterable, Iterator

from lpserve.sweep.grid import Cell
from lpserve.sweep.worker import Payload, init_worker, install, run_batch, run_batch_boxed

BACKENDS = ("serial", "local", "dask", "ray")
#: object store of a Ray instance started by a sweep (bytes; Ray's minimum is 75 MiB)
RAY_OBJECT_STORE_BYTES = 256 * 1024 * 1024
#: batches submitted ahead per worker
IN_FLIGHT_PER_WORKER = 2

Rows = list[dict[str, Any]]


def default_workers() -> int:
    """CPUs this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def run_batches(backend: str, batches: Iterable[list[Cell]], payload: Payload, *,
                workers: int, address: str | None = None, client: Any = None
                ) -> Iterator[Rows]:
    """Yield the rows of every batch as it completes, on ``backend``.

    Args:
        backend: one of :data:`BACKENDS`.
        batches: the cells, grouped; each batch is one task (read lazily).
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


def _serial(batches: Iterable[list[Cell]], payload: Payload) -> Iterator[Rows]:
    install(payload)
    for b in batches:
        yield run_batch(b)


def _windowed(batches: Iterable[list[Cell]], submit: Any, wait_one: Any, limit: int
              ) -> Iterator[Rows]:
    """Keep at most ``limit`` submitted batches: ``submit(batch) -> handle``,
    ``wait_one(handles) -> (handle, rows)`` of one that completed."""
    it = iter(batches)
    pending: list[Any] = []
    for b in it:
        pending.append(submit(b))
        if len(pending) >= limit:
            break
    while pending:
        h, rows = wait_one(pending)
        pending.remove(h)
        for b in it:
            pending.append(submit(b))
            break
        yield rows


def _local(batches: Iterable[list[Cell]], payload: Payload, workers: int) -> Iterator[Rows]:
    import multiprocessing as mp
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    it = iter(batches)
    first = next(it, None)
    if first is None:
        return
    # spawn: workers start clean (no inherited threads or locks from the caller)
    ex = ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"),
                             initializer=init_worker, initargs=(payload,))

    def wait_one(pending: list[Any]) -> tuple[Any, Rows]:
        done, _ = wait(pending, return_when=FIRST_COMPLETED)
        f = next(iter(done))
        return f, f.result()

    try:
        yield from _windowed(_chain(first, it), lambda b: ex.submit(run_batch, b), wait_one,
                             IN_FLIGHT_PER_WORKER * workers)
    finally:
        ex.shutdown(wait=True, cancel_futures=True)


def _chain(first: list[Cell], rest: Iterator[list[Cell]]) -> Iterator[list[Cell]]:
    yield first
    yield from rest


def _dask(batches: Iterable[list[Cell]], payload: Payload, workers: int, address: str | None,
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
        n = max(1, len(client.scheduler_info().get("workers", {})) or workers)

        def submit(b: list[Cell]) -> Any:
            f = client.submit(run_batch, b, remote, pure=False)
            futures.append(f)
            return f

        def wait_one(pending: list[Any]) -> tuple[Any, Rows]:
            f = next(iter(as_completed(pending)))
            return f, f.result()

        yield from _windowed(batches, submit, wait_one, IN_FLIGHT_PER_WORKER * n)
    finally:
        if futures:
            client.cancel(futures)
        for obj in owned:
            obj.close()


def _ray(batches: Iterable[list[Cell]], payload: Payload, workers: int,
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
        n = max(1, int(ray.cluster_resources().get("CPU", workers)))

        def submit(b: list[Cell]) -> Any:
            # the reference travels boxed in a list so that Ray does not resolve it per task
            r = task.remote(b, payload.key, [ref])
            pending[r] = 1
            return r

        def wait_one(handles: list[Any]) -> tuple[Any, Rows]:
            done, _ = ray.wait(list(handles), num_returns=1)
            pending.pop(done[0], None)
            return done[0], ray.get(done[0])

        yield from _windowed(batches, submit, wait_one, IN_FLIGHT_PER_WORKER * n)
    finally:
        for r in pending:
            ray.cancel(r, force=True)
        if started:
            ray.shutdown()
