"""Connecting to Ray: a local runtime by default, an existing cluster with ``address``.

The same code runs either way (the actors in :mod:`rl.rollout.inference` and
:mod:`rl.rollout.worker` ask Ray for CPUs, never for a machine). No scheduler
or process pool of our own. Not guaranteed: that the cluster's nodes have
bubblewrap, the checkpoint path and the task sources — a worker on a node
without them fails its rollouts as infrastructure errors.
"""

from __future__ import annotations

from typing import Any


def init_ray(address: str | None = None, *, num_cpus: int | None = None,
             object_store_memory: int | None = None) -> Any:
    """``ray.init()`` locally (``num_cpus``, no dashboard), or join ``address`` (e.g. ``ray://host:10001``,
    ``auto``); returns the ``ray`` module. Idempotent when Ray is already initialised."""
    import ray

    if ray.is_initialized():
        return ray
    if address:
        ray.init(address=address)
    else:
        ray.init(num_cpus=num_cpus, include_dashboard=False, object_store_memory=object_store_memory)
    return ray
