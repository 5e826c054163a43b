"""The serving server's two links when they bind (issue 55 item 3): a case where the uplink and
the downlink each carry more demand than ``B_t·τ`` in some slots, against the NumPy reference
slot by slot, and the processor-sharing rule checked by hand on the env's own states.

No other serving test has a slot whose link demand exceeds ``B_t·τ``: the admission rule keeps
the uplink demand of new jobs within the free bandwidth, so a link binds only when ``B_t``
drops under jobs already admitted. Here a scenario drops the band to 10 % for 6 slots of every
20, with 256-bit tokens on a 300 kHz band, so both links bind (asserted: over 100 slots the
uplink binds in 6, the downlink in 14-15). A processor-sharing
factor inverted (demand / capacity) or an uplink that never shares fails both tests.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from envs import edge, scenarios
from prada_jax.traces.testing import random_traces
from tests.helpers.edge_pair import (assert_users_conserved, jax_rollout, random_actions,
                                     replay_on_numpy)

S, T, U = 1, 100, 12
TRACES = random_traces(seed=3, problems=10, depth=5, feature_dim=4)
PAIR = "a100_orin_int4"
_t = np.arange(20)
#: B_t = B for 14 slots, 0.1·B for the next 6, repeating: jobs admitted on the wide band
#: transfer on the narrow one.
SCENARIO = scenarios.static(20)._replace(
    bandwidth=np.where(_t < 14, 1.0, 0.1).astype(np.float32))
BASE = dict(num_users=U, tau_s=0.05, beta=0.2, lambda_s=0.0, mu=0.0, bandwidth_hz=3e5,
            arrival_rate_hz=6.0, initial_users=U, default_gain=0.05, max_wait_slots=20,
            rsd_threshold=0.7, reward_mode="coarse", downlink=True, num_servers=4,
            bits_per_token=256.0)


def _config(kv_cache: bool) -> dict:
    return dict(BASE, scenario=SCENARIO, server_kv_cache=kv_cache)


def _params(kv_cache: bool):
    return edge.make_params(TRACES, scheduler="offload_all", hardware=PAIR, **_config(kv_cache))


@pytest.mark.parametrize("kv_cache", [False, True], ids=["no_kv_cache", "kv_cache"])
def test_both_links_bind_and_match_the_numpy_reference(kv_cache):
    params = _params(kv_cache)
    assert params.serving
    screens, gains = random_actions(0, (S, T, U))
    out = jax_rollout(0, params, screens, gains)
    finished, _, ref_infos = replay_on_numpy(
        TRACES, dict(_config(kv_cache), scheduler="offload_all"), params, screens, gains, out,
        label=f"links kv_cache={kv_cache}", info_tol=(1e-3, 1e-4))   # float32 residues of
    # transfers shared over many slots: measured 2.1e-4 relative on bandwidth_in_use_hz
    _, _, _, _, (_, _, d, info) = out
    info = jax.tree.map(lambda v: np.asarray(v)[0], info)
    up, down = info["uplink_demand"], info["downlink_demand"]
    print(f"\nkv_cache={kv_cache}: uplink binds in {(up > 1).sum()} slots (max {up.max():.2f}), "
          f"downlink in {(down > 1).sum()} (max {down.max():.2f}); {finished} users finished")
    assert (up > 1.01).sum() >= 2, "the uplink never binds: the case tests nothing"
    assert (down > 1.01).sum() >= 2, "the downlink never binds: the case tests nothing"
    # the reference computes the same demands on its own
    assert sum(r["uplink_demand"] > 1.01 for r in ref_infos) == (up > 1.01).sum()
    assert finished >= 10
    assert_users_conserved(info, np.asarray(d)[0])


def _link_progress(before, after, params, slot_bw):
    """Hz·s each link delivered in one slot to the jobs that run on through it: Σ over users in
    SERVICE before and after (the same job: same ticket) of ``hz · (seconds left before −
    after)`` for uploads and downloads."""
    same = ((np.asarray(before.phase) == edge.SERVICE) & (np.asarray(after.phase) == edge.SERVICE)
            & (np.asarray(before.job.ticket) == np.asarray(after.job.ticket)))
    jb, ja = jax.tree.map(np.asarray, before.job), jax.tree.map(np.asarray, after.job)
    up = np.sum(np.where(same, jb.up_hz * (jb.up_s - ja.up_s), 0.0))
    down = np.sum(np.where(same, jb.down_hz * (jb.down_s - ja.down_s), 0.0))
    return up / (slot_bw * params.tau_s), down / (slot_bw * params.tau_s)


@pytest.mark.parametrize("kv_cache", [False, True], ids=["no_kv_cache", "kv_cache"])
def test_a_bound_link_delivers_exactly_its_capacity(kv_cache):
    """Processor sharing by hand on the env's states: in a slot whose demand exceeds
    ``B_t·τ``, the transfers in flight progress by exactly ``B_t·τ`` Hz·s in all (each at
    the share capacity / demand, none finishes); in a slot that does not bind, by the demand."""
    params = _params(kv_cache)
    step = jax.jit(edge.step_with_noise)
    # the randomness of the rollout above (envs.testing.rollout, env 0 of seed 0)
    key = jax.random.split(jax.random.key(0), S)[0]
    reset_key, key = jax.random.split(key)
    _, state = edge.reset(reset_key, params)
    noise_keys = jax.random.split(key, T)
    screens, gains = (a[0] for a in random_actions(0, (S, T, U)))
    seen = {"up": 0, "down": 0}
    for t in range(T):
        noise = edge.draw_noise(noise_keys[t], params)
        _, after, _, _, info = step(state, edge.EdgeAction(jnp.asarray(screens[t]),
                                                           jnp.asarray(gains[t])), params, noise)
        bw = float(info["bandwidth_t_hz"])
        got = _link_progress(state, after, params, bw)
        for name, demand, delivered in (("up", float(info["uplink_demand"]), got[0]),
                                        ("down", float(info["downlink_demand"]), got[1])):
            if demand > 1.01:
                seen[name] += 1
                np.testing.assert_allclose(delivered, 1.0, rtol=2e-3,
                                           err_msg=f"slot {t} {name}link (demand {demand:.3f})")
            else:
                assert delivered <= demand * (1 + 2e-3) + 1e-6, (t, name, delivered, demand)
        state = after
    assert seen["up"] >= 2 and seen["down"] >= 2, seen
