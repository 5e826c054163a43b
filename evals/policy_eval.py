"""Monte-Carlo policy evaluation of a frozen screening policy: an independent reference for the
critic's ΔQ, and the targets of a critic refit for the final actor.

The stage-2 scheduler values a nomination by the critic's ΔQ = Q(s, 1) − Q(s, 0) (docs/design.md §5,
§6). PPO trains that Q head on a moving policy with GAE targets, so ΔQ may be biased for the
*final* actor. This module measures it against a reference that shares no code with the critic:

* ``sample_decision_states``: run the policy (greedy by default) in an env (normally the one it
  was trained on, ``envs.stage1.build_env``) and keep the states of users at a decision point, each
  cut down to a one-user env state (``user_slice``).
* ``mc_action_values``: for each such state, branch the env: force the user's action to keep
  (0) or nominate (1), then follow the policy until that user's solution ends; the user's
  discounted return (per *decision*, γ of the training config, under the env's reward, i.e.
  the training reward) is averaged over R replicates. Both branches of a replicate use the same
  random streams (common random numbers: the same env noise and policy-sampling keys per slot),
  so their difference has low variance. ΔQ_MC = mean(G | 1) − mean(G | 0), with its standard
  error over replicates.
* ``compare``: sign agreement, correlation, bias of the critic's ΔQ against ΔQ_MC, and which of
  actor and critic agrees with the MC sign where the actor nominates.
* ``fit_targets``: the MC action values as regression targets for *both* actions, which
  ``prada_jax.rl.critic_fit.refit_critic`` fits the critic to (``train.critic``).

One-user branching is exact for an env whose users do not interact: the per-user screening MDP
of ``envs.stage1.build_env`` with ``contention=False`` (``offload_all``, unlimited M and B, no
outage). In that env a user's trajectory under the greedy actor is deterministic given its
state (no randomness reaches a single user's coarse return), so R = 1 is exact for the greedy
actor; R > 1 matters for the sampling policy the critic was trained on (``greedy=False``).
In a contended env the other users would have to be branched too; this module does not do
that, and ``train.critic`` refuses a policy trained with contention.

Units: returns and ΔQ in reward units (PRM units under the coarse reward); shapes in each
docstring (N states, R replicates).
"""
from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from envs import edge, population
from envs.edge import EdgeAction
from prada_jax.rl import networks

__all__ = ["DecisionStates", "sample_decision_states", "user_slice", "mc_action_values",
           "MCResult", "compare", "fit_targets"]


class DecisionStates(NamedTuple):
    """N one-user env states at a decision point.

    state: ``EnvState`` with per-user leaves [N, 1] and scalar leaves [N].
    obs: [N, D] the user's observation.
    """

    state: Any
    obs: np.ndarray


class MCResult(NamedTuple):
    """Monte-Carlo action values of N states.

    q: [N, 2] mean discounted return after forcing action a ∈ {0 keep, 1 nominate}.
    dq: [N] ΔQ_MC = q[:, 1] − q[:, 0] (the mean of the paired per-replicate differences).
    dq_se: [N] standard error of ``dq`` over R replicates (0 when R = 1).
    unfinished: int, (state, branch, replicate) rollouts cut at the horizon (their return is
      the partial sum; should be 0).
    """

    q: np.ndarray
    dq: np.ndarray
    dq_se: np.ndarray
    unfinished: int


def user_slice(state, u):
    """The one-user env state of user slot ``u`` (int or [N] ints over a leading batch axis).

    Per-user leaves ``[..., U]`` become ``[..., 1]``; scalar counters (``t``, ``arrived``, ...)
    are kept. Pair it with ``params.replace(num_users=1)``.
    """
    u = jnp.asarray(u, jnp.int32)

    def take(x):
        x = jnp.asarray(x)
        if x.ndim == u.ndim:          # scalar counter (per batch entry)
            return x
        return jnp.take_along_axis(x, u.reshape(u.shape + (1,)), axis=-1)
    return jax.tree.map(take, state)


def _policy_action(apply_fn, net_params, obs, key, greedy: bool):
    """Screen [U] and ΔQ gain [U] of the network at ``obs`` [U, D]."""
    logits, q = apply_fn(net_params, obs)
    if greedy:
        screen = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    else:
        screen = jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)
    return screen, networks.gain_from_critic(q).astype(jnp.float32)


def sample_decision_states(env, env_params, apply_fn, net_params, key, *, num_states: int,
                           num_envs: int = 16, num_slots: int = 400, burn_in: int = 50,
                           greedy: bool = True, action_fn: Callable | None = None,
                           nominated_share: float | None = None) -> DecisionStates:
    """States of users at a decision point, visited by the policy in ``env``.

    Runs ``num_envs`` envs for ``burn_in + num_slots`` slots of the policy (greedy argmax of the
    logits, or sampled) and draws ``num_states`` (slot, env, user) decision points uniformly
    without replacement from the last ``num_slots`` slots (with replacement if there are
    fewer). ``nominated_share``: draw that share of the states from the decision points where
    the greedy actor nominates and the rest from those where it keeps (stratified; None =
    uniform over all decision points). ``action_fn(screen, gain)`` builds the env action
    (default: an ``EdgeAction`` when the env params hold traces, else the int screen).

    Returns ``DecisionStates`` of one-user states (see ``user_slice``).
    """
    if action_fn is None:
        action_fn = _edge_action_fn(env_params)
    reset_key, run_key, pick_key = jax.random.split(key, 3)

    @jax.jit
    def _run(reset_key, run_key):
        obs, state = jax.vmap(env.reset, in_axes=(0, None))(
            jax.random.split(reset_key, num_envs), env_params)

        def _slot(carry, k):
            state, obs = carry
            act_key, env_key = jax.random.split(k)
            screen, gain = _policy_action(apply_fn, net_params, obs,
                                          act_key, greedy)
            action = jax.vmap(action_fn)(screen, gain)
            obs2, state2, _, _, info = jax.vmap(env.step, in_axes=(0, 0, 0, None))(
                jax.random.split(env_key, num_envs), state, action, env_params)
            greedy_nom = jnp.argmax(apply_fn(net_params, obs)[0], axis=-1) == 1
            return (state2, obs2), (state, info["decision_mask"], greedy_nom)

        _, (states, dec, nom) = jax.lax.scan(_slot, (state, obs),
                                             jax.random.split(run_key, burn_in + num_slots))
        return states, dec, nom

    states, dec, nom = _run(reset_key, run_key)
    dec = np.asarray(dec)[burn_in:]                       # [T, E, U]
    nom = np.asarray(nom)[burn_in:]
    rng = np.random.default_rng(np.asarray(jax.random.key_data(pick_key)).ravel()[-1])
    if nominated_share is None:
        strata = [(np.argwhere(dec), int(num_states))]
    else:
        n_nom = int(round(float(nominated_share) * num_states))
        strata = [(np.argwhere(dec & nom), n_nom), (np.argwhere(dec & ~nom), num_states - n_nom)]
    picks = []
    for idx, k in strata:
        if k == 0:
            continue
        if len(idx) == 0:
            raise ValueError("sample_decision_states: no decision point of the requested kind "
                             f"in {num_slots} slots × {num_envs} envs")
        picks.append(idx[rng.choice(len(idx), size=k, replace=len(idx) < k)])
    idx = np.concatenate(picks)
    t, e, u = (jnp.asarray(idx[:, i]) for i in range(3))
    t = t + burn_in
    sel = jax.tree.map(lambda x: x[t, e], states)       # [N, U] / [N]
    one = user_slice(sel, u)
    p1 = env_params.replace(num_users=1)
    obs = jax.vmap(lambda s: _observe(env, s, p1))(one)
    return DecisionStates(state=one, obs=np.asarray(obs)[:, 0])


def _edge_action(screen, gain):
    return EdgeAction(screen=screen, gain=gain)


def _screen_only(screen, gain):
    return screen


def _edge_action_fn(env_params):
    return _edge_action if hasattr(env_params, "traces") else _screen_only


def mc_action_values(env, env_params, apply_fn, net_params, states, key, *,
                     replicates: int = 1, horizon: int = 2000, gamma: float = 1.0,
                     greedy: bool = True, batch: int = 4096,
                     action_fn: Callable | None = None) -> MCResult:
    """Monte-Carlo Q(s, a) of the frozen policy for a ∈ {0, 1} at N one-user states.

    For state n, replicate r and branch a: the user's first action is forced to a, then the
    policy acts (greedy argmax, or a sample with the replicate's per-slot key) until the
    user's solution ends (``done``) or ``horizon`` slots pass. The return is
    Σ_t γ^(k_t) r_t over the slots up to and including the end, where k_t is the number of
    the user's decisions before the latest one at or before slot t (the forced decision has
    k = 0): the per-decision discounting of ``prada_jax.rl.gae``. Branches 0 and 1 of a
    replicate use the same per-slot keys (common random numbers).

    Args:
      env, env_params: the env (``params.num_users`` is replaced by 1; the users of the env
        must not interact, see the module docstring).
      apply_fn, net_params: the frozen network.
      states: ``DecisionStates`` (one-user states at a decision point).
      key: PRNG key; replicate r of state n uses ``fold_in(fold_in(key, n), r)``.
      replicates: R.
      horizon: slot cap per rollout.
      gamma: discount per decision (the training config's ``ppo.gamma``).
      greedy: continuation policy: the greedy actor (stage 2's) or the sampling policy
        (the one PPO trained the critic on).
      batch: rollouts per jitted call (memory).

    Returns:
      ``MCResult`` (q [N, 2], dq [N], dq_se [N], unfinished).
    """
    if action_fn is None:
        action_fn = _edge_action_fn(env_params)
    p1 = env_params.replace(num_users=1)
    n = int(np.asarray(states.obs).shape[0])
    r = int(replicates)
    run = _mc_runner(env.step, apply_fn, int(horizon), bool(greedy), action_fn)
    g32 = jnp.float32(gamma)
    # Flatten (state n, replicate r, branch a) into rows.
    rows_n = np.repeat(np.arange(n), 2 * r)
    rows_r = np.tile(np.repeat(np.arange(r), 2), n)
    rows_a = np.tile(np.arange(2), n * r).astype(np.int32)
    keys = jax.vmap(lambda i, j: jax.random.fold_in(jax.random.fold_in(key, i), j))(
        jnp.asarray(rows_n, jnp.uint32), jnp.asarray(rows_r, jnp.uint32))
    rets = np.zeros(len(rows_n), np.float64)
    unfinished = 0
    for s in range(0, len(rows_n), batch):
        sl = slice(s, min(s + batch, len(rows_n)))
        m = sl.stop - sl.start
        pad = batch - m if len(rows_n) > batch else 0   # one compiled shape
        idx = np.concatenate([rows_n[sl], np.zeros(pad, np.int64)])
        st = jax.tree.map(lambda x: jnp.asarray(x)[idx], states.state)
        ks = jnp.concatenate([keys[sl], keys[:pad]]) if pad else keys[sl]
        fa = jnp.asarray(np.concatenate([rows_a[sl], np.zeros(pad, np.int32)]))
        ret, alive = run(st, ks, fa, net_params, p1, g32)
        rets[sl] = np.asarray(ret, np.float64)[:m]
        unfinished += int(np.sum(np.asarray(alive)[:m]))
    g = rets.reshape(n, r, 2)
    diff = g[:, :, 1] - g[:, :, 0]
    se = diff.std(axis=1, ddof=1) / np.sqrt(r) if r > 1 else np.zeros(n)
    return MCResult(q=g.mean(axis=1), dq=diff.mean(axis=1), dq_se=se, unfinished=unfinished)


@functools.lru_cache(maxsize=16)
def _mc_runner(step_fn, apply_fn, horizon: int, greedy: bool, action_fn):
    """Jitted ``run(states [B], keys [B], first [B], net_params, params, gamma) -> (return [B],
    unfinished [B])`` (cached: one compile per env/network/continuation policy)."""
    def _one(state, k, first, net_params, p1, gamma):
        def cond(c):
            _, t, alive, _, _ = c
            return alive & (t < horizon)

        def body(c):
            state, t, alive, ret, ndec = c
            sk = jax.random.fold_in(k, t)
            act_key, env_key = jax.random.split(sk)
            obs = population.observe(state, p1)
            screen, gain = _policy_action(apply_fn, net_params, obs, act_key, greedy)
            screen = jnp.where(t == 0, first, screen)
            _, state2, reward, done, info = step_fn(env_key, state, action_fn(screen, gain), p1)
            ndec = ndec + info["decision_mask"][0].astype(jnp.int32)
            disc = jnp.power(gamma, jnp.maximum(ndec - 1, 0).astype(jnp.float32))
            ret = ret + disc * reward[0]
            return state2, t + 1, alive & ~done[0], ret, ndec

        c0 = (state, jnp.int32(0), jnp.bool_(True), jnp.float32(0.0), jnp.int32(0))
        _, _, alive, ret, _ = jax.lax.while_loop(cond, body, c0)
        return ret, alive

    return jax.jit(jax.vmap(_one, in_axes=(0, 0, 0, None, None, None)))


def _observe(env, state, params):
    if hasattr(env, "observe"):
        return env.observe(state, params)
    return population.observe(state, params)


def critic_values(apply_fn, net_params, obs) -> tuple[np.ndarray, np.ndarray]:
    """``(q [N, 2], logits [N, 2])`` of the network at observations ``obs`` [N, D]."""
    logits, q = jax.jit(apply_fn)(net_params, jnp.asarray(obs))
    return np.asarray(q, np.float64), np.asarray(logits, np.float64)


def compare(critic_dq, mc: MCResult, actor_nominates, se_mult: float = 2.0) -> dict:
    """Agreement of the critic's ΔQ [N] and the actor's greedy nominations [N] (bool) with ΔQ_MC.

    ``resolved``: states whose |ΔQ_MC| > ``se_mult`` · its standard error (all when R = 1); sign
    statistics are over those. Returns a dict of plain floats/ints:
      n, resolved, sign_agree (critic sign = MC sign), pearson, spearman, bias (mean critic −
      MC), mae, mc_positive (share of ΔQ_MC > 0), critic_positive, and for the states where the
      actor nominates: nominations, nom_mc_positive (actor agrees with MC), nom_critic_positive,
      nom_critic_agrees_mc, nom_bias; and where it keeps: keeps, keep_mc_negative.
    """
    c = np.asarray(critic_dq, np.float64)
    m = np.asarray(mc.dq, np.float64)
    nom = np.asarray(actor_nominates, bool)
    res = np.abs(m) > se_mult * np.asarray(mc.dq_se) if np.any(mc.dq_se > 0) else \
        np.ones_like(m, bool)

    def share(x):
        return float(np.mean(x)) if np.size(x) else float("nan")

    def rank(x):
        o = np.argsort(x, kind="stable")
        r = np.empty(len(x))
        r[o] = np.arange(len(x))
        return r

    def corr(a, b):
        if len(a) < 2 or np.std(a) == 0 or np.std(b) == 0:
            return float("nan")
        return float(np.corrcoef(a, b)[0, 1])

    out = dict(n=int(len(c)), resolved=int(np.sum(res)),
               sign_agree=share((c[res] > 0) == (m[res] > 0)),
               pearson=corr(c, m), spearman=corr(rank(c), rank(m)),
               bias=float(np.mean(c - m)), mae=float(np.mean(np.abs(c - m))),
               mc_positive=share(m > 0), critic_positive=share(c > 0),
               mc_mean=float(np.mean(m)), critic_mean=float(np.mean(c)))
    rn = res & nom
    out.update(nominations=int(np.sum(nom)),
               nom_mc_positive=share(m[rn] > 0), nom_critic_positive=share(c[nom] > 0),
               nom_critic_agrees_mc=share((c[rn] > 0) == (m[rn] > 0)),
               nom_bias=float(np.mean(c[nom] - m[nom])) if nom.any() else float("nan"),
               nom_mc_mean=float(np.mean(m[nom])) if nom.any() else float("nan"),
               nom_critic_mean=float(np.mean(c[nom])) if nom.any() else float("nan"))
    rk = res & ~nom
    out.update(keeps=int(np.sum(~nom)), keep_mc_negative=share(m[rk] <= 0),
               keep_critic_negative=share(c[~nom] <= 0))
    mean = lambda x: float(np.mean(x)) if np.size(x) else float("nan")  # noqa: E731
    # What a rule gains over keeping everything local, per state (ΔQ_MC summed where it
    # nominates / N): the decision-relevant comparison (per-state signs are noisy when ΔQ_MC
    # has a large idiosyncratic part that no observation-based critic can predict).
    rules = {"actor": nom, "critic": c > 0, "actor_and_critic": nom & (c > 0),
             "mc_oracle": m > 0}
    out["rule_gain"] = {k: float(np.sum(np.where(v, m, 0.0)) / max(len(m), 1))
                        for k, v in rules.items()}
    out["rule_rate"] = {k: float(np.mean(v)) for k, v in rules.items()}
    out.update(nom_critic_neg=int(np.sum(nom & (c <= 0))),
               nom_critic_neg_mc_mean=mean(m[nom & (c <= 0)]),
               nom_critic_neg_mc_se=_se(m[nom & (c <= 0)]),
               nom_critic_pos_mc_mean=mean(m[nom & (c > 0)]),
               nom_critic_pos_mc_se=_se(m[nom & (c > 0)]),
               keep_critic_pos_mc_mean=mean(m[~nom & (c > 0)]),
               keep_critic_pos_mc_se=_se(m[~nom & (c > 0)]),
               value_weighted_sign_agree=float(np.sum(np.abs(m) * ((c > 0) == (m > 0)))
                                               / max(np.sum(np.abs(m)), 1e-30)))
    out["calibration"] = calibration(c, m)
    return out


def _se(x) -> float:
    x = np.asarray(x, np.float64)
    return float(x.std(ddof=1) / np.sqrt(len(x))) if len(x) > 1 else float("nan")


def calibration(pred, target, bins: int = 5) -> list[dict]:
    """Mean target per quantile bin of ``pred`` [N]: list of {"lo", "hi", "n", "pred_mean",
    "target_mean", "target_se"} (an observation-based critic can at best match the bin means)."""
    pred = np.asarray(pred, np.float64)
    target = np.asarray(target, np.float64)
    edges = np.quantile(pred, np.linspace(0, 1, bins + 1))
    which = np.clip(np.searchsorted(edges, pred, side="right") - 1, 0, bins - 1)
    out = []
    for b in range(bins):
        sel = which == b
        if not sel.any():
            continue
        out.append(dict(lo=float(edges[b]), hi=float(edges[b + 1]), n=int(sel.sum()),
                        pred_mean=float(pred[sel].mean()), target_mean=float(target[sel].mean()),
                        target_se=_se(target[sel])))
    return out


# ----------------------------------------------------------------------------- refit targets

def fit_targets(mc: MCResult) -> np.ndarray:
    """[N, 2] regression targets for Q(s, 0), Q(s, 1): the MC means."""
    return np.asarray(mc.q, np.float32)

