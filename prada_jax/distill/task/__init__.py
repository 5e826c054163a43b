"""Built-in multi-turn tool task for ReOPD: multi-step arithmetic with a calculator tool.

``arith`` (problems, tokenizer, tool, episode runner) is pure Python/NumPy; ``teacher`` (train a
PyTorch teacher and record its trajectories) needs the ``[torch]`` extra and is not imported here.
"""
