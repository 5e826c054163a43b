"""Shared stage-2 env rollouts for tests/prada_jax/sched and tests/prada_jax/dual: one trace
set, one env shape and one compiled rollout (and one compiled batched threshold rule), so the
tests that check the env against the rule compile them once per session, not once per file."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from envs import edge, registry, stage2
from prada_jax.sched.threshold import threshold_decide
from prada_jax.dual import rollout
from prada_jax.traces.testing import random_traces

#: Rollout shape shared by the stage-2 env tests: E envs, T slots, U user slots.
STAGE2_ENVS, STAGE2_SLOTS, STAGE2_USERS = 2, 40, 6


class Stage2Env:
    """``traces`` (structure-only random traces, not calibrated, not benchmark data),
    ``params(**overrides)`` (edge EnvParams, threshold rule, U = STAGE2_USERS user slots),
    ``rollout(carry, params)`` (jitted ``rollout.make_rollout`` of the trace rule nominating at
    gain > −0.05, STAGE2_SLOTS slots) and ``decide(x, free_units, free_bw, sp)`` (the threshold
    rule vmapped over a leading slot axis of every argument, jitted)."""

    num_envs, num_slots, num_users = STAGE2_ENVS, STAGE2_SLOTS, STAGE2_USERS

    def __init__(self):
        self.traces = random_traces(seed=0, problems=12, depth=4, feature_dim=4)
        self.rollout = rollout.cached(
            ("tests.prada_jax.conftest", "trace_rule", -0.05, STAGE2_SLOTS),
            lambda: jax.jit(rollout.make_rollout(stage2.EDGE, stage2.make_trace_rule_policy(-0.05),
                                                 STAGE2_SLOTS)))
        self.decide = jax.jit(jax.vmap(threshold_decide))

    def params(self, **kw):
        base = dict(traces=self.traces, num_users=STAGE2_USERS, num_servers=1,
                    bandwidth_hz=20e6, arrival_rate_hz=40.0, beta=0.05)
        base.update(kw)
        return registry.make("edge", **base)[1]

    def rule_on_slots(self, out, params):
        """The threshold rule on every slot of a rollout ``out`` ([T, E, ...]), with the
        prices each slot ran with and the units and bandwidth free in it. Returns NumPy
        (x: SchedInputs [T·E, U], rule decisions, env decisions, candidate, outage [T·E, U])."""
        flat = lambda a: jnp.reshape(a, (-1,) + jnp.shape(a)[2:])  # noqa: E731
        lam = out["lambda_s"]
        sp = edge.sched_params(params).replace(lambda_s=lam, mu=out["mu"])
        sp = jax.tree.map(lambda a: flat(jnp.broadcast_to(a, lam.shape)), sp)
        x = jax.tree.map(flat, out["x"])
        b = out["batch"]
        d = self.decide(x, flat(b.free_units).astype(jnp.int32), flat(b.free_bw), sp)
        x = jax.tree.map(np.asarray, x)
        return (x, np.asarray(d), np.asarray(flat(out["decision"])), x.candidate,
                np.asarray(flat(out["outage"])))


@pytest.fixture(scope="session")
def stage2_env():
    return Stage2Env()
