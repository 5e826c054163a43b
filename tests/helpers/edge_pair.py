"""The edge env against its NumPy reference (``envs.edge_numpy.EdgeEnvNumPy``), slot by slot:
random screening actions, the JAX rollout (``envs.testing.rollout``) and the reference replayed
on the same noise, every slot's decisions, completions, rewards and info compared."""
import jax
import numpy as np

from envs.edge_numpy import EdgeEnvNumPy, consts_from_jax
from envs.testing import rollout


def random_actions(seed: int, shape):
    """Screens in {0, 1} and gains ~ N(0.05, 0.1) of ``shape`` [S, T, U] from ``seed``."""
    rng = np.random.default_rng(seed)
    return (rng.integers(0, 2, shape).astype(np.int32),
            rng.normal(0.05, 0.1, shape).astype(np.float32))


def jax_rollout(seed: int, params, screens, gains):
    """``rollout`` of ``screens.shape[0]`` envs keyed from ``seed``, on the host:
    (obs0, noise0, noises, final, (obs, reward, done, info))."""
    keys = jax.random.split(jax.random.key(seed), screens.shape[0])
    return jax.device_get(rollout(keys, params, screens, gains))


def _at(tree, *idx):
    return jax.tree.map(lambda v: np.asarray(v)[idx], tree)


def replay_on_numpy(traces, env_config: dict, params, screens, gains, out, *, env: int = 0,
                    label: str = "", info_tol=(1e-4, 1e-5), check_obs: bool = False):
    """Replays env ``env`` of the JAX rollout ``out`` on a fresh ``EdgeEnvNumPy(traces,
    env_config)`` with the rollout's noise and asserts every slot equal (decisions and
    completions exactly, rewards to 1e-4, info to ``info_tol`` (rtol, atol), observations
    to 1e-5 with ``check_obs``). Returns (users finished, the reference env, its info per
    slot)."""
    obs0, noise0, noises, _, (obs, r, d, info) = out
    ref = EdgeEnvNumPy(traces, env_config, consts_from_jax(params.latency))
    first = ref.reset(vars(_at(noise0, env)))
    if check_obs:
        np.testing.assert_allclose(obs0[env], first, rtol=1e-5, atol=1e-6)
    finished, infos = 0, []
    for t in range(screens.shape[1]):
        obs_r, r_r, d_r, info_r = ref.step(screens[env, t], gains[env, t],
                                           vars(_at(noises, env, t)))
        msg = f"{label} slot {t}"
        np.testing.assert_array_equal(info["decision"][env, t], info_r["decision"], msg)
        np.testing.assert_array_equal(d[env, t], d_r, msg)
        np.testing.assert_allclose(r[env, t], r_r, rtol=1e-4, atol=1e-6, err_msg=msg)
        if check_obs:
            np.testing.assert_allclose(obs[env, t], obs_r, rtol=1e-5, atol=1e-6, err_msg=msg)
        for k, v in info_r.items():
            np.testing.assert_allclose(info[k][env, t], v, rtol=info_tol[0], atol=info_tol[1],
                                       err_msg=f"{msg} info[{k}]")
        finished += int(d_r.sum())
        infos.append(info_r)
    return finished, ref, infos


def assert_users_conserved(info, done):
    """No user is lost (arrived = finished + in flight + blocked, every slot) and each
    finished user's latency is the sum of its processing, communication and queueing parts."""
    np.testing.assert_array_equal(info["arrived"],
                                  info["finished"] + info["in_flight"] + info["blocked_total"])
    split = (info["user_processing_s"] + info["user_communication_s"]
             + info["user_queueing_s"])[done]
    np.testing.assert_allclose(split, info["user_latency_s"][done], rtol=1e-5, atol=1e-5)
