#!/usr/bin/env bash
# GPU benchmark: installs the CUDA build of JAX on a bare NVIDIA machine (driver present, no
# CUDA toolkit needed: the jax[cuda12] wheels bring their own CUDA libraries), runs the suite at
# GPU sizes and writes everything to one JSON file (plus the log and the Markdown table).
#
#   bash benchmarks/gpu.sh [OUT_DIR]        # default OUT_DIR=results_gpu; ~8-12 min in all
#
# Environment: PYTHON (default python3, >= 3.11), SKIP_INSTALL=1 to use the current
# environment as is, VENV (default .venv-gpu), ONLY (default: all parts), REPEATS (default 5).
# Sizes (benchmarks/__main__.py --gpu): edge env 8192 envs x 32 users (and a 1 -> 32768 env
# scaling sweep), PPO with 2048 envs (full-batch vs decision-only update in one process, with
# rollout / GAE / update shares and XLA FLOP per env step), the threshold scheduler and the
# vectorised greedy fill on 30 slots of 1024 candidates vs scipy milp (CPU) and 256 slots
# vmapped, the edge env at 4096 envs x 32 users against a roofline measured on the GPU (HBM
# bandwidth and float32 matmul FLOP/s), LM forward "medium" preset 8 x 512 tokens,
# distillation step of a Qwen2.5-0.5B-shaped student (bf16, 16 x (512 + 512) tokens) with MFU.
# ONLY=ppo,sched,roofline runs just the issue-17 parts.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${1:-results_gpu}
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv-gpu}
REPEATS=${REPEATS:-5}
mkdir -p "$OUT_DIR"
start=$(date +%s)

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT_DIR/nvidia_smi.csv"

if [[ "${SKIP_INSTALL:-0}" != 1 ]]; then
  "$PYTHON" -m venv "$VENV"
  # shellcheck disable=SC1091
  source "$VENV/bin/activate"
  python -m pip install -q --upgrade pip
  # CUDA 12 build of the same JAX as the CPU stack (constraints.txt pins the rest); the CPU-only
  # torch wheel keeps the install small (PyTorch is only the reference in the LM part).
  # scipy (MILP oracle) comes with the dev extra; torch with the torch extra.
  python -m pip install -q "jax[cuda12]==0.10.2" \
    --extra-index-url https://download.pytorch.org/whl/cpu \
    -c constraints.txt -e ".[torch,dev]" \
    || python -m pip install -q "jax[cuda12]" -e ".[torch,dev]" \
       --extra-index-url https://download.pytorch.org/whl/cpu
fi
python - <<'EOF'
import jax
print("jax", jax.__version__, "backend", jax.default_backend(), jax.devices())
assert jax.default_backend() == "gpu", "the CUDA build of JAX did not find a GPU"
EOF
echo "install/check: $(( $(date +%s) - start )) s"

export HF_HUB_OFFLINE=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
ONLY_FLAG=()
if [[ -n "${ONLY:-}" ]]; then ONLY_FLAG=(--only "$ONLY"); fi
timeout 1200 python -m benchmarks --gpu --repeats "$REPEATS" "${ONLY_FLAG[@]}" \
  --out "$OUT_DIR/results_gpu.json" --md "$OUT_DIR/table_gpu.md" 2>&1 | tee "$OUT_DIR/log.txt"
echo "total: $(( $(date +%s) - start )) s; results in $OUT_DIR/results_gpu.json"
