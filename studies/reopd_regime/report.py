"""``report.md`` of ``studies.reopd_regime`` from its ``study.json`` (SYNTHETIC)."""
from __future__ import annotations


def _f(x, d: int = 3) -> str:
    return "—" if x is None else f"{x:.{d}f}"


def _ci(g: dict) -> str:
    return f"{g['mean']:+.3f} [{g['ci_low']:+.3f}, {g['ci_high']:+.3f}]"


def markdown(res: dict) -> str:
    """Tables of every part present in ``res``."""
    out = ["# ReOPD in a regime where distillation learns (issue 44) — SYNTHETIC", "",
           f"Task `{res.get('task')}`; registration: studies/reopd_regime/README.md.", ""]
    for part, section in (("teacher", _teacher), ("cold", _cold), ("depth", _depth),
                          ("pilot", _pilot), ("gate", _gate), ("reopd_pilot", _reopd_pilot),
                          ("compare", _compare), ("cost", _cost)):
        if res.get(part):
            out += section(res[part])
    return "\n".join(out) + "\n"


def _teacher(t: dict) -> list[str]:
    out = ["## Teacher (item 2)", "", "| steps | greedy | τ = 1 | train s |",
           "|---:|---:|---:|---:|"]
    for a in t.get("attempts", []):
        out.append(f"| {a['steps']} | {_f(a['greedy']['success_rate'])} | "
                   f"{_f(a['sampled']['success_rate'])} | {a['train_s']:.0f} |")
    return out + ["", f"Accepted: {t.get('accepted')}; injected errors: {t.get('inject')}; "
                      f"pool: {t.get('pool')}", ""]


def _cold(c: dict) -> list[str]:
    curve = c["curve"].get("eval/success_rate", [])
    out = ["## Cold start (item 3)", "",
           f"SFT stopped at update {c['stopped_at']} (rule {c['rule']}); success on the "
           f"gate set {_f(c['success']['gate'])}, teacher {_f(c['teacher_success']['gate'])}"
           ".", "", "| update | success (3003) |", "|---:|---:|"]
    # the trainer writes its final evaluation at the planned last update: leave it out
    return out + [f"| {s} | {_f(v)} |" for s, v in curve if s <= c["stopped_at"]] + [""]


def _depth(d: dict) -> list[str]:
    out = ["## Depth: T's log-prob of the student's actions and the exact KL by turn "
           "(items 2, 3)", "", f"Student episodes at τ = 1 on {d['problems']}.", "",
           "| student | turn | rows | T log-prob [nats] | exact KL [nats] |",
           "|---|---:|---:|---:|---:|"]
    for name, x in d["students"].items():
        kl = {r["t"]: r for r in x["exact_kl"]["depth"]}
        for r in x["teacher_logp"]["depth"]:
            k = kl.get(r["t"], {})
            out.append(f"| {name} | {r['t']} | {r['n']} | {_f(r['mean'], 2)} "
                       f"[{_f(r['ci_low'], 2)}, {_f(r['ci_high'], 2)}] | "
                       f"{_f(k.get('mean'), 2)} [{_f(k.get('ci_low'), 2)}, "
                       f"{_f(k.get('ci_high'), 2)}] |")
        for key in ("teacher_logp", "exact_kl"):
            f = x[key]["fit"]
            if f:
                out.append(f"\n{name} {key}: slope {f['slope']:+.3f} nats/turn "
                           f"[{_f(f['slope_ci'][0])}, {_f(f['slope_ci'][1])}] over "
                           f"depths {f['depths']}; τ = 1 success "
                           f"{_f(x['success_tau1'])}.")
    return out + [""]


def _lr_rows(means: dict, chosen: float, prefix: str = "") -> list[str]:
    """One table row per lr of a grid (ascending), the chosen one marked."""
    return [f"| {prefix}{lr}{' (chosen)' if float(lr) == chosen else ''} | {_f(v)} |"
            for lr, v in sorted(means.items(), key=lambda kv: float(kv[0]))]


def _pilot(p: dict) -> list[str]:
    out = ["## lr pilot (OPD, SFT continuation)", "", f"B = {p['B']} pairs per update.",
           "", "| mode | lr | mean pilot success |", "|---|---:|---:|"]
    for m in ("opd", "sft"):
        out += _lr_rows(p[m]["means"], p[m]["lr"], f"{m} | ")
    return out + [""]


def _gate(g: dict) -> list[str]:
    return ["## The gate (item 1)", "", f"**{g['outcome']}**", "",
            "| check | value | rule | holds |", "|---|---|---|---|",
            f"| OPD gain over the cold start | {_ci(g['opd_gain'])} | ≥ "
            f"{g['thresholds']['opd_min']} and CI > 0 | {g['checks']['opd_gain']} |",
            f"| SFT continuation gain | {_ci(g['sft_gain'])} | ≤ "
            f"{g['thresholds']['sft_max']} | {g['checks']['sft_plateau']} |",
            f"| headroom (T − cold) | {_f(g['headroom'])} | ≥ "
            f"{g['thresholds']['headroom_min']} | {g['checks']['headroom']} |", ""]


def _reopd_pilot(rp: dict) -> list[str]:
    return (["## ReOPD κ 0.6 lr pilot", "", "| lr | mean pilot success |", "|---:|---:|"]
            + _lr_rows(rp["means"], rp["lr"]) + [""])


def _compare(cm: dict) -> list[str]:
    v = cm["verdicts"]
    out = ["## The comparison (item 8)", "",
           f"N_c (OPD at ReOPD's modelled cost): {cm['n_cost']['n_cost']} updates; cold "
           f"start {_f(cm['cold_success'])} on the verdict sets.", "",
           "| method | greedy | τ = 1 | change from cold (CI) |", "|---|---:|---:|---|"]
    for k, x in cm["success"].items():
        out.append(f"| {k} | {_f(x)} | {_f(cm['success_tau1'][k])} | "
                   f"{_ci(v['moved'][k])} |")
    out += ["", "| claim | difference (CI) | MDE | verdict |", "|---|---|---:|---|"]
    for key in ("a_equal_turns", "b_equal_cost", "d_kappa", "e_vs_sft"):
        if key in v:
            out.append(f"| {key} | {_ci(v[key])} | {_f(v[key]['mde'])} | "
                       f"{v[key]['verdict']} |")
    if "c_time_to_80" in v:
        c8 = v["c_time_to_80"]
        out.append(f"| c_time_to_80 | ratio {_f(c8['ratio'])} [{_f(c8['ci_low'])}, "
                   f"{_f(c8['ci_high'])}] | — | {c8['verdict']} |")
    return out + [f"| f_tool_calls | {v['f_tool_calls']['reopd']} vs OPD "
                  f"{v['f_tool_calls']['opd']} | — | {v['f_tool_calls']['verdict']} |", "",
                  f"Budget moved a student (one-sided): {v['budget_moved']}.", ""]


def _cost(k: dict) -> list[str]:
    out = ["## Declared GPU cost model (item 7)", "", f"Unit: {k['unit']}.", "",
           "| hardware | turns | tokens/turn | episodes | tool s | OPD/ReOPD | "
           "break-even s (1×) | break-even s (4×) |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in k["rows"]:
        if r["episodes"] == 8 and r["turns"] in (3, 5, 8):
            out.append(f"| {r['hardware']} | {r['turns']} | {r['tokens_per_turn']} | "
                       f"{r['episodes']} | {r['tool_latency_s']} | {r['ratio']:.2f} | "
                       f"{_f(r['break_even_s_parity'])} | {_f(r['break_even_s_4x'])} |")
    return out + [""]
