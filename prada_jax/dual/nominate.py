"""Builds the nomination functions (``policy_fn``) that stage-2 rollouts run in every user slot.

A ``policy_fn(key, obs [U, D], state, params) -> envs.edge.EdgeAction`` says which drafts are
nominated for server recompute and the gain the threshold rule ranks them by. The trained
policy goes through the one network → nomination helper, ``prada_jax.rl.screen``.
"""
from __future__ import annotations

import jax.numpy as jnp

from envs import edge
from prada_jax.rl.screen import check_nominate_by, screen_and_gain


def make_trace_rule_policy(threshold: float = 0.0):
    """A simple nomination rule for runs without a trained PPO policy (tests, smoke runs).

    It is *privileged*: it reads the trace's PRM scores of both candidates (which the real
    edge cannot see). ``gain = cand_prm[node, 1] − cand_prm[node, 0]`` (PRM units, no latency
    cost; the scheduler treats it as a ``coarse`` ΔQ) is carried to the server and the step is
    nominated iff ``gain > threshold``.
    """
    def policy_fn(key, obs, state, params):
        del key, obs
        cp = params.traces.cand_prm[state.node]
        gain = (cp[:, 1] - cp[:, 0]).astype(jnp.float32)
        return edge.EdgeAction(screen=(gain > threshold).astype(jnp.int32), gain=gain)

    return policy_fn


def make_ppo_policy(apply_fn, net_params, greedy: bool = True, nominate_by: str = "actor"):
    """The trained screening policy ``apply_fn(params, obs) -> (logits [U,2], q [U,2])``,
    nominating by its actor (argmax if ``greedy``, else a sample) or by its critic (ΔQ > 0),
    as ``prada_jax.rl.screen.screen_and_gain``; the nomination carries the critic's ΔQ. An
    unknown ``nominate_by`` raises ``BadInput`` naming ``config.policy.nominate_by``."""
    check_nominate_by(nominate_by)

    def policy_fn(key, obs, state, params):
        del state, params
        screen, gain = screen_and_gain(apply_fn, net_params, obs, key, greedy, nominate_by)
        return edge.EdgeAction(screen=screen, gain=gain)

    return policy_fn
