"""ReOPD with prefixes replayed from the target teacher itself vs from a stronger generator, at
a fixed target: the pre-registered study of studies/reopd_prefix_source/README.md (issue 24),
SYNTHETIC.

    python -m studies.reopd_prefix_source --teacher_cache=T/seed0 --generator_cache=G/seed0 \\
        --out=DIR [--updates=50] [--cold_updates=600] [--seeds=0-9]
    python -m studies.reopd_prefix_source --quick --out=DIR   # tiny end-to-end run (a test)

``--teacher_cache`` and ``--generator_cache`` are task caches (``pool/``, ``logits/``,
``teacher/``; e.g. ``python -m prada_jax.distill.task.kg_teacher --cache=C`` then
``C/seed0``) of the same task; the teacher cache's ``teacher/`` is the distillation target T in
both arms. Stages (each ``train.distill`` run in ``<out>/<name>``; a rerun reuses finished runs):

1. T's top-k logits exported on G's pool (``<out>/logits_T_on_G``), so the per-turn gap
   diagnostic of the generator arm is measured against T;
2. T and G evaluated greedily on the verdict problems (strength of the generators);
3. the cold start: plain SFT on T's pool (one seed) for ``--cold_updates`` updates;
4. from it, one vmapped run per arm over the seeds: ReOPD (``mode = onpolicy``, κ, lr, batch
   fixed in :class:`Sizes`) with prefixes from T's pool (``teacher_prefix``) and from G's pool
   (``generator_prefix``), T scoring both.

Writes ``<out>/result.json`` (settings, strengths, cold start, per-seed success and gap of each
arm, the paired difference teacher − generator with its 95 % Student-t CI, MDE and verdict) and
``<out>/report.md``. Bad input (a missing cache folder, zero updates, bad seeds): one line,
exit 2, nothing written. The report rules reuse ``studies.reopd_vs_opd`` (import only).
"""
from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import numpy as np
from absl import flags

from prada_jax.distill import pool as pool_lib
from prada_jax.distill.task import arith
from prada_jax.distill.task.export_local import export_logits
from prada_jax.distill.task.teacher import model_config, tiny_cache
from prada_jax.errors import BadInput
from prada_jax.jsonio import read_json, write_json
from prada_jax.stats import mde_of_differences, mean_ci
from studies import _shared
from studies import reopd_vs_opd as rvo
from studies.reopd_vs_opd import report as rvo_report
from studies._shared import fmt as _f

ARMS = ("teacher_prefix", "generator_prefix")


@dataclasses.dataclass
class Sizes:
    """Every size of the study (``FULL`` = the pre-registered one; ``QUICK`` for the test)."""

    seeds: tuple = tuple(range(10))
    updates: int = 50              # N: ReOPD updates per arm
    batch: int = 64                # (trajectory, turn) pairs per update
    kappa: float = 0.6
    lr: float = 3e-4
    warmup: int = 5
    cold_updates: int = 600        # SFT updates of the cold start (seed 0)
    cold_batch: int = 64
    n_eval: int = 256              # verdict problems (greedy, with the tool)
    eval_seed: int = 1
    variant: str = "kg"            # config variant prefix of the task
    top_k: int = 8                 # T's exported logits on G's pool
    student: dict = dataclasses.field(default_factory=dict)   # config.student overrides


FULL = Sizes()
QUICK = Sizes(seeds=(0, 1), updates=2, batch=4, cold_updates=2, cold_batch=4, n_eval=4,
              variant="", top_k=4,
              student=dict(hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1,
                           intermediate_size=32))


def _vs_sizes(s: Sizes):
    """The ``studies.reopd_vs_opd`` sizes its config helper reads (n_eval, student)."""
    return dataclasses.replace(rvo.FULL, n_eval=s.n_eval, student=dict(s.student))


def _variant(s: Sizes, v: str) -> str:
    return ",".join(x for x in (s.variant, v) if x)


def _gap_start(res: dict) -> list:
    return [(r["ratio"][0].get("mean_gap") if r.get("ratio") else None)
            for r in rvo._per_seed(res)]


def _teacher_eval(cache: Path) -> dict | None:
    """Success rates of the cache's own evaluation (``teacher_eval.json``), if it has one."""
    f = cache / "teacher_eval.json"
    if not f.is_file():
        return None
    ev = read_json(f)
    return {k: (ev[k]["success_rate"] if isinstance(ev.get(k), dict) else ev.get(k))
            for k in ("temperature", "sampled", "greedy")}


def _arm_config(tcache: Path, s: Sizes, init: str, pool_dir: Path, logits_dir: Path):
    """One arm's ``train.distill`` config: ReOPD from ``init``, prefixes from ``pool_dir``, T
    the target (``data.teacher_dir``) in every arm."""
    return rvo._config(tcache, _variant(s, "onpolicy"), _vs_sizes(s), s.updates, s.seeds,
                       s.eval_seed, **{"student.init": init, "train.batch_size": s.batch,
                                       "optim.lr": s.lr, "optim.warmup_steps": s.warmup,
                                       "sampler.kappa": s.kappa,
                                       "data.teacher_dir": str(tcache / "teacher"),
                                       "data.pool_dir": str(pool_dir),
                                       "data.logits_dir": str(logits_dir)})


def teacher_stages(study, tcache: Path, out: Path, s: Sizes) -> tuple[dict, dict]:
    """The stages that need only T's cache: the cold start (SFT on T's pool, seed 0) and the
    ``teacher_prefix`` arm; returns (cold start, that arm's results). Reused when finished, so
    they may run while G's cache is still being built."""
    c = rvo._config(tcache, _variant(s, "sft,uniform"), _vs_sizes(s), s.cold_updates, (0,),
                    s.eval_seed, **{"train.batch_size": s.cold_batch})
    study.train("cold", c)
    hf = out / "cold" / "student_hf"
    ev = study.evaluate_dir(hf, s.eval_seed)
    cold = {"updates": s.cold_updates, "success": ev["success_rate"], "ci95": ev.get("ci95"),
            "student": str(hf)}
    study.say(f"cold start: success {ev['success_rate']:.3f} on the verdict problems")
    res = study.train("teacher_prefix", _arm_config(tcache, s, str(hf), tcache / "pool",
                                                    tcache / "logits"))
    return cold, res


def run(tcache: Path, gcache: Path, out: Path, s: Sizes) -> dict:
    """The whole study; returns (and writes) the result dict."""
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    study = rvo.Study(tcache, out, _vs_sizes(s))   # T's pool, task and in-process T scorer
    lg = out / "logits_T_on_G"
    export_logits(tcache / "teacher", gcache / "pool", lg, s.top_k)
    study.say(f"T's top-{s.top_k} logits on G's pool: {lg}")
    strength = {}
    for name, c in (("T", tcache), ("G", gcache)):
        p = pool_lib.load_pool(c / "pool")
        pool = {"trajectories": int(len(p.success)), "success": float(np.mean(p.success)),
                "agent_turns": int(np.asarray(p.turn_offsets)[-1])}
        ev = study.evaluate_dir(c / "teacher", s.eval_seed)
        strength[name] = {"greedy_verdict_problems": ev["success_rate"], "ci95": ev.get("ci95"),
                          "cache_eval": _teacher_eval(c), "pool": pool}
        study.say(f"{name}: greedy success on the verdict problems {ev['success_rate']:.3f}; "
                  f"cache eval {strength[name]['cache_eval']}; pool {pool}")
    cold, res_t = teacher_stages(study, tcache, out, s)
    res_g = study.train("generator_prefix", _arm_config(tcache, s, cold["student"],
                                                        gcache / "pool", lg))
    runs = {"teacher_prefix": rvo._summary(res_t), "generator_prefix": rvo._summary(res_g)}
    gaps0 = {"teacher_prefix": _gap_start(res_t), "generator_prefix": _gap_start(res_g)}
    for arm in ARMS:
        study.say(f"{arm}: mean success {float(np.mean(runs[arm]['success'])):.4f}")
    d = rvo.paired(runs, "teacher_prefix", "generator_prefix")
    diffs = [a - b for a, b in zip(runs["teacher_prefix"]["success"],
                                   runs["generator_prefix"]["success"])]
    verdict = {**d, "diffs": diffs, "mde": mde_of_differences(diffs),
               "verdict": rvo.superior(d)}
    res = {"synthetic": True, "task": study.task.name, "teacher_cache": str(tcache),
           "generator_cache": str(gcache), "sizes": dataclasses.asdict(s),
           "strength": strength, "headroom": strength["T"]["greedy_verdict_problems"]
           - cold["success"], "cold": cold, "runs": runs, "gap_start": gaps0,
           "verdict": verdict, "log": study.log, "wall_s": time.perf_counter() - t0}
    write_json(out / "result.json", res, indent=1, newline=False)
    (out / "report.md").write_text(markdown(res))
    return res


def markdown(res: dict) -> str:
    st, v = res["strength"], res["verdict"]
    L = ["| generator | greedy, verdict problems | sampled (τ) / greedy, cache eval | pool "
         "success | pool agent turns |", "|---|---|---|---|---|"]
    for k in ("T", "G"):
        ce = st[k]["cache_eval"] or {}
        L.append(f"| {k} | {_f(st[k]['greedy_verdict_problems'])} | "
                 f"{_f(ce.get('sampled'))} (τ = {ce.get('temperature')}) / "
                 f"{_f(ce.get('greedy'))} | {_f(st[k]['pool']['success'])} | "
                 f"{st[k]['pool']['agent_turns']} |")
    L += ["", f"Cold start (SFT on T's pool, {res['cold']['updates']} updates): success "
          f"{_f(res['cold']['success'])}; headroom to T's greedy {_f(res['headroom'])}.", "",
          "| arm | success (mean ± 95% CI) | c̄ to T at the start | c̄ at the end | "
          "supervised turns / seed | tool calls |", "|---|---|---|---|---|---|"]
    for arm in ARMS:
        r = res["runs"][arm]
        L.append(f"| {arm} | {mean_ci(r['success']).fmt()} | "
                 f"{_shared.mean_cell(res['gap_start'][arm])} | "
                 f"{rvo_report.run_cells(r, len(r['seeds']))} |")
    L += ["", "| rule | teacher − generator [95% CI] | MDE | verdict |", "|---|---|---|---|",
          f"| teacher prefixes ≥ generator prefixes | {rvo_report.paired_cell(v)} | {_f(v['mde'])} | "
          f"**{v['verdict']}** |", ""]
    return "\n".join(L)


def _tiny_generator(root: Path) -> Path:
    """A second tiny synthetic arithmetic cache whose pool holds other problems' reference
    episodes (``make_problems(6, 12)``) under a different random teacher (torch seed 1)."""
    import torch  # lazy: torch is the [torch] extra (the teacher's framework)
    from transformers import Qwen2ForCausalLM  # lazy: a torch model class (the [torch] extra)
    torch.manual_seed(1)
    Qwen2ForCausalLM(model_config(16, 1, 2, 1, 32)).save_pretrained(root / "teacher")
    arith.build_tokenizer().save_pretrained(root / "teacher")
    trajs, spans = zip(*(arith.messages_to_tokens(arith.solved_messages(p))
                         for p in arith.make_problems(6, 12)))
    pool_lib.save_pool(pool_lib.build_arrays(trajs, spans, [1] * 12), root / "pool",
                       {"task": arith.TASK_NAME, "synthetic": True,
                        "tokenizer": pool_lib.tokenizer_meta(arith.build_tokenizer())})
    export_logits(root / "teacher", root / "pool", root / "logits", top_k=4)
    return root


def _define(fv) -> None:
    flags.DEFINE_string("teacher_cache", "", "target teacher T's cache (pool/, logits/, "
                        "teacher/)", flag_values=fv)
    flags.DEFINE_string("generator_cache", "", "generator G's cache of the same task",
                        flag_values=fv)
    flags.DEFINE_string("out", "", "study folder (runs, result.json, report.md)",
                        flag_values=fv)
    flags.DEFINE_boolean("quick", False, "tiny sizes on tiny synthetic caches built under "
                         "--out (an end-to-end test)", flag_values=fv)
    flags.DEFINE_integer("updates", FULL.updates, "N: ReOPD updates per arm", flag_values=fv)
    flags.DEFINE_integer("cold_updates", FULL.cold_updates, "SFT updates of the cold start",
                         flag_values=fv)
    flags.DEFINE_string("seeds", "0-9", "paired seeds 'a-b' (consecutive)", flag_values=fv)


def main(argv=None) -> int:
    """``argv``: absl flags; None = the command line. Bad input raises ``BadInput``."""
    a = _shared.parse(_define, argv, "studies.reopd_prefix_source", __doc__)
    _shared.at_least_one(a, "updates", "cold_updates")
    seeds = _shared.seed_range(a.seeds, "seeds")
    if len(seeds) < 2:
        raise BadInput(f"--seeds: need at least 2 paired seeds for a CI, got {a.seeds!r}")
    out = Path(a.out)
    if a.quick:
        if a.teacher_cache or a.generator_cache:
            raise BadInput("--teacher_cache/--generator_cache: not with --quick (it builds "
                           "its own tiny caches)")
        sizes = QUICK
        tcache, gcache = out / "cache_T", out / "cache_G"
        out.mkdir(parents=True, exist_ok=True)
        if not (tcache / "pool").is_dir():
            tiny_cache(tcache, 12)
        if not (gcache / "pool").is_dir():
            _tiny_generator(gcache)
    else:
        tcache, gcache = Path(a.teacher_cache), Path(a.generator_cache)
        for flag, raw, cache in (("teacher_cache", a.teacher_cache, tcache),
                                 ("generator_cache", a.generator_cache, gcache)):
            if not raw:
                raise BadInput(f"--{flag}: required")
            _shared.check_cache(cache, flag, hint="prada_jax.distill.task.kg_teacher")
        sizes = dataclasses.replace(FULL, updates=a.updates, cold_updates=a.cold_updates,
                                    seeds=seeds)
    res = run(tcache, gcache, out, sizes)
    print((out / "report.md").read_text())
    print(f"study wall time {res['wall_s']:.0f} s; {out / 'result.json'}")
    return 0

