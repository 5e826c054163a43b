"""ReOPD distillation config (``python -m train.distill --config=prada_jax/configs/distill.py``).

Variants (``:a,b`` combines): ``smoke`` (seconds-long CPU run), ``uniform`` (κ = 1),
``late`` (late-step-heavy p ∝ κ^(K-1-t)), ``auto`` (κ = exp(−c̄) from the measured
per-turn teacher–student gap, re-estimated during training), ``exact`` (clipped per-prefix
likelihood-ratio weights instead of κ^t), ``sft`` (cross-entropy on teacher tokens),
``jsd`` (JSD(β) on top-k + tail), ``onpolicy`` (ReOPD as published: student samples,
teacher scores, reverse-KL policy gradient), ``opd`` (online on-policy distillation, the
baseline ReOPD replaces: the student plays whole episodes with the tool, the teacher scores
every student turn, the same reverse-KL loss; ``config.opd``), ``bf16`` (bfloat16 compute),
``kg`` (the knowledge-graph task: its cache ``python -m prada_jax.distill.task.kg_teacher``
writes and its default budget, 400 updates of 64 pairs; ``:kg,sft,uniform`` is plain SFT on
it).
Turn index t counts agent turns from 0. Defaults target the built-in arithmetic task whose
cache ``python -m prada_jax.distill.task.teacher`` writes.
"""
from __future__ import annotations

import ml_collections

from prada_jax import config_utils, parallel



def _loss() -> ml_collections.ConfigDict:
    """``config.loss``: the distillation loss."""
    loss = ml_collections.ConfigDict()
    loss.kind = "fkl"                 # offline: fkl | jsd | sft; on-policy: rkl
    loss.temperature = 1.0            # τ of the top-k losses (student and teacher buckets)
    loss.beta = 0.5                   # β of JSD(β), in (0, 1)
    loss.rkl_coef = 1.0               # coefficient of the reverse-KL policy-gradient term
    loss.fkl_coef = 0.0               # on-policy: + this × top-k forward KL at sampled tokens
    loss.top_k = 8                    # on-policy: teacher top-k scored per sampled token
    loss.rkl_estimator = "pg"         # on-policy / OPD reverse-KL arm: "pg" (single sample, the
    #   published estimator) | "pg_baseline" (+ leave-one-out per-token mean baseline) | "exact"
    #   (Σ_v π_S(v) log π_S(v)/π_T(v) over the vocabulary; needs loss.top_k >= the vocabulary)
    return loss


def _train() -> ml_collections.ConfigDict:
    """``config.train``: run length, batch, dtype, seeds."""
    train = ml_collections.ConfigDict()
    train.steps = 300                 # optimizer updates
    train.batch_size = 64             # (trajectory, turn) pairs per micro-batch
    train.compute_dtype = "float32"   # "float32" | "bfloat16" (params stay float32)
    train.prompt_bucket = 0           # offline / ReOPD: cut each batch's left-padded prompts to
    #   the next multiple of this many tokens above its longest prefix (same numbers within
    #   float tolerance, less compute; one compile per width); 0 = pad to the pool's longest
    train.num_seeds = 1               # N students trained together in one vmapped step, seeds
    #   config.seed + i (i < N); seed i equals a separate run with config.seed + i
    #   (prada_jax/distill/trainer.py); tb/seed_<s>, seed_<s>/student_hf, results.json per_seed
    return train


def _student() -> ml_collections.ConfigDict:
    """``config.student``: the student model (a random init of this shape, or an HF folder)."""
    student = ml_collections.ConfigDict()
    student.init = ""                 # HF folder to start from; "" = random init from below
    student.hidden_size = 64          # D
    student.num_layers = 2
    student.num_heads = 4
    student.num_kv_heads = 2
    student.intermediate_size = 128   # SwiGLU width
    return student


def _optim() -> ml_collections.ConfigDict:
    """``config.optim``: AdamW and its schedule."""
    optim = ml_collections.ConfigDict()
    optim.lr = 3e-3                   # peak AdamW learning rate
    optim.warmup_steps = 30           # linear warm-up [optimizer updates]
    optim.weight_decay = 0.01
    optim.clip_norm = 1.0             # global gradient-norm clip
    optim.grad_accum = 1              # micro-batches per optimizer update
    optim.carry_from = ""             # a finished distill workdir whose final optimiser state
    #   (AdamW moments) this run continues, its student being student.init; the learning-rate
    #   schedule restarts (warm-up included). "" = a fresh optimiser state
    return optim


# Each variant: the dotted fields it sets, in order (``config_utils.apply_variants``).
_VARIANT_FIELDS = {
    "smoke": {"train.steps": 4, "train.batch_size": 8, "log.every": 2, "log.ckpt_every": 2,
              "eval.n_problems": 4, "eval.batch_size": 4,
              "student.hidden_size": 32, "student.num_layers": 1, "student.intermediate_size": 64,
              "optim.warmup_steps": 1, "log.progress": False, "opd.episodes": 4},
    "uniform": {"sampler.kappa": 1.0},
    "late": {"sampler.schedule": "late"},
    "auto": {"sampler.schedule": "auto"},
    "exact": {"sampler.schedule": "exact-ratio"},
    "sft": {"loss.kind": "sft"},
    "jsd": {"loss.kind": "jsd"},
    "onpolicy": {"mode": "onpolicy", "loss.kind": "rkl"},
    "opd": {"mode": "opd", "loss.kind": "rkl"},
    "bf16": {"train.compute_dtype": "bfloat16"},
    # kg_lookup_v1 (5-11 agent turns): 400 x 64 pairs is the budget at which plain SFT
    # (":kg,sft,uniform") lands inside (0, 1) on held-out problems (docs/distill.md); the
    # student and κ = 0.6 stay the method's defaults
    "kg": {"data.cache": "checkpoints/kg_cache/seed0", "train.steps": 400},
}
VARIANTS = tuple(_VARIANT_FIELDS)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.seed = 0                          # student init, batch draws and sampling keys
    c.mode = "offline"                  # "offline" (teacher tokens) | "onpolicy" (ReOPD: student
    #   samples turn t after the replayed teacher prefix) | "opd" (online OPD: student episodes)

    c.data = ml_collections.ConfigDict()
    c.data.cache = "checkpoints/task_cache/seed0"  # folder holding pool/, logits/, teacher/
    c.data.pool_dir = ""                # trajectory pool folder; "" = <cache>/pool
    c.data.logits_dir = ""              # exported teacher logits; "" = <cache>/logits
    c.data.teacher_dir = ""             # HF teacher (on-policy scoring); "" = <cache>/teacher

    c.sampler = ml_collections.ConfigDict()
    c.sampler.kappa = 0.6               # κ in (0, 1]; p(t) ∝ κ^t over a trajectory's turns
    c.sampler.schedule = "kappa"        # "kappa" (early-heavy) | "late" (p ∝ κ^(K-1-t)) |
    #   "auto" (κ = exp(−c̄), c̄ = mean per-turn teacher–student gap on the pool, re-estimated) |
    #   "exact-ratio" (p(t|i) ∝ clipped prefix likelihood ratio br_{i,t}; prada_jax/distill/ratio/)
    c.sampler.refresh_every = 50        # updates between ratio diagnostics (logged as ratio/* in
    #                                     every mode) and adaptive re-estimates; 0 = start and end
    c.sampler.kappa_min = 1e-3          # "auto": floor of κ
    c.sampler.auto_gap_max = 1.0        # "auto": while c̄ > this [nats per turn] the gap is
    #   dominated by turns not learned yet (a random student has c̄ ≈ 20, κ = exp(−c̄) ≈ 0 would
    #   starve every later turn), so the configured sampler.kappa is held; inf = never hold
    c.sampler.ratio_min = 1e-3          # "exact-ratio": br clipped to [ratio_min, ratio_max]
    c.sampler.ratio_max = 10.0

    c.loss = _loss()

    c.onpolicy = ml_collections.ConfigDict()
    c.onpolicy.temperature = 1.0        # student sampling temperature
    c.onpolicy.top_p = 1.0              # nucleus mass
    c.onpolicy.max_new_tokens = 12      # static action length A of a sampled turn [tokens]

    # Online OPD (config.mode = "opd", prada_jax/distill/opd.py); sampling uses c.onpolicy.*
    c.opd = ml_collections.ConfigDict()
    c.opd.episodes = 16                 # student episodes per micro-batch (>= 1); the batch holds
    #                                     episodes × the task's turn cap rows [supervised turns]
    c.opd.context_len = 96              # student context window while playing [tokens]; longer
    #                                     episodes keep their last context_len tokens
    c.opd.tool_latency_s = 0.0          # simulated tool latency per turn round with a call [s]; >= 0

    c.student = _student()

    c.optim = _optim()

    c.train = _train()

    c.log = ml_collections.ConfigDict()
    c.log.every = 25                    # curves every N updates
    c.log.ckpt_every = 100              # orbax checkpoint every N updates
    c.log.keep = 2                      # checkpoints kept
    c.log.progress = True               # tqdm progress bar

    # Data parallelism: sequences of a batch split over a 1-D ``batch`` device mesh, parameters
    # replicated; multi-host start-up flags (prada_jax/parallel.py, docs/BENCHMARKS.md).
    c.mesh = parallel.mesh_config()

    # A gate fixed before training (e.g. a cold-start SFT student for the paper's regime): every
    # gate.every updates the student's task success and mean per-turn gap c̄ to the teacher on
    # the pool (prada_jax/distill/ratio) are checked; the run stops at the first check that
    # passes both. Not reached within train.steps: reported ("gate not reached"), exit 0.
    c.gate = ml_collections.ConfigDict()
    c.gate.every = 0                    # updates between checks; 0 = no gate
    c.gate.success_min = 0.5            # task success on the eval problems >= this [fraction]
    c.gate.gap_max = 0.5                # mean per-turn gap c̄ <= this [nats per turn]

    c.eval = ml_collections.ConfigDict()
    c.eval.n_problems = 256             # task episodes before and after training (0 = skip)
    c.eval.seed = 0                     # problems = make_problems(seed * 1000 + 3)
    c.eval.batch_size = 64              # episodes decoded together
    c.eval.every = 0                    # also evaluate every N updates (results "curve"); 0 = only
    #                                     before and after training
    c.eval.before = True                # evaluate the students before training; False skips it (a
    #                                     continuation whose warm start was evaluated already)

    return config_utils.apply_variants(c, arg, _VARIANT_FIELDS, "prada_jax/configs/distill.py")
