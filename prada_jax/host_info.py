"""The runtime line: the software and the machine a run computes on (what its low bits depend
on, docs/reproducibility.md)."""
from __future__ import annotations

import os
import platform
from pathlib import Path

__all__ = ["runtime_info", "host_cpu"]


def runtime_info() -> str:
    """One line: Python, JAX version, backend, devices, process index and the host CPU
    (:func:`host_cpu`: what XLA's CPU arithmetic depends on, docs/reproducibility.md)."""
    import jax   # lazy: a command's flag checks and --help need no JAX

    devices = jax.devices()
    return (f"python {platform.python_version()}, jax {jax.__version__}, backend "
            f"{jax.default_backend()}, {len(devices)} device(s) [{devices[0].device_kind}], "
            f"process {jax.process_index()}/{jax.process_count()}; host {host_cpu()}")


_ISA_FLAGS = ("avx512f", "avx2", "fma")   # the ones that change XLA's CPU bits


def host_cpu(cpuinfo: str | None = None, usable_cores: int | None = None,
             xla_flags: str | None = None) -> str:
    """The CPU facts that decide the low bits of a CPU run: model, usable cores, which of
    AVX-512F / AVX2 / FMA it has, and ``XLA_FLAGS`` if set. Two runs that print the same
    line and the same packages give the same bits (tested on one machine); runs that print
    different ones need not (docs/reproducibility.md). The arguments replace what is read
    from ``/proc/cpuinfo``, the process's CPU affinity and the environment (tests)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
        except OSError:   # not Linux: no flag list
            cpuinfo = ""
    fields = {}
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    model = fields.get("model name") or platform.processor() or platform.machine() or "?"
    if usable_cores is None:
        usable_cores = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                        else os.cpu_count() or 0)
    if "flags" in fields:
        present = set(fields["flags"].split())
        isa = "/".join(f for f in _ISA_FLAGS if f in present) or "no avx2/fma"
    else:
        isa = "isa unknown"
    if xla_flags is None:
        xla_flags = os.environ.get("XLA_FLAGS", "")
    out = f"{model}, {usable_cores} usable core(s), {isa}"
    return out + (f", XLA_FLAGS={xla_flags.strip()}" if xla_flags.strip() else "")
