"""JAX environments: the multi-user edge/server env (``envs.edge``), its registry, and the
adapter that runs single-agent gymnax-style envs as one-user envs (``envs.single_agent``)."""
from envs.registry import Env, make
