"""``python -m studies.stage2_price_target --out=DIR --policy=P --sample=K [--seeds=16]
[--test_seed0=32] [--learner_seeds=0,1] [--quick]``: for policy sample ``K`` (the folder
``P``, e.g. ``POL/seed_K/critic`` of ``python -m train.policy_samples --out=POL --seeds=K``)
writes ``DIR/learned_seed<K>.json`` (the learners' runs under ``DIR/dual_seed<K>/``, reused
when rerun) and ``DIR/flatness_seed<K>.json``, then ``DIR/summary.json`` over every sample
whose two files are in ``DIR``. ``--report_only``: only the summary, from the records in
``DIR`` (``--out=studies/stage2_price_target/results`` rewrites the committed one). The
measurement (``studies.stage2_price_target``) is at the stage-2 verdict's full size;
``--quick`` its quick size (numbers mean nothing). All traces SYNTHETIC (gsm8k). Exit codes
(``prada_jax.cli``): 2 bad input (one line naming the flag), 3 non-finite training, 1 a bug.
"""
from __future__ import annotations

from pathlib import Path

from absl import flags

from evals import suite
from prada_jax import cli, config_utils
from prada_jax.errors import BadInput
from train import policy_samples
from studies import stage2_price_target as pt


def _define_flags():
    flags.DEFINE_string("out", None, "Folder of the records (learned_seed<K>.json, "
                        "flatness_seed<K>.json, summary.json).")
    flags.DEFINE_string("policy", None, "The policy sample's folder (train.policy_samples).")
    flags.DEFINE_integer("sample", 0, "The policy sample's index K (names its records).")
    flags.DEFINE_integer("seeds", 16, "Validation seeds and fresh test seeds of the grid.")
    flags.DEFINE_integer("test_seed0", 32, "Offset of the first test seed in the test range.")
    flags.DEFINE_string("learner_seeds", "0,1", "Comma-separated learner seeds.")
    flags.DEFINE_bool("quick", False, "The verdict's quick size (numbers mean nothing).")
    flags.DEFINE_bool("report_only", False, "Only summary.json, from the records in --out.")


def main(argv):
    F = flags.FLAGS
    config_utils.reject_extra_argv(argv)
    config_utils.require_flag(F.out, "--out", "a folder for the records")
    out = Path(F.out)
    if not F.report_only:
        if not F.policy or not Path(F.policy).is_dir():
            raise BadInput(f"--policy={F.policy}: no such policy folder")
        if F.sample < 0:
            raise BadInput(f"--sample must be >= 0, got {F.sample}")
        if F.seeds < 2:
            raise BadInput(f"--seeds must be >= 2 (a CI needs two seeds), got {F.seeds}")
        if F.test_seed0 < 0:
            raise BadInput(f"--test_seed0 must be >= 0, got {F.test_seed0}")
        seeds = policy_samples.parse_seeds(F.learner_seeds, "--learner_seeds")
        out = config_utils.check_output_dir(F.out, "--out")   # a file, or under one: refused
        suite.load_policy(F.policy)          # checked (exit 2 naming it) before --out exists
        out.mkdir(parents=True, exist_ok=True)
        size = "quick" if F.quick else "full"
        k = int(F.sample)
        le = pt.learned(F.policy, out / f"dual_seed{k}", seeds, size)
        pt.write_json(out / f"learned_seed{k}.json", le)
        fl = pt.flatness(F.policy, F.seeds, F.test_seed0, size)
        pt.write_json(out / f"flatness_seed{k}.json", fl)
    elif not out.is_dir():
        raise BadInput(f"--out={F.out}: no such folder (--report_only reads its records)")
    records = pt.read_records(out)
    if not records:
        raise BadInput(f"--out={F.out}: no flatness_seed<K>.json with its learned_seed<K>.json")
    pt.write_json(out / "summary.json", pt.summarize(records))
    print(f"wrote {out / 'summary.json'}")


if __name__ == "__main__":
    cli.run(main, define_flags=_define_flags)
