"""Issue 33 item 4, per policy sample: the capacity-clearing price (``learned_seed<k>.json``,
mean over learner seeds), the grid point λ_c nearest to it, the validation argmax λ_v
(``flatness_seed<k>.json``), and on the fresh test seeds the paired objective difference
obj(λ_v) − obj(λ_c) with its 95 % t interval: does the grid's preference for another price
hold on seeds it was not chosen on?

Usage: python summarize.py DIR [OUT_JSON]   (DIR holds the per-policy JSON files)
"""
import json
import sys
from pathlib import Path

import numpy as np

from prada_jax.stats import hierarchical as hier
from prada_jax import stats

d = Path(sys.argv[1])
rows, diffs = [], []
for f in sorted(d.glob("flatness_seed*.json")):
    k = f.stem.removeprefix("flatness_seed")
    lf = d / f"learned_seed{k}.json"
    if not lf.is_file():
        continue
    fl, le = json.loads(f.read_text()), json.loads(lf.read_text())
    clear = [v["lambda_s"] for v in le["learned"].values()]
    lams = [float(x) for x in fl["sets"]["validation"]["rows"]]
    lam_c = min(lams, key=lambda x: abs(x - np.mean(clear)))
    val = {float(x): np.mean(r["per_seed"]) for x, r in fl["sets"]["validation"]["rows"].items()}
    lam_v = max(val, key=val.get)
    test = {float(x): np.asarray(r["per_seed"]) for x, r in fl["sets"]["test"]["rows"].items()}
    lam_t = max(test, key=lambda x: test[x].mean())
    ci = stats.mean_ci(test[lam_v] - test[lam_c], 0.95)
    row = {"policy_sample": int(k), "clearing_lambda_s": clear, "lambda_c": lam_c,
           "validation_argmax": lam_v, "test_argmax": lam_t,
           "test_vchosen_minus_clearing": {"mean": ci.mean, "lo": ci.low, "hi": ci.high,
                                           "n": ci.n},
           "validation_vchosen_minus_clearing": float(val[lam_v] - val[lam_c])}
    rows.append(row)
    diffs.append(test[lam_v] - test[lam_c])
    print(f"policy {k}: clearing λ_s {', '.join(f'{c:.3f}' for c in clear)} (grid {lam_c}); "
          f"validation argmax {lam_v} (+{row['validation_vchosen_minus_clearing']:.4f}); "
          f"test argmax {lam_t}; test obj(λ_v) − obj(λ_c) = {ci.mean:+.4f} "
          f"[{ci.low:+.4f}, {ci.high:+.4f}]")
pooled = None
if len(diffs) >= 2 and len({len(x) for x in diffs}) == 1:
    # policies × 1 (the grid rows have no learner) × test seeds: prada_jax.stats.hierarchical's interval
    pooled = hier.interval(np.asarray(diffs)[:, None, :], resamples=10000, seed=0)
    print(f"pooled over {len(diffs)} policy samples: {pooled['mean']:+.4f} "
          f"[{pooled['lo']:+.4f}, {pooled['hi']:+.4f}] (bootstrap "
          f"[{pooled['bootstrap']['lo']:+.4f}, {pooled['bootstrap']['hi']:+.4f}], cluster t [{pooled['cluster_t']['lo']:+.4f}, "
          f"{pooled['cluster_t']['hi']:+.4f}])")
if len(sys.argv) > 2:
    json.dump({"synthetic": True, "scenario": "slow_server", "rows": rows,
               "pooled_test_vchosen_minus_clearing": pooled}, open(sys.argv[2], "w"), indent=1)
