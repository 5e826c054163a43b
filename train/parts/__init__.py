"""The parts of ``train.main``'s pipeline (``make demo``), each a function that fills its own
folder of the run directory and reuses a finished one whose settings are the same
(``cache``):

* ``training``: the trace summary, the screening policy (PPO), its critic refit and the learned
  multipliers (dual), and the env check every part's config must pass first;
* ``tables``: the load curve and its two table points, the benchmark table at those points, the
  M / B / λ sweep, capacity per server GPU under the SLO and the PRM calibration.

The sizes come from ``prada_jax/configs/main.py`` (a ConfigDict, ``config`` below); the configs
of the trained runs are built by ``train.pipeline``. Every number is from synthetic traces.
"""
