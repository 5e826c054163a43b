"""What the server's prefix cache changes under load (issue 51 item 1):
``python -m evals.prefix_cache --policy=REFIT_DIR [--rate=32 --seeds=4 --hardware=PAIR]``.

Runs the server LLM alone, All-SLM, RSD (online PRM) and PRADA (λ = µ = 0) at one arrival rate
on the test split of the policy's trace set, on the serving server of ``--hardware`` (default:
the pair the policy was trained under; another is refused, ``evals.policy_pair``), twice on
the same seeds: with the prefix cache (``envs.prefix_cache``, the default) and without it
(``server_kv_cache=False, prm_prefix_cache=False``: every offload and every PRM pass prefills
its whole context, the ablation). Prints per row and server the offered load ρ, p90 latency
(withheld where ρ ≥ 1), accuracy, offload rate, prefix hit rate and evicted tokens per second,
mean ± 95 % CI over seeds; ``--json`` writes them. Exit codes (``prada_jax.cli``): 2 bad input,
1 a bug. Every number is from the policy's traces (SYNTHETIC unless a real trace set).
"""
from __future__ import annotations

import sys
from pathlib import Path

from absl import flags

from evals import report, suite
from evals.capacity import measure
from evals.policy_pair import check_policy_pair, policy_pair
from prada_jax import cli, config_utils, stats
from prada_jax.jsonio import write_json

#: The two servers compared: the default (cache on) and the ablation.
SERVERS = {"prefix cache": {}, "no cache": {"server_kv_cache": False, "prm_prefix_cache": False}}
COLUMNS = ("rho", "latency_p90_s", "accuracy", "offload_rate", "prefix_hit_rate",
           "evicted_tokens_per_s")


def measure_servers(policy, pair: str, rate: float, seeds: int, slots: int = 600,
                    warmup: int = 100, drain: int = 400) -> dict:
    """``{server: {row: {metric: [S]}}}`` at ``rate`` users/s on the test split."""
    sizes = measure.Sizes((rate,), slots, warmup, drain, seeds, seeds,
                          measure.edge.DEFAULT_MAX_NUM_SEQS, 20e6, "demo", (0,))
    tr = measure.load_split(policy, "test")
    seed0 = suite.evaluation_seed0(tr.info, policy, seeds)
    rows = measure.baseline_rows() + [measure.ev.PolicySpec(measure.ZERO, "policy",
                                                            "threshold")]
    out = {}
    for name, over in SERVERS.items():
        kw = dict(measure.env_kwargs(policy, pair, sizes), **over)
        g = measure.Grid(tr.traces, kw, sizes, policy.apply_fn, seed0, seeds)
        res = g.run(rate, rows, policy.params)
        out[name] = {r: {k: [float(x) for x in v] for k, v in m.items()} for r, m in res.items()}
    return out


def table(results: dict, title: str) -> str:
    lines = [title, f"{'server':<13} {'row':<18} " + " ".join(f"{c:>22}" for c in COLUMNS)]
    for server, rows in results.items():
        for row, m in rows.items():
            cells = []
            for c in COLUMNS:
                v = m.get(c)
                unstable = c in report.LATENCY_METRICS and max(m["rho"]) >= 1.0
                if v is None or unstable:
                    cells.append(f"{'unstable' if unstable else '—':>22}")
                    continue
                ci = stats.mean_ci(v)
                cells.append(f"{ci.mean:.3f} [{ci.low:.3f}, {ci.high:.3f}]".rjust(22))
            lines.append(f"{server:<13} {row:<18} " + " ".join(cells))
    return "\n".join(lines)


def _define_flags():
    flags.DEFINE_string("policy", None, "refit policy folder (train.policy_samples' "
                        "seed_<k>/critic).")
    flags.DEFINE_string("hardware", None, "pair of the clock (default: the policy's).")
    flags.DEFINE_float("rate", 32.0, "arrival rate [users/s per server GPU].", lower_bound=0.01)
    flags.DEFINE_integer("seeds", 4, "evaluation seeds (test split).", lower_bound=2)
    flags.DEFINE_string("json", None, "write the per-seed results here.")


def main(argv):
    F = flags.FLAGS
    config_utils.reject_extra_argv(argv)
    config_utils.require_flag(F.policy, "--policy", "a refit policy folder")
    if F.json:
        config_utils.check_output_file(F.json, "--json")
    policy = suite.load_policy(F.policy)
    pair = F.hardware or policy_pair(policy.meta)
    check_policy_pair(policy.meta, pair, F.policy)
    res = measure_servers(policy, pair, F.rate, F.seeds)
    synthetic = " (SYNTHETIC traces)" if policy.meta.get("synthetic", True) else ""
    print(table(res, f"{pair}, {F.rate:g} users/s, {F.seeds} seeds, test split{synthetic}; "
                     "mean [95 % CI]"))
    if F.json:
        write_json(Path(F.json), {"pair": pair, "rate": F.rate, "seeds": F.seeds,
                                  "policy": F.policy, "results": res})
        print(f"results: {F.json}", file=sys.stderr)


if __name__ == "__main__":
    cli.run(main, define_flags=_define_flags)
