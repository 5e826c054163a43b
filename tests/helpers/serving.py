"""Closed forms of the serving server written out from the datasheet (A100 80GB bf16) and the
Qwen2.5-7B shape, not read from ``prada_jax.latency``: shared by the serving tests of envs/ and
evals/."""
import numpy as np

from envs.edge_numpy import EdgeEnvNumPy

# A100 at bf16 serving Qwen2.5-7B, written out from the datasheet and the model shape (not read
# from prada_jax.latency): lm_head included in the per-token products (7.075e9 parameters).
PK = 312e12 * 0.5
BWM = 2.039e12 * 0.8
P_TOK = 6.53e9 + 152064 * 3584
W_7B = P_TOK * 2.0
KV_7B = 2 * 28 * 4 * 128 * 2.0
L_, D_ = 28, 3584


def step_by_hand(b, ctx_sum):
    return max((2 * P_TOK * b + 4 * L_ * D_ * ctx_sum) / PK, (W_7B + KV_7B * ctx_sum) / BWM)


def llm_alone_cost_by_hand(traces, m):
    """Per problem: the server-seconds one LLM-alone user costs a saturated server of M
    sequences, from the datasheet figures and a plain walk of the LLM's branch: its share of
    the full-batch decode steps (Σ_k t_step(M, M·(c+k)) / M) plus the stall its prefill adds to
    one full-batch step (t_mix − t_step at its mean context). Time balance of a saturated
    server: users/s = 1 / E[cost]."""
    ref = EdgeEnvNumPy(traces, dict(num_users=1, scheduler="offload_all", tau_s=0.05))
    ctx = np.asarray(traces.ctx_tokens)
    cost = []
    for r in np.asarray(traces.root).tolist():
        n, c = float(ctx[r]), float(ctx[r])
        dec = ref._path(r)[0]
        f_pf = 2 * 6.53e9 * n + 2 * L_ * D_ * n * n + 2 * (P_TOK - 6.53e9)
        share = sum(step_by_hand(m, m * (c + k)) for k in range(dec)) / m
        cbar = c + dec / 2
        f_step = m * (2 * P_TOK + 4 * L_ * D_ * cbar)
        b_step = W_7B + KV_7B * m * cbar
        stall = max((f_step + f_pf) / PK, b_step / BWM) - max(f_step / PK, b_step / BWM)
        cost.append(share + stall)
    return np.array(cost)
