"""The gate's feasibility under the registered size, from the committed records of
``studies/reopd_regime`` only (no run; issue 53 item 1), SYNTHETIC.

    python -m studies.reopd_gate.feasibility [--out=FILE]   # default: print only

Reads ``studies/reopd_regime/results/study.json`` (the cold start's and T's per-problem
outcomes) and ``results/runs/pilot/*.json`` (per-seed per-problem greedy outcomes of OPD and
SFT continuation at every pilot lr, pilot seeds 100–102, on the gate set ``6003`` and the pilot
set ``2003``, 256 problems each). For each check of the restated gate it gives the value those
records show, its variance components (``prada_jax.stats.variance_components``: 3 seeds × 256
problems) and what they imply at the registered size, 8 seeds × 4 sets of 512: the standard
error the two-way bootstrap will report (``planned_mde`` with the bootstrap's interaction
factor, / 2.80), the expected 95 % CI (value ± 1.96 SE) and the normal-approximation
probability that the check holds if the true value is the one measured. The same components
of contrasts between two trained students give the expected MDE of the endpoints. An
*expectation*: the regime's gate set was read once already, and the lr was chosen on the
pilot set (its values are optimistic for OPD).
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np

from prada_jax import stats
from prada_jax.distill.task import kg
from prada_jax.stats.power import BOOTSTRAP_INTERACTION
from studies.reopd_gate import rules

ROOT = Path(__file__).resolve().parents[2]
REGIME = ROOT / "studies" / "reopd_regime" / "results"
SEEDS = (100, 101, 102)
S_REG, P_REG = 8, 2048            # the registered size
Z = 1.959963984540054


def _phi(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


def outcomes(name: str, key: str) -> np.ndarray:
    return np.array([[int(ch) for ch in json.loads(
        (REGIME / "runs" / "pilot" / f"{name}_seed{s}.json").read_text())["outcomes"][key]]
        for s in SEEDS], np.float64)


def expect(d: np.ndarray, threshold: float | None, ci_above_zero: bool) -> dict:
    """Value, components and the registered design's expected SE / CI / P(check holds)."""
    comp = stats.variance_components(d)
    out = {"value": float(d.mean()), "components": comp,
           "measured": stats.two_way_bootstrap(d, n_boot=2000, seed=1)}
    for name, S in (("8_seeds", S_REG), ("4_seeds", 4)):
        mde = stats.planned_mde(comp, S, P_REG, BOOTSTRAP_INTERACTION)
        se = mde / 2.801585218460495
        e = {"se": se, "mde": mde, "mde_model": stats.planned_mde(comp, S, P_REG, 1.0),
             "ci": [out["value"] - Z * se, out["value"] + Z * se]}
        if threshold is not None:
            p = _phi((out["value"] - threshold) / se)
            if ci_above_zero:
                p = min(p, _phi(out["value"] / se - Z))
            e["p_holds"] = p
        out[name] = e
    return out


def headroom(cold: str) -> dict:
    """1 − cold start over ``cold`` (0/1 string): one model, so problems only; binomial SE at
    2 048 problems."""
    p = float(np.mean([int(ch) for ch in cold]))
    h = 1.0 - p
    se = math.sqrt(p * (1 - p) / P_REG)
    return {"value": h, "se_2048": se, "ci_2048": [h - Z * se, h + Z * se],
            "p_holds": _phi((h - rules.G3_MIN) / se)}


def first_reach_opd(cold_guess: float) -> dict:
    """OPD (lr 3e-3) pilot probe curves: the step its mean curve first reaches the cold start +
    0.8 × its gain at 400 (the cold start's probe success is not in the records: the gate-set
    value stands in)."""
    curves = [json.loads((REGIME / "runs" / "pilot" / f"opd_lr0.003_seed{s}.json").read_text())
              ["curves"]["eval/success_rate"] for s in SEEDS]
    steps = [p[0] for p in curves[0]]
    mean = np.mean([[p[1] for p in c] for c in curves], 0)
    level = cold_guess + 0.8 * (mean[-1] - cold_guess)
    reach = next((int(s) for s, v in zip(steps, mean) if v >= level), None)
    per_seed = []
    for c in curves:
        lv = cold_guess + 0.8 * (c[-1][1] - cold_guess)
        per_seed.append(next((int(s) for s, v in c if v >= lv), None))
    return {"steps": steps, "mean_curve": mean.tolist(), "level": level, "first_reach": reach,
            "per_seed_first_reach": per_seed, "cold_stand_in": cold_guess}


def opd_cost() -> dict:
    per = sum((json.loads((REGIME / "runs" / "pilot" / f"opd_lr0.003_seed{s}.json")
                          .read_text())["per_update_counts"] for s in SEEDS), [])
    out = {}
    for lat in (rules.COST_TOOL_S, 0.0):
        p = rules.price_counts(per, "opd", kg.MAX_ACTION_TOKENS, tool_s=lat)
        out[f"tool_{lat:g}s"] = {k: p[k] for k in ("rollout_s", "total_s", "tool_s",
                                                   "decode_s", "student_prefill_s")}
    return out


def compute() -> dict:
    st = json.loads((REGIME / "study.json").read_text())
    cold = st["cold"]["outcomes"]
    res = {"synthetic": True, "source": "studies/reopd_regime/results (committed records)",
           "registered_size": {"seeds": S_REG, "problems": P_REG, "sets": 4},
           "bootstrap_interaction_factor": BOOTSTRAP_INTERACTION, "checks": {}, "mde": {}}
    for key in ("gate", "pilot"):
        c = np.array([int(ch) for ch in cold[key]], np.float64)[None, :]
        o, s = outcomes("opd_lr0.003", key), outcomes("sft_lr0.001", key)
        res["checks"][key] = {
            "G1_opd_minus_cold": expect(o - c, rules.G1_MIN, True),
            "G2_opd_minus_sft": expect(o - s, rules.G2_MIN, True),
            "G3_headroom": headroom(cold[key])}
        # endpoint MDEs: contrasts between two trained students of this regime
        res["mde"][key] = {name: expect(outcomes(a, key) - outcomes(b, key), None, False)
                           for name, (a, b) in {
                               "opd3e-3_minus_opd1e-3": ("opd_lr0.003", "opd_lr0.001"),
                               "opd3e-3_minus_sft1e-3": ("opd_lr0.003", "sft_lr0.001"),
                               "sft1e-3_minus_sft3e-3": ("sft_lr0.001", "sft_lr0.003"),
                               "opd1e-3_minus_opd3e-4": ("opd_lr0.001", "opd_lr0.0003")}.items()}
    res["opd_time_to_80"] = first_reach_opd(st["cold"]["success"]["gate"])
    res["opd_modelled_cost_per_update"] = opd_cost()
    return res


def summary(res: dict) -> str:
    lines = []
    for key, ch in res["checks"].items():
        for name, e in ch.items():
            if "8_seeds" in e:
                x = e["8_seeds"]
                lines.append(f"{key} {name}: {e['value']:+.3f} (measured CI "
                             f"[{e['measured']['ci_low']:+.3f}, {e['measured']['ci_high']:+.3f}]"
                             f"); at 8x2048 SE {x['se']:.4f}, expected CI [{x['ci'][0]:+.3f}, "
                             f"{x['ci'][1]:+.3f}], P(holds) {x['p_holds']:.3f}; 4 seeds SE "
                             f"{e['4_seeds']['se']:.4f}")
            else:
                lines.append(f"{key} {name}: {e['value']:.3f}, SE {e['se_2048']:.4f}, expected "
                             f"CI [{e['ci_2048'][0]:.3f}, {e['ci_2048'][1]:.3f}], P(holds) "
                             f"{e['p_holds']:.3f}")
        for name, e in res["mde"][key].items():
            lines.append(f"{key} MDE {name}: value {e['value']:+.3f}; MDE 8 seeds "
                         f"{e['8_seeds']['mde']:.4f} (model {e['8_seeds']['mde_model']:.4f}), "
                         f"4 seeds {e['4_seeds']['mde']:.4f}")
    t = res["opd_time_to_80"]
    lines.append(f"OPD time to 80 %: level {t['level']:.3f}, first reach {t['first_reach']} "
                 f"(per seed {t['per_seed_first_reach']})")
    lines.append(f"OPD modelled cost per update: {res['opd_modelled_cost_per_update']}")
    return "\n".join(lines)


def main(argv: list) -> int:
    """``--out=FILE`` (optional) and ``--help``; exit 2 with one ``error:`` line naming the
    argument on bad input, before anything is read or written (the commands' contract)."""
    out = None
    for a in argv:
        if a in ("--help", "-h", "--helpfull", "--helpshort"):
            print(__doc__)
            return 0
        if a.startswith("--out=") and a.split("=", 1)[1]:
            out = Path(a.split("=", 1)[1])
            if out.is_dir():
                print(f"error: --out={out}: is a folder (give a file)", file=sys.stderr)
                return 2
        else:
            print(f"error: unknown argument {a!r} (usage: --out=FILE)", file=sys.stderr)
            return 2
    res = compute()
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(res, indent=1, sort_keys=True) + "\n")
    print(summary(res))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
