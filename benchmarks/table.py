"""The benchmark suite's ratio table: a row per measured comparison, plain text or Markdown."""
from __future__ import annotations

__all__ = ["BEFORE", "ratio_rows", "format_table"]

# Single-device CPU numbers recorded before issue 10 (2-core shared machine, heavy load).
BEFORE = {
    "ppo_env_steps_per_s": (8970.0, "docs/ppo.md: default config, median chunk 1.14 s"),
    "ppo_rollout_share": (0.17, "docs/ppo.md"),
    "lm_flax_tokens_per_s": (1188.0, "docs/lm.md: small preset, 4 x 128 tokens, fp32"),
}


def _vs_before(key: str, value: float, unit: str, who: str = "") -> str:
    """``"; <who>1.23x the pre-issue 456<unit>"``: ``value`` over ``BEFORE[key]``."""
    b = BEFORE[key][0]
    return f"; {who}{value / b:.2f}x the pre-issue {b:.0f}{unit}"


def _rows_env(r: dict, res: dict) -> list[tuple[str, str, str]]:
    return [("edge env: JAX vs NumPy reference (user-slot steps/s)",
             f"{r['jax']['steps_per_s']:.3g} vs {r['numpy']['steps_per_s']:.3g} "
             f"(E={r['num_envs']}, U={r['num_users']})",
             f"{r['ratio']:.0f}x wall, {r['ratio_cpu']:.0f}x CPU-time")]


def _rows_scaling(r: dict, res: dict) -> list[tuple[str, str, str]]:
    lo, hi = r["rows"][0], r["rows"][-1]
    return [("env throughput vs number of envs",
             " / ".join(f"E={x['num_envs']}: {x['steps_per_s']:.3g}" for x in r["rows"]),
             f"E={hi['num_envs']} is {hi['steps_per_s'] / lo['steps_per_s']:.0f}x E=1; "
             f"saturates (90%) at E={r['saturation_envs']}")]


def _rows_ppo(r: dict, res: dict) -> list[tuple[str, str, str]]:
    rows = []
    cmp = (_vs_before("ppo_env_steps_per_s", r["env_steps_per_s"], "/s")
           if r["variant"] == "default" and r["backend"] == "cpu" and r["num_envs"] == 16
           else "")
    fl = r.get("xla_flops_per_env_step")
    rows.append(("PPO training (env steps/s; rollout / GAE / update share)",
                 f"{r['env_steps_per_s']:.4g} steps/s (E={r['num_envs']}, "
                 f"U={r['num_users']}, decision_only={r['decision_only']})",
                 f"rollout {100 * r['rollout_share']:.0f}% / GAE "
                 f"{100 * r['gae_share']:.0f}% / update {100 * r['update_share']:.0f}%; "
                 f"FLOP/env step {r.get('analytic_flops_per_env_step', float('nan')):.3g} "
                 f"analytic, XLA " + (f"{fl:.3g}" if fl else "n/a") + " (loop bodies once)"
                 + cmp))
    if "before_full_batch" in r:
        f = r["before_full_batch"]
        rows.append(("PPO: decision-only vs full-batch update (same run, alternating)",
                     f"{r['env_steps_per_s']:.4g} vs {f['env_steps_per_s']:.4g} steps/s",
                     f"{r['speedup']:.2f}x (paired median {r['speedup_paired_median']:.2f}x"
                     f", range {r['speedup_paired_min']:.2f}-"
                     f"{r['speedup_paired_max']:.2f})"))
    return rows


def _rows_ppo_gymnax(r: dict, res: dict) -> list[tuple[str, str, str]]:
    return [(f"PPO learner vs reference PPO, CartPole-v1 ({r['env_steps']} env steps, "
             f"median of {r['pairs']} alternated pairs)",
             f"{r['learner_env_steps_per_s']:.4g} vs {r['reference_env_steps_per_s']:.4g}"
             f" env steps/s; final return {r['learner_final_return']:.1f} vs "
             f"{r['reference_final_return']:.1f}",
             f"{r['ratio_paired_median']:.3f}x wall (range {r['ratio_paired_min']:.2f}-"
             f"{r['ratio_paired_max']:.2f}); {r['ratio_cpu_paired_median']:.3f}x CPU "
             f"(range {r['ratio_cpu_paired_min']:.2f}-{r['ratio_cpu_paired_max']:.2f})"
             + (f"; geometric mean {r['ratio_geomean_ci'][0]:.3f}x wall [95% CI "
                f"{r['ratio_geomean_ci'][1]:.3f}, {r['ratio_geomean_ci'][2]:.3f}]"
                if "ratio_geomean_ci" in r else ""))]


def _rows_roofline(r: dict, res: dict) -> list[tuple[str, str, str]]:
    return [(f"edge env vs roofline (E={r['num_envs']}, U={r['num_users']})",
             f"{r['user_slot_steps_per_s']:.3g} user-slot steps/s; "
             f"{r['bytes_per_user_slot']:.3g} B, {r['flops_per_user_slot']:.3g} FLOP "
             f"per user-slot (XLA)",
             f"{100 * r['fraction_of_roofline']:.1f}% of the roofline "
             f"{r['roofline_user_slot_steps_per_s']:.3g}/s "
             f"({r['measured_bw_gb_s']:.3g} GB/s, {r['measured_gflop_s']:.3g} GFLOP/s "
             f"measured)")]


def _rows_mesh1(r: dict, res: dict) -> list[tuple[str, str, str]]:
    return [(f"PPO chunk: mesh path vs plain ({r['devices']} device(s), same run)",
             f"{r['env_steps_per_s_mesh']:.4g} vs {r['env_steps_per_s_plain']:.4g} "
             f"steps/s (E={r['num_envs']})",
             f"{r['mesh_over_plain_speed']:.2f}x")]


def _rows_sched(r: dict, res: dict) -> list[tuple[str, str, str]]:
    rows = []
    rows.append((f"threshold scheduler vs knapsack MILP ({r['candidates']} candidates, "
                 f"median of {r['slots']} slots)",
                 f"{1e3 * r['threshold_s_median']:.3g} ms vs "
                 f"{1e3 * r['milp_knapsack_s_median']:.3g} ms",
                 f"{r['ratio_milp_over_threshold_median']:.0f}x faster (fill alone "
                 f"{r['ratio_milp_over_fill_median']:.0f}x); value ratio "
                 f"{r['value_ratio_median']:.4f}"))
    rows.append((f"greedy fill, {r['batch']} slots vmapped (slots/s)",
                 f"passes {r['batched_fill_given_rank_slots_per_s']:.3g} vs one-by-one "
                 f"{r['batched_sequential_given_rank_slots_per_s']:.3g}; threshold rule "
                 f"{r['batched_threshold_slots_per_s']:.3g}",
                 f"{r['batched_fill_given_rank_slots_per_s'] / r['batched_sequential_given_rank_slots_per_s']:.2f}x; "
                 f"fill == one-by-one on all slots: {r['fill_equals_sequential_all']}"))
    return rows


def _rows_lm(r: dict, res: dict) -> list[tuple[str, str, str]]:
    cmp = (_vs_before("lm_flax_tokens_per_s", r["jax_tokens_per_s"], " tok/s", "Flax ")
           if r.get("preset") == "small" and res.get("_machine", {}).get("backend") == "cpu"
           else "")
    return [("Flax LM forward vs PyTorch (tok/s, same weights)",
             f"{r['jax_tokens_per_s']:.4g} vs {r['torch_tokens_per_s']:.4g}",
             f"{r['jax_over_torch_speed']:.2f}x{cmp}")]


def _rows_distill(r: dict, res: dict) -> list[tuple[str, str, str]]:
    mfu = f"MFU {100 * r['mfu']:.1f}%" if r.get("mfu") is not None else "MFU n/a (CPU)"
    return [(f"distillation step ({r['student']}, {r['dtype']})",
             f"{r['trained_tokens_per_s']:.4g} trained tok/s, "
             f"{r['processed_tokens_per_s']:.4g} processed tok/s",
             mfu)]


def _rows_seeds(r: dict, res: dict) -> list[tuple[str, str, str]]:
    return [(f"distillation, {r['num_seeds']} seeds vmapped vs sequential "
             "(students·updates/s)",
             f"{r['vmapped_students_updates_per_s']:.3g} vs "
             f"{r['sequential_students_updates_per_s']:.3g} (batch {r['batch']})",
             f"{r['speedup']:.2f}x")]


#: the table's rows, part by part in this order: res[part] -> its rows
_ROWS = {"env": _rows_env, "scaling": _rows_scaling, "ppo": _rows_ppo,
         "ppo_gymnax": _rows_ppo_gymnax, "roofline": _rows_roofline, "mesh1": _rows_mesh1,
         "sched": _rows_sched, "lm": _rows_lm, "distill": _rows_distill, "seeds": _rows_seeds}


def ratio_rows(res: dict) -> list[tuple[str, str, str]]:
    """(what, measured, ratio / comparison) rows for the table; missing parts are skipped."""
    return [row for part, rows in _ROWS.items() if part in res for row in rows(res[part], res)]


def format_table(rows, markdown: bool = False) -> str:
    head = ("benchmark", "measured (same run)", "ratio")
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|---|---|---|"]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        return "\n".join(lines)
    w = [max(len(str(r[i])) for r in [head] + rows) for i in range(3)]
    fmt = "  ".join("{:<%d}" % x for x in w)
    return "\n".join([fmt.format(*head), fmt.format(*("-" * x for x in w))]
                     + [fmt.format(*r) for r in rows])
