"""Joining or starting the Ray cluster a run's actors live on.

``distributed.address`` empty starts a local cluster inside this process (stopped when
the run ends); ``auto`` joins the one ``ray start --head`` runs on this machine; any
other value is the address of a running cluster's head. Ray is imported here only.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from agentr1.config import DistributedConfig

log = logging.getLogger(__name__)

INSTALL = "pip install 'agentr1[ray]' (or `make ray`)"
_started_here = False


def ray_module() -> Any:
    """``ray``, imported now.

    Raises:
        ModuleNotFoundError: Ray is not installed, with the command that installs it.
    """
    try:
        import ray
    except ModuleNotFoundError as e:
        raise ModuleNotFoundError(f"distributed: Ray is not installed here; {INSTALL}") from e
    return ray


def connect(d: DistributedConfig) -> Any:
    """Make sure this process is connected to the cluster ``d.address`` names (start a
    local one when it is empty); returns ``ray``. Idempotent: a connected process stays
    on its cluster."""
    global _started_here
    ray = ray_module()
    if ray.is_initialized():
        check_resources(ray, d)
        return ray
    # Actors import agentr1 and the driver's own modules (a task or tool in a file next
    # to the recipe, tests.*): give them this process's import path.
    path = os.pathsep.join(p for p in [os.getcwd(), *sys.path] if p)
    env = {"env_vars": {"PYTHONPATH": path, "TOKENIZERS_PARALLELISM": "false"}}
    kwargs: dict[str, Any] = {
        "runtime_env": env,
        "include_dashboard": False,
        "log_to_driver": True,
        "logging_level": logging.WARNING,
    }
    if d.address:
        ray.init(address=d.address, **kwargs)
        log.info("joined the Ray cluster at %s", d.address)
    else:
        if d.num_cpus:
            kwargs["num_cpus"] = d.num_cpus
        # Ray's own services listen on every interface (its choice, not ours); Ray >= 2.5x
        # requires its auth token on each connection (docs/distributed.md, security).
        ray.init(**kwargs)
        _started_here = True
        log.info("started a local Ray cluster (%s CPUs)", ray.cluster_resources().get("CPU"))
    check_resources(ray, d)
    return ray


def check_resources(ray: Any, d: DistributedConfig) -> None:
    """The actors the config asks for fit the cluster: a rollout worker or trainer rank
    that cannot be placed would wait for a CPU forever.

    Raises:
        ValueError: a local cluster too small (a joined one may grow: a warning)."""
    actors = d.rollout_workers + max(0, d.trainer_ranks - 1)
    need_cpu, need_gpu = actors * d.cpus_per_worker, actors * d.gpus_per_worker
    have = ray.cluster_resources()
    cpu, gpu = have.get("CPU", 0.0), have.get("GPU", 0.0)
    if need_cpu <= cpu + 1e-9 and need_gpu <= gpu + 1e-9:
        return
    msg = (
        f"distributed: {d.rollout_workers} rollout workers + {max(0, d.trainer_ranks - 1)} "
        f"trainer ranks beside this process reserve {need_cpu:g} CPUs and {need_gpu:g} GPUs "
        f"(cpus_per_worker={d.cpus_per_worker:g}, gpus_per_worker={d.gpus_per_worker:g}); "
        f"the cluster has {cpu:g} CPUs and {gpu:g} GPUs: lower cpus_per_worker (e.g. "
        f"{max(0.1, cpu / max(actors, 1)):.2g}), use fewer actors, or add machines"
    )
    if d.address:
        log.warning("%s (waiting for the cluster to grow)", msg)
        return
    raise ValueError(msg)


def disconnect() -> None:
    """Stop the local cluster this process started (a joined cluster keeps running)."""
    global _started_here
    if not _started_here:
        return
    import ray

    ray.shutdown()
    _started_here = False


def actor_options(d: DistributedConfig, name: str) -> dict[str, Any]:
    """Ray options of one rollout worker / trainer rank named ``name``."""
    return {
        "name": name,
        "num_cpus": d.cpus_per_worker,
        "num_gpus": d.gpus_per_worker,
        "max_restarts": 0,  # a dead worker is replaced by the driver, with the step's state
        "max_concurrency": 1,
    }


def threads(d: DistributedConfig) -> int:
    """torch threads of one actor."""
    if d.worker_threads:
        return d.worker_threads
    return max(1, int(-(-d.cpus_per_worker // 1)))


def ray_cause(e: BaseException) -> str:
    """What went wrong in an actor, in one line, without Ray's wrapping: the actor's own
    exception when Ray carries it, else the last line of Ray's message (its advice cut)."""
    cause = getattr(e, "cause", None)
    if isinstance(cause, BaseException):
        return f"{type(cause).__name__}: {cause}"
    text = str(e).strip().splitlines()
    last = text[-1].split(" Some common causes")[0] if text else ""
    return f"{type(e).__name__}: {last}"
