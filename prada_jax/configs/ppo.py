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
  ``trainer.build_setup(config, (env, params))`` (``prada_jax.rl.single_agent``; README "your own
  env"); ``train.ppo`` itself has no gymnax env.

All numbers from the synthetic presets are synthetic (see ``prada_jax.traces.synthetic``).
"""
from __future__ import annotations

import ml_collections

from prada_jax import config_utils, latency, parallel

from prada_jax.presets import BENCHMARKS as PRESETS  # the one preset list


def _env() -> ml_collections.ConfigDict:
    """``config.env``: the trace set, the env's sizes, reward and clock."""
    env = ml_collections.ConfigDict()
    env.name = "edge"             # "edge" (envs.edge) or "toy" (prada_jax.rl.toy_env)
    env.preset = "gsm8k"          # synthetic trace preset (gsm8k, gaokao2023en, mmlu_stem)
    env.trace_dir = ""            # a saved trace folder to use instead of the preset
    env.trace_seed = 0            # seed of the synthetic trace generator
    env.problems = 0              # problems in the synthetic set; 0 = the benchmark's count
    env.split = "train"           # part of the set trained on (train / validation / test /
                                  # all; prada_jax.traces.splits); evaluations use test
    env.num_users = 8             # U user slots per env
    env.reward_mode = "coarse"    # "coarse" (stage 1) or "true"
    env.contention = False        # False: per-user MDP (unlimited M and B, no outage,
                                  # every nomination served, freed slots refilled at once)
    env.scheduler = "threshold"   # stage-2 scheduler when contention is on
    env.num_servers = 4           # M, server jobs at once (contention only)
    env.bandwidth_hz = 20e6       # B [Hz] (contention only)
    env.arrival_rate_hz = 4.0     # λ [users / s] (contention only)
    env.beta = 0.02               # β [PRM units / s], quality-latency trade-off; 0.02 for
                                  # the roofline clock's latency scale by the rule of
                                  # studies/load_curve/README.md (0.2 under the paper clock)
    env.tau_s = 0.05              # slot length τ [s]
    env.hardware = latency.CONFIG_PAIR  # (edge, server) pair of the clock: A100 + Orin INT4
                                  # (prada_jax.latency.PAIRS or a .json file; docs/latency.md):
                                  # "paper" = the FLOP-only clock, fixed-slot server jobs
    env.server_model = "serving"  # server of a roofline pair: "serving" (continuous batching,
                                  # chunked prefill; envs.serving) or "legacy" (before
                                  # issue 41); docs/latency.md
    env.pass_gain = True          # nominations carry the critic's ΔQ (EdgeAction)
    env.toy_threshold = 0.3       # toy env: nominate pays feat[0] − threshold
    return env


def _net() -> ml_collections.ConfigDict:
    """``config.net``: the actor-critic network."""
    net = ml_collections.ConfigDict()
    net.hidden = (64, 64)         # MLP widths (tanh) of the actor and critic torsos
    net.separate_critic = True    # critic has its own torso
    net.critic = "q"              # "q": Q(s, a) head (ΔQ for the scheduler); "v": plain V(s)
    return net


def _ppo() -> ml_collections.ConfigDict:
    """``config.ppo``: the PPO learner and its run length."""
    ppo = ml_collections.ConfigDict()
    ppo.total_env_steps = 16 * 64 * 300   # env slots over the run (summed over envs)
    ppo.num_envs = 16             # E envs per seed
    ppo.rollout_len = 64          # T slots per update
    ppo.num_epochs = 4            # epochs over each rollout
    ppo.minibatch_size = 2048     # samples (slot × user) per minibatch; divides E·T·U
    ppo.updates_per_chunk = 10    # updates per jitted call
    ppo.lr = 1e-3                 # Adam learning rate
    ppo.lr_schedule = "linear"    # constant | linear | cosine (to final_lr_frac · lr)
    ppo.final_lr_frac = 0.1
    ppo.max_grad_norm = 0.5       # global gradient-norm clip
    ppo.adam_eps = 1e-5
    ppo.gamma = 1.0               # discount per decision (coarse rewards telescope)
    ppo.gae_lambda = 0.95
    ppo.clip_eps = 0.2
    ppo.vf_coef = 0.5
    ppo.ent_coef = 0.003
    ppo.clip_value = False        # clip Q(s,a) updates to old ± value_clip_eps
    ppo.value_clip_eps = 0.2      # reward units
    ppo.normalize_adv = True
    ppo.diagnostics = True        # log approx_kl, clip_frac, explained_variance,
                                  # nominate_rate, mean_gain (False: the same training
                                  # without them, a little faster)
    # Epochs over the decision samples only (compacted into a buffer): None = decided by the
    # env (on where it declares sparse_decisions, as the edge env does; off for any other env,
    # which then trains on every sample); True / False force it.
    ppo.decision_only = ml_collections.config_dict.placeholder(bool)
    ppo.decision_capacity = 0.25  # compacted buffer, fraction of E·T·U (the edge env decides
                                  # in 20-24% of them); a rollout with more decisions than
                                  # this stops the run (exit 2) naming this field
    return ppo


# Each variant: the dotted fields it sets, in order (``config_utils.apply_variants``). ``smoke``
# and ``toy`` share the tiny learner of _TINY.
_TINY = {"env.num_users": 4, "net.hidden": (32, 32),
         "ppo.num_envs": 4, "ppo.num_epochs": 2, "ppo.updates_per_chunk": 2,
         "log.checkpoint_every": 2, "log.progress": False}
_VARIANT_FIELDS = {
    **{preset: {"env.preset": preset} for preset in PRESETS},
    "true": {"env.reward_mode": "true", "env.contention": True, "env.num_users": 16},
    "smoke": {**_TINY, "env.problems": 300,
              "ppo.rollout_len": 16, "ppo.minibatch_size": 64,
              "ppo.total_env_steps": 4 * 16 * 4,    # 4 updates = 2 chunks
              "ppo.decision_capacity": 0.375},      # 256-sample batches: ~20% decisions ± noise
    "toy": {**_TINY, "env.name": "toy",
            "ppo.rollout_len": 8, "ppo.minibatch_size": 32, "ppo.total_env_steps": 4 * 8 * 4,
            "ppo.lr": 3e-3,
            "ppo.decision_capacity": 0.9},          # the toy env decides in ~60% of user slots
    "gymnax": {"env.num_users": 1,
               "net.hidden": (64, 64), "net.separate_critic": True, "net.critic": "v",
               "ppo.num_envs": 4, "ppo.rollout_len": 128, "ppo.num_epochs": 4,
               "ppo.minibatch_size": 128,           # 4 minibatches of the 512-sample batch
               "ppo.updates_per_chunk": 61,
               "ppo.total_env_steps": 512 * 61 * 16,  # 976 updates ≈ 5e5 env steps
               "ppo.lr": 2.5e-4, "ppo.lr_schedule": "linear", "ppo.final_lr_frac": 0.0,
               "ppo.gamma": 0.99, "ppo.ent_coef": 0.01,
               "ppo.clip_value": True, "ppo.value_clip_eps": 0.2,
               "log.checkpoint_every": 61},
}
VARIANTS = tuple(_VARIANT_FIELDS)   # presets, true, smoke, toy, gymnax


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.seed = 0                      # base seed; seed i of a multi-seed run uses seed + i
    c.num_seeds = 1                 # learner states vmapped in one run, each logged separately
    c.env = _env()
    c.net = _net()
    c.ppo = _ppo()
    c.log = ml_collections.ConfigDict()
    c.log.checkpoint_every = 50     # updates between checkpoints (multiple of updates_per_chunk)
    c.log.keep_checkpoints = 3      # newest checkpoints kept
    c.log.progress = True           # tqdm progress bar on stderr

    # Data parallelism: environments split over the devices of a 1-D ``batch`` mesh, parameters
    # replicated; multi-host start-up flags (see prada_jax/parallel.py and docs/BENCHMARKS.md).
    c.mesh = parallel.mesh_config()
    return config_utils.apply_variants(c, arg, _VARIANT_FIELDS, "prada_jax/configs/ppo.py")
