"""Capacity per server GPU under an SLO (issue 42; registration: studies/capacity/README.md),
SYNTHETIC gsm8k.

    python -m studies.capacity --out=DIR [--pairs=a100_orin_int4,...] [--size=study]
    python -m studies.capacity --out=DIR --size=quick          # tiny end-to-end run (a test)

The measurement and analysis are ``evals.capacity`` (``evals.capacity.study.run_study``); this
command runs them at the registered size. Parts, in order, each written at once and reused on
a rerun with the same sizes:

* ``DIR/policies/seed_<k>/``: the screening-policy samples (``train.policy_samples``);
* per pair, ``DIR/<pair>/reference.json``: the LLM alone at the lightest rate on validation
  (the SLO's latency reference); ``prices.json``: λ_s fitted per rate and sample on
  validation; ``test.json``: every row at every rate on test, per seed; ``test_pool.json``:
  the LLM alone's exact test-pool accuracy (from the traces: the accuracy reference);
  ``bisect.json``: each row's capacity by bisection on the rate to 5 %, every probe's
  per-seed records;
* ``DIR/study.json``, ``DIR/report.md`` (both SLO anchors: the registered validation one and
  deviation 2's same-split one), ``DIR/capacity_slo_<anchor>.png`` (capacity against the SLO
  sweep), ``DIR/curve_<pair>.png`` (the objective curve).

Bad input (an unknown pair or size, a folder that is a file, two pairs that would share a
folder, a ``--report_only`` part file without its ``data``): one stderr line, exit 2, nothing
written.
"""
from __future__ import annotations

from absl import flags

from prada_jax import cli, config_utils
from prada_jax.errors import BadInput
from studies import _shared
from train import capacity_study as capacity

DEFAULT_PAIRS = ("a100_orin_int4", "a100_phone_int4", "h100_orin_int4")


def _define_flags():
    flags.DEFINE_string("out", None, "study folder (policies, per-pair JSON, report)")
    flags.DEFINE_list("pairs", list(DEFAULT_PAIRS), "hardware pairs (prada_jax.latency.PAIRS)")
    flags.DEFINE_enum("size", "study", sorted(capacity.SIZES), "sizes: study (registered), "
                      "demo (make demo: 1 policy sample, 4 seeds, coarser grid), quick (tests)")
    flags.DEFINE_bool("report_only", False, "only the analysis, report and plots, from the "
                      "per-pair JSON already under --out (e.g. the committed results/)")


def main(argv):
    F = flags.FLAGS
    config_utils.reject_extra_argv(argv)
    pairs, out = _shared.pairs_and_out(F.pairs, F.out, "capacity")
    folders = capacity.pair_folders(out, pairs)   # two pairs sharing a folder: exit 2 here
    if F.report_only:
        missing = [f"{folders[p].name}/{k}.json" for p in pairs for k in capacity.PARTS
                   if not (folders[p] / f"{k}.json").is_file()]
        if missing:
            raise BadInput(f"--report_only: {out} lacks {', '.join(missing)}")
        res = capacity.report_only(out, pairs, F.size)
    else:
        res = capacity.run_study(out, pairs, F.size)
    print(res["report"] + "\n[synthetic traces]")
    print(f"report: {out / 'report.md'}; plots: {out}/capacity_slo_*.png")


if __name__ == "__main__":
    cli.run(main, define_flags=_define_flags)
