"""The ``build`` subcommand: its flags and its exit codes."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from prada_jax.traces import answers as answers_lib
from prada_jax.traces import datasets as datasets_lib
from prada_jax.traces.builder.pipeline import build
from prada_jax.traces.builder.settings import DEFAULT_SYSTEM_PROMPT, STATS_FEATURES, BuildError
from prada_jax.traces.builder.staging import STAGING

__all__ = ["add_arguments", "run", "EXIT_BAD_INPUT", "EXIT_INTERRUPTED"]

EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Registers the flags of the ``build`` subcommand on ``parser``."""
    g = parser.add_argument_group("models and data")
    g.add_argument("--slm", required=True, help="local HF folder of the edge SLM (drafts)")
    g.add_argument("--llm", required=True, help="local HF folder of the server LLM")
    g.add_argument("--prm", required=True, help="local HF folder of the PRM (+ prm_config.json)")
    g.add_argument("--prm-style", choices=("value-head", "step-tag"), default=None,
                   help="PRM kind; default: the 'style' in the PRM's prm_config.json")
    g.add_argument("--data", required=True, help="benchmark JSONL file (see docs/build_traces.md)")
    g.add_argument("--benchmark", required=True, choices=datasets_lib.BENCHMARKS)
    g.add_argument("--out", required=True, help="output trace folder (staging inside it)")
    g.add_argument("--limit", type=int, default=None, help="first N problems only")
    g.add_argument("--role-notes", default=None,
                   help='JSON object {"slm"|"llm"|"prm": text}: how a model fills a role it '
                        'was not made for (e.g. one real model standing in for the LLM and '
                        'the PRM); stored in meta.json under "roles"')
    t = parser.add_argument_group("tree")
    t.add_argument("--node-budget", type=int, default=24, help="nodes per problem (>= 1)")
    t.add_argument("--full-depth", type=int, default=2,
                   help="expand every node up to this depth before budgeted expansion")
    t.add_argument("--max-steps", type=int, default=16,
                   help="steps per solution; candidates at this step are terminal")
    t.add_argument("--behaviour", choices=("prm", "const"), default="prm",
                   help="behaviour policy that orders expansion beyond --full-depth")
    t.add_argument("--behaviour-llm-prob", type=float, default=0.3,
                   help="const policy: probability of taking the LLM step")
    t.add_argument("--behaviour-threshold", type=float, default=0.7,
                   help="prm policy: PRM score of the draft at which P(LLM) = 1/2")
    t.add_argument("--behaviour-temp", type=float, default=0.1, help="prm policy: temperature")
    t.add_argument("--behaviour-eps", type=float, default=0.05,
                   help="prm policy: P(LLM) stays in [eps, 1 - eps]")
    s = parser.add_argument_group("generation")
    s.add_argument("--step-delimiter", default="\n\n",
                   help="text that ends a step (escapes like \\n are decoded)")
    s.add_argument("--max-step-tokens", type=int, default=256, help="tokens per step at most")
    s.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    s.add_argument("--system-prompt", default=DEFAULT_SYSTEM_PROMPT)
    s.add_argument("--feature-dim", type=int, default=16,
                   help=f"F: projected hidden dims + {len(STATS_FEATURES)} statistics")
    s.add_argument("--seed", type=int, default=0, help="projection and sampling seed")
    r = parser.add_argument_group("runtime")
    r.add_argument("--batch-size", type=int, default=8, help="problems per batch (staging unit)")
    r.add_argument("--prm-batch-size", type=int, default=16, help="sequences per PRM pass")
    r.add_argument("--device", default=None, help="cuda | cpu (default: cuda if available)")
    r.add_argument("--dtype", choices=("bf16", "fp32", "fp16"), default=None,
                   help="model dtype (default: bf16 on cuda, fp32 on cpu)")
    r.add_argument("--check-timeout", type=float, default=answers_lib.DEFAULT_TIMEOUT_S,
                   help="seconds per answer check")
    r.add_argument("--max-batches", type=int, default=None,
                   help="stop after this many new batches (rerun to continue)")
    r.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: torch's choice; 1 is fastest for tiny "
                        "models on a busy machine)")
    r.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    """Runs the ``build`` subcommand; returns the exit code (0 ok, 2 bad input, 130 Ctrl-C)."""
    try:
        meta = build(args)
    except BuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print(f"\ninterrupted: finished batches are kept in {Path(args.out) / STAGING}; rerun "
              "the same command to continue", file=sys.stderr)
        return EXIT_INTERRUPTED
    if meta.get("incomplete"):
        print(f"stopped after --max-batches; {meta['batches_left']} batch(es) left; rerun to "
              "continue", file=sys.stderr)
        return 0
    gen = meta["generator"]
    print(f"wrote {args.out}: {meta['counts']['problems']} problems, {meta['counts']['nodes']} "
          f"nodes, max depth {meta['max_depth']}, {gen['completion_nodes']} completion nodes, "
          f"{gen['nodes_with_fallback']} nodes with a fallback, build time "
          f"{gen['build_seconds']:.1f} s")
    return 0
