"""Flax NNX causal LM of the Qwen2/Llama family: config, model, HF weight loading, sampling.

Modules: ``config`` (LMConfig), ``model`` (CausalLM, KVCache), ``hf`` (load_hf / save_hf with an
explicit key map), ``sampling`` (generate), ``safetensors_io`` (validated safetensors I/O), ``convert`` (a GGUF
file → an HF folder; the command ``python -m prada_jax.lm.convert``, the ``[real]`` extra).
"""
