"""The serving server (``envs.serving``, ``server_model="serving"``): against the NumPy
reference written job by job, against closed forms (capacity at batch b, Little's law, the
chunked-prefill budget), and guards that fail if a serving rule is dropped (the sequence held
through the download, the PRM free on the server, the batch size ignored, prefills in parallel
for free, U binding unreported)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from envs import edge, serving
from envs.edge_numpy import EdgeEnvNumPy, consts_from_jax
from envs.testing import rollout
from prada_jax import latency as lat
from prada_jax.traces.testing import random_traces

S, T, U = 1, 200, 12
TRACES = random_traces(seed=3, problems=10, depth=5, feature_dim=4)
PAIR = "a100_orin_int4"
BASE = dict(num_users=U, tau_s=0.05, beta=0.2, lambda_s=0.0, mu=0.0, bandwidth_hz=20e6,
            arrival_rate_hz=6.0, initial_users=U, default_gain=0.05, max_wait_slots=20,
            rsd_threshold=0.7, reward_mode="coarse", server_kv_cache=False, downlink=True,
            ctx_scale=1e-3)
# A100 at bf16 serving Qwen2.5-7B, written out from the datasheet and the model shape (not read
# from prada_jax.latency): lm_head included in the per-token products (7.075e9 parameters).
PK = 312e12 * 0.5
BWM = 2.039e12 * 0.8
P_TOK = 6.53e9 + 152064 * 3584
W_7B = P_TOK * 2.0
KV_7B = 2 * 28 * 4 * 128 * 2.0


def _run_pair(sched, cfg, seed=0, slots=T):
    kw = dict(BASE, **cfg)
    params = edge.make_params(TRACES, scheduler=sched, hardware=PAIR, **kw)
    rng = np.random.default_rng(seed)
    screens = rng.integers(0, 2, (S, slots, U)).astype(np.int32)
    if kw.get("llm_only"):      # the LLM alone nominates every step (as evals run it)
        screens = np.ones_like(screens)
    gains = rng.normal(0.05, 0.1, (S, slots, U)).astype(np.float32)
    keys = jax.random.split(jax.random.key(seed), S)
    obs0, noise0, noises, _, (obs, r, d, info) = jax.device_get(
        rollout(keys, params, screens, gains))
    at = lambda tree, *i: jax.tree.map(lambda v: np.asarray(v)[i], tree)  # noqa: E731
    ref = EdgeEnvNumPy(TRACES, dict(kw, scheduler=sched), consts_from_jax(params.latency))
    ref.reset(vars(at(noise0, 0)))
    finished = 0
    for t in range(slots):
        _, r_r, d_r, info_r = ref.step(screens[0, t], gains[0, t], vars(at(noises, 0, t)))
        msg = f"{sched} slot {t}"
        np.testing.assert_array_equal(info["decision"][0, t], info_r["decision"], msg)
        np.testing.assert_array_equal(d[0, t], d_r, msg)
        np.testing.assert_allclose(r[0, t], r_r, rtol=1e-4, atol=1e-6, err_msg=msg)
        for k, v in info_r.items():
            np.testing.assert_allclose(info[k][0, t], v, rtol=2e-4, atol=1e-4,
                                       err_msg=f"{msg} info[{k}]")
        finished += int(d_r.sum())
    return finished, jax.tree.map(lambda v: np.asarray(v)[0], info), np.asarray(d)[0]


CASES = {
    "threshold": ("threshold", dict(num_servers=3, arrival_rate_hz=8.0, reward_mode="true")),
    "offload_all": ("offload_all", dict(num_servers=2, bandwidth_hz=3e6, max_wait_slots=5,
                                        server_kv_cache=True, max_batched_tokens=64)),
    "rsd": ("rsd", dict(num_servers=4)),
    "rsd_prefix_cache": ("rsd", dict(num_servers=4, prm_prefix_cache=True,
                                     max_batched_tokens=40)),
    "llm_alone": ("offload_all", dict(num_servers=3, llm_only=True, server_kv_cache=True,
                                      max_wait_slots=10 ** 6, max_batched_tokens=16)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_jax_serving_matches_numpy_reference(case):
    sched, cfg = CASES[case]
    finished, info, d = _run_pair(sched, cfg)
    assert finished >= 8
    m = cfg["num_servers"]
    assert info["server_in_use"].max() <= m
    np.testing.assert_array_equal(info["arrived"],
                                  info["finished"] + info["in_flight"] + info["blocked_total"])
    split = (info["user_processing_s"] + info["user_communication_s"]
             + info["user_queueing_s"])[d]
    np.testing.assert_allclose(split, info["user_latency_s"][d], rtol=1e-5, atol=1e-5)
