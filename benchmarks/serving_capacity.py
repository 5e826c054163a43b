"""Capacity of the serving server, closed form beside the env: the numbers of docs/latency.md.

    python -m benchmarks.serving_capacity [--pair a100_orin_int4] [--m 4,32,64,128,256,kv]
                                          [--seeds 2] [--json FILE]

For the server LLM alone (a resident sequence per user: prefill the question, decode the whole
solution, download its last step) on the *synthetic* gsm8k preset (test split problems of the
generator, 256 problems):

* ``closed users/s``: ``1 / E[latency.job_load_s]`` over problems (each user's share of the
  full-batch decode steps + its prefill's stall of one step), the capacity at ρ = 1;
* ``env users/s``: completions per second of the env overloaded at 1.3× that rate (U = M + 128
  user slots, arrivals beyond U blocked) over 1 600 slots after a warm-up of
  ``max(400, 2·M / (capacity·τ))`` slots (two sequence lifetimes), ``--seeds`` runs;
* ``slot-adjusted``: the closed form less the ≈ 1.5 slots per user a sequence idles at the
  env's slot granularity (``closed / (1 + 1.5·τ·closed / M)``);
* the RSD baseline's online PRM (Qwen2.5-Math-PRM-7B shape, no prefix cache) per user: its
  scoring passes' server-seconds (``job_load_s`` of every step's pass along the SLM's branch,
  every step scored) and the share of the GPU it would take at the LLM alone's capacity.

``kv`` in ``--m`` is the KV bound of the pair at the longest sequence (``edge.max_num_servers``).
"""
from __future__ import annotations

import numpy as np
from absl import flags

from benchmarks.common import save_json
from envs import edge
from envs.testing import llm_alone_window_sums
from evals import suite
from prada_jax import cli, config_utils
from prada_jax import latency as lat
from prada_jax.errors import BadInput
from prada_jax.traces import synthetic

TAU = 0.05


def closed_form(traces, lp, m: int) -> tuple[float, float]:
    """(LLM alone users/s at ρ = 1, mean PRM server-seconds per RSD user) at M = m."""
    path = edge.llm_path(traces)
    root = np.asarray(traces.root)
    ctx = np.asarray(traces.ctx_tokens)[root]
    dec = np.asarray(path.tokens)[root]
    pf = lat.roofline_prefill_flops(lp.llm, ctx, 0.0)
    load = np.asarray(lat.job_load_s(lp.llm, lp.server_hw, pf, dec, ctx, m))
    # RSD: one PRM pass per step along the SLM's branch (the draft kept), context + draft.
    child = np.asarray(traces.child)
    term = np.asarray(traces.terminal).astype(bool)
    fb = np.asarray(traces.fallback)
    tok = np.asarray(traces.cand_tokens)
    allctx = np.asarray(traces.ctx_tokens)
    w_prm = lat.model_weight_bytes(lp.prm, lp.server_hw)
    prm = []
    for r in root.tolist():
        n, total = r, 0.0
        while True:
            t = float(allctx[n] + tok[n, 0])
            f = lat.roofline_prefill_flops(lp.prm, t, 0.0)
            total += float(lat.job_load_s(lp.llm, lp.server_hw, f, 0.0, t, m,
                                          extra_weight_bytes=w_prm))
            if term[n, 0]:
                break
            n = int(child[n, 0]) if child[n, 0] >= 0 else int(fb[n])
        prm.append(total)
    return 1.0 / float(load.mean()), float(np.mean(prm))


def env_throughput(traces, pair: str, m: int, rate: float, seeds: int,
                   slots: int = 2000, warm: int = 400) -> float:
    """Completions per second of the LLM alone (U = M + 128) over slots [warm, slots)."""
    out = llm_alone_window_sums(traces, pair, m, rate, m + 128, slots, warm, seeds, seed=3)
    return float(out[:, 0].sum()) / ((slots - warm) * TAU * seeds)


def run(pair: str, ms, seeds: int = 2) -> dict:
    traces, _ = synthetic.generate("gsm8k", seed=0, problems=256)
    probe = edge.make_params(traces, num_users=1, hardware=pair, num_servers=1)
    lp = probe.latency
    kv = edge.max_num_servers(lp, traces, "serving")
    rows = []
    for m in ms:
        m = kv if m == "kv" else int(m)
        cap, prm_s = closed_form(traces, lp, m)
        adj = cap / (1.0 + 1.5 * TAU * cap / m)
        # steady state: a sequence lives about M / capacity seconds; warm up two lifetimes
        warm = max(400, int(2 * m / (cap * TAU)))
        thr = env_throughput(traces, pair, m, 1.3 * cap, seeds, slots=warm + 1600, warm=warm)
        rows.append(dict(num_servers=m, closed_users_per_s=cap, slot_adjusted=adj,
                         env_users_per_s=thr, env_over_adjusted=thr / adj,
                         prm_server_s_per_user=prm_s, prm_gpu_share_at_capacity=prm_s * cap))
    return dict(pair=pair, kv_bound=kv, rows=rows, seeds=seeds,
                traces="synthetic gsm8k (256 problems)")


def table(res: dict) -> str:
    out = [f"pair {res['pair']}, KV bound {res['kv_bound']} sequences, {res['traces']}",
           "| M | closed users/s | slot-adjusted | env users/s | env / adjusted | "
           "PRM server-s per RSD user | PRM's GPU share at that rate |",
           "|---|---|---|---|---|---|---|"]
    for r in res["rows"]:
        out.append(f"| {r['num_servers']} | {r['closed_users_per_s']:.1f} | "
                   f"{r['slot_adjusted']:.1f} | {r['env_users_per_s']:.1f} | "
                   f"{r['env_over_adjusted']:.3f} | {r['prm_server_s_per_user']:.3f} | "
                   f"{r['prm_gpu_share_at_capacity']:.2f} |")
    return "\n".join(out)


def _define_flags():
    flags.DEFINE_string("pair", lat.CONFIG_PAIR, "hardware pair (a roofline pair).")
    flags.DEFINE_list("m", ["4", "32", "64", "128", "256", "kv"], "max_num_seqs values "
                      "(kv: the KV bound).")
    flags.DEFINE_integer("seeds", 2, "env runs per M.", lower_bound=1)
    flags.DEFINE_string("json", None, "write the results here as JSON.")


def _check_ms(pair: str, ms, seeds: int) -> None:
    """Refuses an empty ``--m``, a value that is not a positive integer or ``kv``, an M above
    the pair's KV bound, and an env batch (``seeds`` envs of M + 128 user slots) beyond this
    machine's memory, before the run."""
    if not ms:
        raise BadInput("--m: empty list; give max_num_seqs values (positive integers or 'kv')")
    for m in ms:
        if m != "kv" and not (m.isdigit() and int(m) >= 1):
            raise BadInput(f"--m: positive integers or 'kv', got {m!r}")
    traces, _ = synthetic.generate("gsm8k", seed=0, problems=256)
    lp = edge.make_params(traces, num_users=1, hardware=pair, num_servers=1).latency
    kv = edge.max_num_servers(lp, traces, "serving")
    top = max(kv if m == "kv" else int(m) for m in ms)
    if top > kv:
        raise BadInput(f"--m: {top} is above the KV bound of pair {pair} ({kv} sequences)")
    suite.check_fits(seeds, top + 128, "--m")


def main(argv):
    """Checks every flag (``--json`` writable, the pair, each M) before the run: bad input is
    one stderr line, exit 2, nothing written."""
    del argv
    F = flags.FLAGS
    if F.json:   # before the run, not after it (a folder or a bad parent lost the results)
        config_utils.check_output_file(F.json, "--json")
    if F.pair == lat.PAPER:
        raise BadInput("--pair: the serving server needs a roofline pair, not paper")
    lat.check_pair(F.pair, "--pair")
    _check_ms(F.pair, F.m, F.seeds)
    res = run(F.pair, F.m, F.seeds)
    print(table(res))
    save_json(F.json, res, indent=1)


if __name__ == "__main__":
    cli.run(main, define_flags=_define_flags)
