"""Device mesh, batch sharding and multi-host start-up: one code path from 1 CPU to a TPU slice.

Data parallelism only: arrays with a leading batch axis (environments, sequences) are split over
the mesh axis ``batch``; parameters and optimiser state are replicated. Under ``jax.jit`` the
compiler inserts the gradient all-reduce, so the learner code is the same on every device count
(no ``pmap``).

Config fields (``config.mesh``, all optional; see ``mesh_config()``):

* ``num_devices``: devices on the batch axis; 0 = all visible devices (default 0).
* ``distributed``: call ``jax.distributed.initialize`` before anything touches devices.
* ``coordinator_address``, ``num_processes``, ``process_id``: passed through; leave empty on
  clusters that JAX auto-detects (Cloud TPU, SLURM, Open MPI, Kubernetes).
"""
from __future__ import annotations

from typing import Any

import jax
import ml_collections
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

BATCH_AXIS = "batch"


def mesh_config():
    """Default ``config.mesh`` ConfigDict (single device, no multi-host)."""
    c = ml_collections.ConfigDict()
    c.num_devices = 0  # devices on the batch axis; 0 = all visible devices
    c.distributed = False  # call jax.distributed.initialize (several hosts / processes)
    c.coordinator_address = ""  # "host:port" of process 0; "" = cluster auto-detection
    c.num_processes = 0  # total processes; 0 = auto-detect
    c.process_id = -1  # this process's id; -1 = auto-detect
    return c


def validate_mesh_config(mesh_cfg, prefix: str = "config.mesh") -> None:
    if mesh_cfg.num_devices < 0:
        raise ValueError(f"{prefix}.num_devices must be >= 0 (0 = all devices), got "
                         f"{mesh_cfg.num_devices}")
    if mesh_cfg.distributed and mesh_cfg.coordinator_address and mesh_cfg.num_processes <= 0:
        raise ValueError(f"{prefix}.num_processes must be > 0 when "
                         f"{prefix}.coordinator_address is set")


_initialized = False


def maybe_initialize_distributed(mesh_cfg) -> None:
    """Starts multi-process JAX if ``mesh_cfg.distributed``; a no-op otherwise or when repeated."""
    global _initialized
    if not mesh_cfg.distributed or _initialized:
        return
    kwargs: dict[str, Any] = {}
    if mesh_cfg.coordinator_address:
        kwargs["coordinator_address"] = mesh_cfg.coordinator_address
    if mesh_cfg.num_processes > 0:
        kwargs["num_processes"] = mesh_cfg.num_processes
    if mesh_cfg.process_id >= 0:
        kwargs["process_id"] = mesh_cfg.process_id
    jax.distributed.initialize(**kwargs)
    _initialized = True


def make_mesh(num_devices: int = 0) -> Mesh:
    """A 1-D mesh over ``num_devices`` devices (0 = all, across all processes) on axis ``batch``."""
    devices = jax.devices()
    n = len(devices) if num_devices == 0 else num_devices
    if n > len(devices):
        raise ValueError(f"config.mesh.num_devices={n} but only {len(devices)} devices are visible")
    return jax.make_mesh((n,), (BATCH_AXIS,), axis_types=(AxisType.Auto,),
                         devices=devices[:n])


def batch_sharding(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P(BATCH_AXIS))


def replicated_sharding(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def check_divisible(batch: int, mesh: Mesh, field: str) -> None:
    n = mesh.shape[BATCH_AXIS]
    if batch % n:
        raise ValueError(f"{field}={batch} must be divisible by the number of devices on the "
                         f"batch axis ({n})")


def shard_batch(tree, mesh: Mesh):
    """Places every leaf of ``tree`` with its leading axis split over the ``batch`` axis."""
    return jax.device_put(tree, batch_sharding(mesh))


def replicate(tree, mesh: Mesh):
    """Places every leaf of ``tree`` whole on every device of ``mesh``."""
    return jax.device_put(tree, replicated_sharding(mesh))


def shard_axis(tree, mesh: Mesh, axis: int):
    """Places every leaf of ``tree`` with axis ``axis`` split over ``batch`` (e.g. axis 1 of a
    seed-stacked ``[S, E, ...]`` learner state); other axes are replicated."""
    spec = P(*([None] * axis + [BATCH_AXIS]))
    return jax.device_put(tree, NamedSharding(mesh, spec))


def place_state(state, mesh: Mesh, batch_fields: tuple[str, ...], axis: int = 0):
    """A ``flax.struct`` state with the fields ``batch_fields`` sharded on ``axis`` (the
    environment / sequence axis) and every other field (params, optimiser state, keys,
    counters) replicated. A 1-device mesh gives the same values on that one device."""
    rest = state.replace(**{f: None for f in batch_fields})
    placed = replicate(rest, mesh)
    return placed.replace(**{f: shard_axis(getattr(state, f), mesh, axis)
                             for f in batch_fields})


def is_process_zero() -> bool:
    """Only process 0 writes logs, checkpoints metadata and results."""
    return jax.process_index() == 0


def host_value(x) -> np.ndarray:
    """Fetches a (possibly sharded, possibly multi-host) array to the host as NumPy."""
    if jax.process_count() > 1:
        x = multihost_utils.process_allgather(x, tiled=True)
    return np.asarray(x)
