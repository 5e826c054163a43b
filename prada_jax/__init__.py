"""prada_jax: PRADA edge/server screening + scheduling, and ReOPD distillation, in JAX.

Importing the package never imports torch: torch lives only in exporter/builder modules behind
the ``[torch]`` extra.
"""
__version__ = "0.1.0"
