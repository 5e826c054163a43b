"""PRADA's frontier (issue 52; registration: studies/frontier/README.md), SYNTHETIC gsm8k.

    python -m studies.frontier --out=DIR [--pairs=a100_orin_int4,...] [--size=study]
        [--policies=checkpoints/policies]
    python -m studies.frontier --out=studies/frontier/results --report_only
    python -m studies.frontier --out=DIR --size=demo --pairs=a100_orin_int4   # make demo
    python -m studies.frontier --out=DIR --size=quick          # seconds-scale run (tests)

``--policies=ROOT``: the policy samples of each pair are ``ROOT/<pair>/seed_<k>/critic``
(``python -m train.policy_samples --out=ROOT/<pair> --seeds=0,1,2 --hardware=<pair>``); a
missing one is trained the same way, one trained under another pair's clock is refused.
Default ROOT: ``DIR/policies``. The parts (``studies.frontier``'s docstring) are written under
``DIR/<pair>/`` as they are measured and reused by a rerun with the same key (resumable after
``kill -9``); ``--report_only`` writes ``DIR/report.md``, ``DIR/study.json`` and
``DIR/frontier_<pair>.png`` from them alone.

Bad input (an unknown pair or size, ``--pairs=paper``, an empty list, a folder that is a file,
two pairs sharing a folder, ``--report_only`` without the required parts or on a file that is
not one): one stderr line, exit 2, nothing written.
"""
from __future__ import annotations

from pathlib import Path

from absl import flags

from prada_jax import cli, config_utils
from prada_jax.errors import BadInput
from studies import _shared
import studies.frontier as frontier


def _define_flags():
    flags.DEFINE_string("out", None, "study folder (per-pair JSON parts, report, plots)")
    flags.DEFINE_list("pairs", list(frontier.PAIRS), "hardware pairs (prada_jax.latency.PAIRS)")
    flags.DEFINE_enum("size", "study", sorted(frontier.SIZES), "study (registered), demo "
                      "(make demo: 1 policy sample, 4 seeds, a few knobs; no verdict) or quick "
                      "(tests)")
    flags.DEFINE_string("policies", None, "ROOT of the policy samples: ROOT/<pair>/seed_<k>/"
                        "critic (default: <out>/policies; missing samples are trained)")
    flags.DEFINE_bool("report_only", False, "only the analysis, report and plots, from the "
                      "per-pair JSON already under --out (e.g. the committed results/)")


def main(argv):
    F = flags.FLAGS
    config_utils.reject_extra_argv(argv)
    pairs, out = _shared.pairs_and_out(F.pairs, F.out, "frontier")
    if F.policies is not None and Path(F.policies).exists() and not Path(F.policies).is_dir():
        raise BadInput(f"--policies={F.policies} exists and is not a folder")
    frontier.pair_folders(out, pairs)   # two pairs sharing a folder: exit 2 here
    if F.report_only:
        frontier.load_parts(out, pairs)  # missing or foreign parts: exit 2 before writing
        res = frontier.write_report(out, pairs, F.size)
    else:
        res = frontier.run_study(out, pairs, F.size, F.policies)
    print(res["report"] + "\n[synthetic traces]")
    print(f"report: {out / 'report.md'}; plots: {out}/frontier_*.png")


if __name__ == "__main__":
    cli.run(main, define_flags=_define_flags)
