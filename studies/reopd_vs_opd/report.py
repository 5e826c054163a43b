"""The tables of ``studies.reopd_vs_opd`` (report.md) from its study.json; the cells the
addendum and ``studies.reopd_prefix_source`` reuse. SYNTHETIC numbers."""
from __future__ import annotations

from prada_jax.stats import mean_ci
from studies import _shared
from studies._shared import fmt as _f


def paired_cell(d: dict) -> str:
    """A paired difference's mean [95% CI] with both means and the seed count."""
    return (f"{_f(d.get('mean'))} [{_f(d.get('ci_low'))}, {_f(d.get('ci_high'))}] "
            f"({_f(d['mean_a'])} vs {_f(d['mean_b'])}, n = {d['n']})")


def markdown(res: dict) -> str:
    L = ["# ReOPD vs online OPD from cold starts — tables (SYNTHETIC)", ""]
    L += ["## Cold starts", "",
          "| cold start | gate (success ≥, c̄ ≤) | reached | success, verdict problems | "
          "c̄ at the gate [nats/turn] |", "|---|---|---|---|---|"]
    for c in res["cold_starts"]:
        L.append(f"| {c['name']} | {c['success_min']}, {c['gap_max']} | "
                 f"{'update ' + str(c['step']) if c['reached'] else 'gate not reached'} | "
                 f"{_f(c['success_verdict_problems'])} | {_f(c['gap'])} |")
    L.append(f"| teacher | — | — | {_f(res['teacher']['success_rate'])} | 0 |")
    L += ["", "## Learning-rate / warm-up pilot (pilot seeds and problems)", "",
          "| mode | lr | warm-up | mean pilot success |", "|---|---|---|---|"]
    for r in res["pilot"]["rows"]:
        L.append(f"| {r['mode']} | {r['lr']:g} | {r['warmup']} | {_f(r['mean'])} |")
    L.append("")
    L.append("Chosen: " + "; ".join(f"{m}: lr {v['lr']:g}, warm-up {v['warmup']}"
                                   for m, v in res["pilot"]["choice"].items()))
    for st in res["studies"]:
        L += ["", f"## From the {st['cold']} cold start (N = {st['N']} updates, B = {st['B']} "
              f"pairs, N_w = {st['N_wall']})", "",
              "| method | success (mean ± 95% CI) | final c̄ | supervised turns / seed | "
              "tool calls | rollout s / turn | median s / update (all seeds) |",
              "|---|---|---|---|---|---|---|"]
        ns = len(st["runs"]["opd"]["seeds"])
        for name, r in st["runs"].items():
            L.append(f"| {name} | {mean_ci(r['success']).fmt() if r['success'] else '—'} | "
                     f"{run_cells(r, ns)} | {_f(r['rollout_s_per_turn'], 5)} | "
                     f"{_f(r['update_total_s_median'], 2)} |")
        v = st["verdicts"]
        b = v["b_speed"]
        L += ["", "| rule | numbers | verdict |", "|---|---|---|",
              f"| (a) ReOPD ≥ OPD − 0.02, equal turns | {paired_cell(v['a_equal_turns'])} | "
              f"**{v['a_equal_turns']['verdict']}** |",
              f"| (a) ReOPD ≥ OPD − 0.02, equal wall time | {paired_cell(v['a_equal_wall'])} | "
              f"**{v['a_equal_wall']['verdict']}** |",
              f"| (b) OPD/ReOPD rollout s per turn ≥ 4 at {res['sizes']['latency_s'] * 1e3:g} ms "
              f"and at 0 | {_f(b['ratio_latency'], 2)}× and {_f(b['ratio_lat0'], 2)}× | "
              f"**{b['verdict_rollout']}** |",
              f"| (b) … incl. pool collection > 2 | {_f(b['ratio_with_pool'], 2)}× (C per seed, "
              f"no verdict: {_f(b['ratio_with_pool_per_seed'], 2)}×) | "
              f"**{b['verdict_with_pool']}** |",
              f"| (c) ReOPD > SFT continuation | {paired_cell(v['c_vs_sft'])} | "
              f"**{v['c_vs_sft']['verdict']}** |",
              f"| (d) κ = 0.6 ≥ κ = 1 − 0.02 | {paired_cell(v['d_kappa'])} | "
              f"**{v['d_kappa']['verdict']}** |",
              f"| (e) 0 tool calls in ReOPD | ReOPD {sorted(set(v['e_tool_calls']['reopd'].values()))}"
              f", OPD {v['e_tool_calls']['opd']} | **{v['e_tool_calls']['verdict']}** |"]
        for k, d in v["extra"].items():
            L.append(f"| (no verdict) {k} − reopd_k0.6 | {paired_cell(d)} | — |")
    c = res["collection"]
    L += ["", f"Pool collection C: {c['episodes']} teacher episodes, {c['tool_calls']} tool "
          f"calls at {c['latency_s'] * 1e3:g} ms: {c['seconds']:.2f} s.", ""]
    return "\n".join(L)


def run_cells(r: dict, n_seeds: int) -> str:
    """A run's report cells: mean final c̄, supervised turns per seed, tool calls."""
    return (f"{_shared.mean_cell(r['gap_end'])} | "
            f"{r['totals']['supervised_turns'] / n_seeds:.0f} | {r['tool_calls']}")
