"""JAX environments: the multi-user edge/server env (``envs.edge``) and its registry."""
from envs.registry import Env, make
