"""Descriptive check of the kg study (studies/reopd_kg/README.md, after the verdicts; not
registered): greedy vs sampled (τ = 1) success of the cold start and of seeds 0–3 of OPD, ReOPD
κ 0.6 and SFT on the 512 verdict problems. SYNTHETIC.

    python studies/reopd_kg/checks/greedy_vs_sampled.py STUDY_DIR OUT_JSON
"""
import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from prada_jax.distill.task import kg
from prada_jax.lm.hf import load_hf
probs = kg.make_problems(1003, 256) + kg.make_problems(5003, 256)
def ev(d, temp, key=0):
    m, _ = load_hf(d, dtype=jnp.float32, param_dtype=jnp.float32)
    fn = kg.flax_generate_fn(m, batch=64, temperature=temp, key=jax.random.key(key) if temp else None)
    return float(np.mean([r.success for r in kg.run_episodes(probs, fn, kg.MAX_TURNS)]))
out = {}
if len(sys.argv) != 3 or not Path(sys.argv[1], "cold", "student_hf").is_dir():
    sys.exit(print("usage: greedy_vs_sampled.py STUDY_DIR OUT_JSON (STUDY_DIR: a kg study "
                   "folder with cold/student_hf)", file=sys.stderr) or 2)
S, OUT = sys.argv[1], sys.argv[2]
studs = {"cold": f"{S}/cold/student_hf"}
for n in ("opd", "reopd_k0.6", "sft_cont"):
    for s in range(4):
        studs[f"{n}/{s}"] = f"{S}/compare/{n}/seed_{s}/student_hf"
for k, d in studs.items():
    out[k] = {"greedy": ev(d, 0.0), "sampled": [ev(d, 1.0, j) for j in range(2)]}
    print(k, out[k], flush=True)
json.dump(out, open(OUT, "w"), indent=1)
