"""Stage-1 PPO screening policy: ``python -m train.ppo --config=prada_jax/configs/ppo.py[:variant]``.

Variants (comma-separated, applied left to right), e.g. ``ppo.py:smoke`` or ``ppo.py:mmlu_stem,true``:

* (none) / ``gsm8k``: the synthetic gsm8k preset, coarse reward, no contention (the per-user
  screening MDP of the paper's stage 1);
* ``gaokao2023en``, ``mmlu_stem``: the other two synthetic presets;
* ``true``: the multi-user ``true`` reward (minus β·(communication + queueing) delay) with
  contention: M servers, B Hz, Poisson arrivals, threshold scheduler fed by the critic's ΔQ;
* ``smoke``: tiny sizes and a 300-problem trace set, two chunks — about a minute on a 2-core
  CPU, most of it compilation;
* ``toy``: the tiny toy env of ``prada_jax.rl.toy_env`` (tests; not trace data);
* ``gymnax``: the standard PPO hyperparameters of PureJaxRL's CartPole-v1 run (4 envs × 128
  steps, 4 epochs × 4 minibatches, lr 2.5e-4 annealed linearly to 0, γ 0.99, entropy 0.01,
  value clipping, a plain V(s) head, 500 000 env steps) for a single-agent env given to
  ``trainer.build_setup(config, (env, params))`` (``envs.single_agent``; README "your own
  env"); ``train.ppo`` itself has no gymnax env.

All numbers from the synthetic presets are synthetic (see ``prada_jax.traces.synthetic``).
"""
from __future__ import annotations

import ml_collections

from prada_jax import config_utils, latency, parallel

from prada_jax.presets import BENCHMARKS as PRESETS  # the one preset list
VARIANTS = PRESETS + ("true", "smoke", "toy", "gymnax")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.seed = 0                      # base seed; seed i of a multi-seed run uses seed + i
    c.num_seeds = 1                 # learner states vmapped in one run, each logged separately

    c.env = ml_collections.ConfigDict()
    c.env.name = "edge"             # "edge" (envs.edge) or "toy" (prada_jax.rl.toy_env)
    c.env.preset = "gsm8k"          # synthetic trace preset (gsm8k, gaokao2023en, mmlu_stem)
    c.env.trace_dir = ""            # a saved trace folder to use instead of the preset
    c.env.trace_seed = 0            # seed of the synthetic trace generator
    c.env.problems = 0              # problems in the synthetic set; 0 = the benchmark's count
    c.env.split = "train"           # part of the set trained on (train / validation / test /
                                    # all; prada_jax.traces.splits); evaluations use test
    c.env.num_users = 8             # U user slots per env
    c.env.reward_mode = "coarse"    # "coarse" (stage 1) or "true"
    c.env.contention = False        # False: per-user MDP (unlimited M and B, no outage,
                                    # every nomination served, freed slots refilled at once)
    c.env.scheduler = "threshold"   # stage-2 scheduler when contention is on
    c.env.num_servers = 4           # M, server jobs at once (contention only)
    c.env.bandwidth_hz = 20e6       # B [Hz] (contention only)
    c.env.arrival_rate_hz = 4.0     # λ [users / s] (contention only)
    c.env.beta = 0.02               # β [PRM units / s], quality-latency trade-off; 0.02 for
                                    # the roofline clock's latency scale by the rule of
                                    # docs/results/load_curve.md (0.2 under the paper clock)
    c.env.tau_s = 0.05              # slot length τ [s]
    c.env.hardware = latency.CONFIG_PAIR  # (edge, server) pair of the clock: A100 + Orin INT4
                                    # (prada_jax.latency.PAIRS or a .json file; docs/latency.md):
                                    # "paper" = the FLOP-only clock, fixed-slot server jobs
    c.env.server_model = "serving"  # server of a roofline pair: "serving" (continuous batching,
                                    # chunked prefill; envs.serving) or "legacy" (before
                                    # issue 41); docs/latency.md
    c.env.pass_gain = True          # nominations carry the critic's ΔQ (EdgeAction)
    c.env.toy_threshold = 0.3       # toy env: nominate pays feat[0] − threshold

    c.net = ml_collections.ConfigDict()
    c.net.hidden = (64, 64)         # MLP widths (tanh) of the actor and critic torsos
    c.net.separate_critic = True    # critic has its own torso
    c.net.critic = "q"              # "q": Q(s, a) head (ΔQ for the scheduler); "v": plain V(s)

    c.ppo = ml_collections.ConfigDict()
    c.ppo.total_env_steps = 16 * 64 * 300   # env slots over the run (summed over envs)
    c.ppo.num_envs = 16             # E envs per seed
    c.ppo.rollout_len = 64          # T slots per update
    c.ppo.num_epochs = 4            # epochs over each rollout
    c.ppo.minibatch_size = 2048     # samples (slot × user) per minibatch; divides E·T·U
    c.ppo.updates_per_chunk = 10    # updates per jitted call
    c.ppo.lr = 1e-3                 # Adam learning rate
    c.ppo.lr_schedule = "linear"    # constant | linear | cosine (to final_lr_frac · lr)
    c.ppo.final_lr_frac = 0.1
    c.ppo.max_grad_norm = 0.5       # global gradient-norm clip
    c.ppo.adam_eps = 1e-5
    c.ppo.gamma = 1.0               # discount per decision (coarse rewards telescope)
    c.ppo.gae_lambda = 0.95
    c.ppo.clip_eps = 0.2
    c.ppo.vf_coef = 0.5
    c.ppo.ent_coef = 0.003
    c.ppo.clip_value = False        # clip Q(s,a) updates to old ± value_clip_eps
    c.ppo.value_clip_eps = 0.2      # reward units
    c.ppo.normalize_adv = True
    c.ppo.diagnostics = True        # log approx_kl, clip_frac, explained_variance,
                                    # nominate_rate, mean_gain (False: the same training
                                    # without them, a little faster)
    # Epochs over the decision samples only (compacted into a buffer): None = decided by the
    # env (on where it declares sparse_decisions, as the edge env does; off for any other env,
    # which then trains on every sample); True / False force it.
    c.ppo.decision_only = ml_collections.config_dict.placeholder(bool)
    c.ppo.decision_capacity = 0.25  # compacted buffer, fraction of E·T·U (the edge env decides
                                    # in 20-24% of them); a rollout with more decisions than
                                    # this stops the run (exit 2) naming this field

    c.log = ml_collections.ConfigDict()
    c.log.checkpoint_every = 50     # updates between checkpoints (multiple of updates_per_chunk)
    c.log.keep_checkpoints = 3      # newest checkpoints kept
    c.log.progress = True           # tqdm progress bar on stderr

    # Data parallelism: environments split over the devices of a 1-D ``batch`` mesh, parameters
    # replicated; multi-host start-up flags (see prada_jax/parallel.py and docs/BENCHMARKS.md).
    c.mesh = parallel.mesh_config()

    for variant in config_utils.parse_variants(arg, VARIANTS, "prada_jax/configs/ppo.py"):
        if variant in PRESETS:
            c.env.preset = variant
        elif variant == "true":
            c.env.reward_mode = "true"
            c.env.contention = True
            c.env.num_users = 16
        elif variant == "smoke":
            c.env.problems = 300
            c.env.num_users = 4
            c.net.hidden = (32, 32)
            c.ppo.num_envs = 4
            c.ppo.rollout_len = 16
            c.ppo.num_epochs = 2
            c.ppo.minibatch_size = 64
            c.ppo.updates_per_chunk = 2
            c.ppo.total_env_steps = 4 * 16 * 4      # 4 updates = 2 chunks
            c.ppo.decision_capacity = 0.375  # 256-sample batches: ~20% decisions ± noise
            c.log.checkpoint_every = 2
            c.log.progress = False
        elif variant == "toy":
            c.env.name = "toy"
            c.env.num_users = 4
            c.net.hidden = (32, 32)
            c.ppo.num_envs = 4
            c.ppo.rollout_len = 8
            c.ppo.num_epochs = 2
            c.ppo.minibatch_size = 32
            c.ppo.updates_per_chunk = 2
            c.ppo.total_env_steps = 4 * 8 * 4
            c.ppo.lr = 3e-3
            c.ppo.decision_capacity = 0.9   # the toy env decides in ~60% of user slots
            c.log.checkpoint_every = 2
            c.log.progress = False
        elif variant == "gymnax":
            c.env.num_users = 1
            c.net.hidden = (64, 64)
            c.net.separate_critic = True
            c.net.critic = "v"
            c.ppo.num_envs = 4
            c.ppo.rollout_len = 128
            c.ppo.num_epochs = 4
            c.ppo.minibatch_size = 128      # 4 minibatches of the 512-sample batch
            c.ppo.updates_per_chunk = 61
            c.ppo.total_env_steps = 512 * 61 * 16   # 976 updates ≈ 5e5 env steps
            c.ppo.lr = 2.5e-4
            c.ppo.lr_schedule = "linear"
            c.ppo.final_lr_frac = 0.0
            c.ppo.gamma = 0.99
            c.ppo.ent_coef = 0.01
            c.ppo.clip_value = True
            c.ppo.value_clip_eps = 0.2
            c.log.checkpoint_every = 61
    return c
