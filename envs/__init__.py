"""JAX environments: the multi-user edge/server env (``envs.edge``), its registry, and what
the launchers build from a config for the library's trainers: the stage-1 env
(``envs.stage1``) and the stage-2 env with its nomination functions (``envs.stage2``).
Single-agent gymnax-style envs run as one-user envs through the trainer's adapter
(``prada_jax.rl.single_agent``)."""
from envs.registry import Env, make
