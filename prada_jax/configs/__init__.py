"""Launch configs (``ml_collections`` files): ``ppo.py``, ``dual.py``, ``distill.py``.

Kept in the package, as big_vision keeps its configs, so both the commands (``train/``) and the
evaluation library (``evals/``) may import them; on the command line they are files, e.g.
``--config=prada_jax/configs/ppo.py:smoke``.
"""
