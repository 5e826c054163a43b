"""Benchmark suite: one process, one table of ratios measured in the same run.

    python -m benchmarks [--gpu] [--quick] [--only env,ppo,...] [--out results.json]
                         [--md table.md] [--repeats N]

Parts (each calls the part's own benchmark function; medians over repeats after a warm-up):

* ``env``: edge env, JAX (jit + vmap + scan) vs its NumPy reference, user-slot steps/s
  (``benchmarks.env_throughput.run``).
* ``scaling``: env throughput for E = 1 → 4096 envs, where it saturates
  (``benchmarks.env_scaling.run``).
* ``ppo``: PPO training env steps/s, the rollout / GAE / update shares of a chunk and XLA's
  FLOP count per env step, full-batch vs decision-only update in one process
  (``benchmarks.ppo_throughput.compare``).
* ``sched``: jitted threshold scheduler and the vectorised greedy fill vs scipy ``milp`` on
  the knapsack formulation, medians over 30 slots of 1024 candidates, and 256 slots vmapped
  (``benchmarks.sched_vs_milp.run_slots``).
* ``roofline``: the edge env at E = 4096 against a roofline of this machine (memory bandwidth
  and FLOP/s measured by tiny kernels in the same run; ``benchmarks.roofline.run``).
* ``lm``: Flax CausalLM forward vs transformers PyTorch on the same weights
  (``benchmarks.lm_forward.main``; PyTorch runs on the CPU even in ``--gpu`` mode).
* ``distill``: distillation train step (offline forward-KL on a synthetic top-k teacher),
  tokens/s and, on a GPU/TPU with a known peak, model-FLOP utilisation from XLA's own FLOP
  count of the compiled step.
* ``ppo_gymnax``: the PPO learner on gymnax CartPole-v1 (4 envs × 128 steps, 4 epochs × 4
  minibatches) vs a minimal one-file reference PPO of PureJaxRL's structure, whole trainings
  alternated in one process, compile excluded: env steps/s of both, the paired ratio and both
  final returns (``benchmarks.ppo_gymnax.run``; needs the ``[gymnax]`` extra).
* ``seeds``: distillation with seeds as a batch axis, students·updates/s of N = 8 vmapped
  students vs 8 sequential runs (``benchmarks.distill_seeds.run``).

``--gpu`` uses GPU sizes (8192 envs × 32 users; a 0.5B-class Qwen2.5-shaped student in
bfloat16). Every workload is SYNTHETIC (random weights, synthetic traces): the numbers measure
speed only. "Before" numbers are the single-device figures the colleagues recorded in
docs/ppo.md and docs/lm.md before the sharding change (issue 10), same machine type.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags
from flax import nnx

from benchmarks import table
from envs import stage1
from prada_jax import cli, config_utils, parallel
from prada_jax.distill.learner import init_state, make_optimizer, make_train_step
from prada_jax.errors import BadInput
from prada_jax.lm.config import LMConfig
from prada_jax.lm.model import CausalLM
from prada_jax.rl import trainer
from prada_jax.configs import ppo as ppo_configs

PARTS = ("env", "scaling", "ppo", "mesh1", "lm", "distill", "seeds", "sched", "roofline",
         "ppo_gymnax")

# Dense bf16 peak FLOP/s per chip, by a substring of jax's device_kind (vendor datasheets).
PEAK_BF16 = (("H200", 989e12), ("H100", 989e12), ("A100", 312e12), ("L40S", 362e12),
             ("L4", 121e12), ("TPU v5p", 459e12), ("TPU v5 lite", 197e12), ("TPU v5e", 197e12),
             ("TPU v4", 275e12), ("TPU v6", 918e12))

# name: (vocab, hidden, intermediate, layers, heads, kv_heads, head_dim)
STUDENTS = {
    "small": (8192, 256, 704, 4, 8, 2, 32),                 # CPU: 4.9 M params
    "qwen2.5-0.5b": (151936, 896, 4864, 24, 14, 2, 64),     # GPU: 0.49 B params (tied)
}


def peak_flops(device_kind: str) -> float | None:
    for key, val in PEAK_BF16:
        if key.lower() in device_kind.lower():
            return val
    return None


def machine() -> dict:
    d = jax.devices()
    cpu_model = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu_model = next((ln.split(":", 1)[1].strip() for ln in f
                              if ln.startswith("model name")), "")
    except OSError:
        pass
    return dict(backend=jax.default_backend(), device_kind=d[0].device_kind, devices=len(d),
                cpus=os.cpu_count(), cpu_model=cpu_model, python=platform.python_version(),
                jax=jax.__version__, load_avg=list(os.getloadavg()),
                date_utc=time.strftime("%Y-%m-%d %H:%M", time.gmtime()))


def bench_distill(student: str = "small", batch: int = 8, prompt_len: int = 64,
                  action_len: int = 64, top_k: int = 8, dtype: str = "float32",
                  repeats: int = 5) -> dict:
    """Times ``prada_jax.distill.learner.make_train_step`` (offline forward KL) on a synthetic
    batch: B sequences of ``prompt_len`` prompt + ``action_len`` trained tokens.

    tokens/s counts trained (action) tokens and processed (prompt + action) tokens per second
    of the median step. FLOPs per step come from XLA's cost analysis of the compiled step;
    MFU = FLOPs / step time / (peak bf16 FLOP/s × devices) when the device's peak is known.
    With several devices the batch is split over the ``batch`` mesh axis.
    """
    vocab, hidden, inter, layers, heads, kv, hd = STUDENTS[student]
    cfg = LMConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter,
                   num_layers=layers, num_heads=heads, num_kv_heads=kv, head_dim=hd,
                   tie_word_embeddings=True)
    dt = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}[dtype]
    model = CausalLM(cfg, rngs=nnx.Rngs(params=0), dtype=dt)
    tx = make_optimizer(1e-4, 1, 1000, 0.0, 1.0, grad_accum=1)
    graphdef, state = init_state(model, tx, jax.random.key(0))
    del model
    n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(state.params))
    step = make_train_step(graphdef, tx, "offline", "fkl", num_turns=4)
    rng = np.random.default_rng(0)
    act = rng.integers(0, vocab, (batch, action_len)).astype(np.int32)
    ids = np.concatenate([act[..., None], rng.integers(0, vocab, (batch, action_len, top_k - 1))],
                         -1).astype(np.int32)
    probs = np.full(top_k, 0.9 / top_k)
    b = dict(prompt=rng.integers(0, vocab, (batch, prompt_len)).astype(np.int32),
             prompt_mask=np.ones((batch, prompt_len), np.int32), action=act,
             action_valid=np.ones((batch, action_len), np.int32),
             action_mask=np.ones((batch, action_len), np.int32),
             turn=rng.integers(0, 4, (batch,)).astype(np.int32), topk_ids=ids,
             topk_logp=np.broadcast_to(np.log(probs), ids.shape).astype(np.float32),
             tail_mass=np.full((batch, action_len), 0.1, np.float32))
    ndev = len(jax.devices())
    if ndev > 1 and batch % ndev == 0:
        mesh = parallel.make_mesh(0)
        state, b = parallel.replicate(state, mesh), parallel.shard_batch(b, mesh)
    else:
        b = jax.device_put(b)
    flops = None
    try:
        ca = step.lower(state, b).compile().cost_analysis()
        ca = ca[0] if isinstance(ca, (list, tuple)) else ca
        flops = float(ca.get("flops")) if ca and ca.get("flops") else None
    except Exception:  # noqa: BLE001 - cost analysis is optional on some backends
        flops = None
    t0 = time.perf_counter()
    state, m = step(state, b)
    jax.block_until_ready(m)
    compile_s = time.perf_counter() - t0
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        state, m = step(state, b)
        jax.block_until_ready(m)
        times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    kind = jax.devices()[0].device_kind
    peak = peak_flops(kind) if jax.default_backend() != "cpu" else None
    # Analytic cross-check: 6 N per processed token (fwd + bwd), N incl. the tied LM head.
    analytic = 6.0 * n_params * batch * (prompt_len + action_len)
    return dict(student=student, params=n_params, dtype=dtype, batch=batch,
                prompt_len=prompt_len, action_len=action_len, top_k=top_k, devices=ndev,
                compile_s=compile_s, step_s=med, loss=float(m["loss"]),
                trained_tokens_per_s=batch * action_len / med,
                processed_tokens_per_s=batch * (prompt_len + action_len) / med,
                xla_flops_per_step=flops, analytic_6n_flops_per_step=analytic,
                achieved_flops=(flops / med if flops else None), peak_flops_per_device=peak,
                mfu=(flops / med / (peak * ndev) if flops and peak else None))


def bench_mesh_overhead(repeats: int = 5, num_envs: int | None = None) -> dict:
    """The single-device path before vs after issue 10, in one process: the default PPO chunk
    on plain (uncommitted) states vs on states placed by the trainer's mesh code
    (``trainer._place_on_mesh`` with ``config.mesh`` defaults: all devices, envs split).
    Calls alternate so machine load hits both alike; medians of ``repeats`` each."""
    config = ppo_configs.get_config()
    if num_envs:
        config.ppo.num_envs = num_envs
    setup = stage1.build_setup(config)
    chunk = trainer.make_jitted_chunk(setup)
    plain = setup.init_states(config)
    placed = trainer._place_on_mesh(config, setup.init_states(config))  # noqa: SLF001
    for _ in range(2):      # compile (plain and placed may differ in input sharding) + warm up
        plain, m = chunk(plain, setup.env_params)
        placed, m2 = chunk(placed, setup.env_params)
        jax.block_until_ready((m, m2))
    tp, tq = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        plain, m = chunk(plain, setup.env_params)
        jax.block_until_ready(m)
        tp.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        placed, m2 = chunk(placed, setup.env_params)
        jax.block_until_ready(m2)
        tq.append(time.perf_counter() - t0)
    s = setup.settings
    steps = s.num_envs * s.rollout_len * s.updates_per_chunk
    a, b = statistics.median(tp), statistics.median(tq)
    return dict(devices=len(jax.devices()), num_envs=s.num_envs, chunk_s_plain=a,
                chunk_s_mesh=b, env_steps_per_s_plain=steps / a, env_steps_per_s_mesh=steps / b,
                mesh_over_plain_speed=a / b, repeats=repeats)


def _import_absl_module(name: str):
    """Imports ``benchmarks.<name>`` whose absl flags may share names with another part's
    (``num_envs``, ``repeats``, ``json``): the suite never parses absl flags, so the earlier
    definitions are dropped before the import."""
    mod = f"benchmarks.{name}"
    if mod not in sys.modules:
        for flag in ("num_envs", "num_users", "repeats", "json", "num_seeds", "variant"):
            if flag in flags.FLAGS:
                delattr(flags.FLAGS, flag)
    return importlib.import_module(mod)


def _run_part(name: str, gpu: bool, quick: bool, repeats: int) -> dict:
    if name == "env":
        env_throughput = _import_absl_module("env_throughput")
        if gpu:
            return env_throughput.run(num_envs=8192, num_users=32, slots=64, numpy_slots=300,
                                      repeats=repeats)
        return env_throughput.run(num_envs=256 if quick else 1024, num_users=16,
                                  slots=16 if quick else 64, numpy_slots=100 if quick else 300,
                                  repeats=repeats)
    if name == "scaling":
        from benchmarks import env_scaling  # lazy: a failing part fails alone
        if gpu:
            return env_scaling.run((1, 16, 256, 1024, 4096, 8192, 32768), num_users=32,
                                   slots=64, repeats=repeats)
        envs = (1, 64, 4096) if quick else (1, 16, 256, 4096)
        return env_scaling.run(envs, num_users=16, slots=8 if quick else 16, repeats=repeats)
    if name == "ppo":
        ppo_throughput = _import_absl_module("ppo_throughput")
        # before (full-batch update) and after (decision-only update), alternating calls
        if gpu:
            return ppo_throughput.compare(num_envs=2048, repeats=repeats)
        return ppo_throughput.compare(variant="smoke" if quick else "", repeats=repeats)
    if name == "roofline":
        _import_absl_module("env_throughput")   # roofline reuses its runner (absl flags)
        from benchmarks import roofline  # lazy: a failing part fails alone
        return roofline.run(num_envs=4096, num_users=32 if gpu else 16, slots=64 if gpu else 16,
                            repeats=repeats)
    if name == "ppo_gymnax":
        from benchmarks import ppo_gymnax  # lazy: a failing part fails alone (gymnax extra)
        # 976 updates = 499 712 env steps per training (PureJaxRL's CartPole budget)
        return ppo_gymnax.run(pairs=2 if quick else max(repeats, 5),
                              num_updates=122 if quick else 976)
    if name == "mesh1":
        return bench_mesh_overhead(repeats=repeats, num_envs=1024 if gpu else None)
    if name == "sched":
        from benchmarks import sched_vs_milp  # lazy: a failing part fails alone
        # 1024-candidate slots (issue 17): medians over 30 slots vs the knapsack MILP, and
        # 256 slots vmapped
        return sched_vs_milp.run_slots(n=1024, slots=8 if quick else 30, free_units=64,
                                       repeats=10 if quick else 20, batch=256)
    if name == "lm":
        from benchmarks import lm_forward  # lazy: a failing part fails alone
        argv = ["--preset", "tiny" if quick else "small", "--repeats", str(max(repeats, 3)),
                "--skip_export", "--skip_generate"]
        if gpu:
            argv = ["--preset", "medium", "--batch", "8", "--length", "512", "--repeats", "10",
                    "--skip_export", "--skip_generate"]
        return lm_forward.main(argv)
    if name == "distill":
        if gpu:
            return bench_distill("qwen2.5-0.5b", batch=16, prompt_len=512, action_len=512,
                                 top_k=16, dtype="bfloat16", repeats=repeats)
        if quick:
            return bench_distill("small", batch=2, prompt_len=16, action_len=16, repeats=2)
        return bench_distill("small", batch=8, prompt_len=64, action_len=64, repeats=repeats)
    if name == "seeds":
        from benchmarks import distill_seeds  # lazy: a failing part fails alone
        if quick:
            return distill_seeds.run(num_seeds=2, updates=2, batch=8)
        return distill_seeds.run(num_seeds=8, updates=max(repeats, 10), batch=64 if gpu else 32)
    raise ValueError(f"unknown part {name!r}; choose from {PARTS}")


def main(argv=None) -> dict:
    """``argv``: absl flags (``--only=env,ppo``); None = the command line. Bad flags raise
    ``errors.BadInput`` (exit 2 from the command line)."""
    cli.hub_offline()

    def define(fv):
        flags.DEFINE_bool("gpu", False, "GPU sizes (8192 envs x 32 users, 0.5B student in "
                          "bf16); needs an accelerator", flag_values=fv)
        flags.DEFINE_bool("quick", False, "tiny sizes (smoke test of the suite)",
                          flag_values=fv)
        flags.DEFINE_list("only", [], f"comma-separated parts of {','.join(PARTS)}",
                          flag_values=fv)
        flags.DEFINE_integer("repeats", 5, "timed repeats per part (median)", lower_bound=1,
                             flag_values=fv)
        flags.DEFINE_string("out", "", "write all results to this JSON file", flag_values=fv)
        flags.DEFINE_string("md", "", "write the ratio table as Markdown to this file",
                            flag_values=fv)

    fv = cli.parse_local(define, argv, "benchmarks", __doc__)
    args = argparse.Namespace(**{k: fv[k].value for k in
                                 ("gpu", "quick", "only", "repeats", "out", "md")})
    parts = [p.strip() for p in args.only if p.strip()] or list(PARTS)
    if args.only and not any(p.strip() for p in args.only):   # --only=, ran every part
        raise BadInput(f"--only={','.join(args.only)}: no part named; choose from "
                       f"{','.join(PARTS)}")
    bad = [p for p in parts if p not in PARTS]
    if bad:
        raise BadInput(f"--only: unknown part(s) {bad}; choose from {','.join(PARTS)}")
    if args.gpu and args.quick:
        raise BadInput("--gpu and --quick are exclusive")
    for flag in ("out", "md"):   # before the benchmarks run, not after
        if getattr(args, flag):
            config_utils.check_output_file(getattr(args, flag), f"--{flag}")
    if args.out and args.md and Path(args.out).absolute() == Path(args.md).absolute():
        raise BadInput(f"--out and --md name the same file {args.out}")

    if args.gpu and jax.default_backend() == "cpu":
        raise BadInput("--gpu: JAX sees no accelerator (backend cpu); install the CUDA build "
                       "(see benchmarks/gpu.sh)")
    res: dict = {"_machine": machine(), "_args": vars(args), "_before": table.BEFORE,
                 "_synthetic": True}
    print(f"machine: {res['_machine']}", flush=True)
    for p in parts:
        t0 = time.perf_counter()
        print(f"== {p}", flush=True)
        try:
            res[p] = _run_part(p, args.gpu, args.quick, args.repeats)
        except Exception as e:  # noqa: BLE001 - one failing part must not hide the others
            traceback.print_exc()
            res[p + "_error"] = f"{type(e).__name__}: {e}"
        print(f"   ({time.perf_counter() - t0:.0f} s)", flush=True)
    res["_machine"]["load_avg_end"] = list(os.getloadavg())
    if "lm" in res:
        res["lm"]["preset"] = ("medium" if args.gpu else "tiny" if args.quick else "small")
    rows = table.ratio_rows(res)
    print()
    print(table.format_table(rows))
    errors = {k: v for k, v in res.items() if k.endswith("_error")}
    for k, v in errors.items():
        print(f"FAILED {k[:-6]}: {v}")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(res, f, indent=2, default=str)
    if args.md:
        Path(args.md).parent.mkdir(parents=True, exist_ok=True)
        with open(args.md, "w") as f:
            f.write(table.format_table(rows, markdown=True) + "\n")
    if errors:
        sys.exit(1)
    return res


if __name__ == "__main__":
    cli.run_local(main)
