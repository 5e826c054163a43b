"""The one list of benchmark presets (no imports: config files and flag definitions use it).

``BENCHMARKS`` names the three synthetic trace presets of ``prada_jax.traces.synthetic``
(calibrated to the published Qwen2.5-Math 1.5B/7B accuracies on these benchmarks), in the order
tables and the main job use. ``prada_jax.traces.synthetic.PRESETS`` holds their parameters and
is checked against this tuple at import.
"""
BENCHMARKS = ("gsm8k", "gaokao2023en", "mmlu_stem")

__all__ = ["BENCHMARKS"]
