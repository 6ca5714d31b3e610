#!/usr/bin/env bash
# The GPU check: one command for a lent GPU machine (docs/gpu.md "The GPU check"), run in the repository root with
# gpu_bundle/ carried (python tools/gpu_bundle.py build, here). No network there. It installs the bundle into a
# --target on PYTHONPATH, then runs stages, each under its own timeout cut to what is left of the whole budget, and
# goes on past a failed one:
#   install      the bundle's wheels (--no-index --no-deps)
#   nvidia_smi   the card, driver, memory
#   env          versions, CUDA, `import unsloth, trl, datasets, bitsandbytes` for real, unmet requirements
#   doctor       python train_grpo.py doctor --report (the CLI's self-check, where it exists)
#   models       random-weight Qwen2.5-0.5B-shaped Qwen2 and tiny Llama with a byte-level tokenizer (no download)
#   plan         train_grpo.py --dry-run on the Qwen2 shape: the load plan and its memory estimate
#   ours_qwen    5 GRPO steps of the default path (Unsloth, 4-bit, LoRA) on examples/qa.jsonl
#   plain_qwen   5 steps of bench/plain_trl_grpo.py (TRL + PEFT, bf16) on the same model and shape
#   ours_llama   5 steps of the default path on the tiny Llama (Unsloth's Llama kernels)
# and writes $OUT/gpu_check.json + gpu_check.md (step times, peak GPU memory, load plan, objective, failures with
# their last lines), $OUT/stages.log (every stage's output) and $OUT/doctor.json.
#
#   bash tools/gpu_check.sh                     # on the GPU machine; $OUT is the device tool's folder
#   GPU_CHECK_DRY=1 bash tools/gpu_check.sh     # anywhere: the stages replaced by fixtures (tests/test_gpu_check.py)
# Settings: GPU_CHECK_BUDGET_S (default 480: the stages end within 8 minutes; 465 s on an H100), GPU_CHECK_PYTHON (python3),
# GPU_CHECK_WORK (/tmp/gpu_check), GPU_CHECK_STEPS (5), GPU_CHECK_FAKE_HANG=<stage> (dry: that stage hangs).
set -u
cd "$(dirname "$0")/.." || exit 2
ROOT=$PWD
OUT=${OUT:-$ROOT/gpu_check_out}
WORK=${GPU_CHECK_WORK:-/tmp/gpu_check}
PY=${GPU_CHECK_PYTHON:-python3}
DRY=${GPU_CHECK_DRY:-0}
BUDGET=${GPU_CHECK_BUDGET_S:-480}
STEPS=${GPU_CHECK_STEPS:-5}
START=$(date +%s)
rm -rf "$WORK" && mkdir -p "$WORK/logs" "$WORK/runs" "$OUT" || exit 2
: > "$WORK/stages.tsv"
git -C "$ROOT" rev-parse --short HEAD > "$WORK/commit.txt" 2>/dev/null || echo unknown > "$WORK/commit.txt"

export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=disabled \
    TOKENIZERS_PARALLELISM=false PIP_DISABLE_PIP_VERSION_CHECK=1 UNSLOTH_COMPILE_LOCATION="$WORK/unsloth_compiled_cache" \
    HF_HOME="$WORK/hf_home"
SITE=$WORK/site
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"

# stage NAME LIMIT_S COMMAND...: run COMMAND under `timeout` (LIMIT_S, cut to what is left of BUDGET), its output in
# $WORK/logs/NAME.log, one line in stages.tsv (name, rc or 'skipped', seconds, limit). Never stops the script.
stage() {
    local name=$1 limit=$2 left rc t0 t1
    shift 2
    left=$(( BUDGET - ($(date +%s) - START) ))
    if (( left < 15 )); then
        printf '%s\tskipped\t0\t%s\n' "$name" "out of budget" >> "$WORK/stages.tsv"
        echo "== $name: skipped (out of budget)"
        return 0
    fi
    (( limit > left )) && limit=$left
    if [ "$DRY" = 1 ]; then
        limit=5
        if [ "${GPU_CHECK_FAKE_HANG:-}" = "$name" ]; then set -- sleep 60; else set -- "$PY" tools/gpu_check.py fake "$name" "$WORK"; fi
    fi
    echo "== $name (limit ${limit}s): $*"
    t0=$(date +%s.%N)
    timeout -k 10 "$limit" "$@" > "$WORK/logs/$name.log" 2>&1
    rc=$?
    t1=$(date +%s.%N)
    printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.1f", b-a}')" "$limit" \
        >> "$WORK/stages.tsv"
    echo "   rc $rc; last lines:"
    tail -n 3 "$WORK/logs/$name.log" | cut -c1-200 | sed 's/^/   | /'
    return 0
}

QWEN=$WORK/models/qwen2-0.5b
LLAMA=$WORK/models/llama-tiny
# The default path (Unsloth, 4-bit, LoRA, the default preset's batch 8 x 4 generations x 256 tokens) on a shipped
# JSONL; W&B off, no checkpoints in 5 steps, generation logs on (the default) but capped at 2 prompts.
ours_args() {
    echo --model "$1" --custom-data examples/qa.jsonl --max-steps "$STEPS" --no-wandb --output-dir "$2" \
        --set save_steps=0 --set max_generation_samples=2 --set max_eval_samples=4
}

stage install 90 sh -c '[ -d gpu_bundle ] || { echo "no gpu_bundle/: build it (python tools/gpu_bundle.py build) and carry it"; exit 2; }
    "$0" -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --target "$1" gpu_bundle/*.whl' "$PY" "$SITE"
stage nvidia_smi 20 nvidia-smi
stage env 120 "$PY" tools/gpu_check.py env "$WORK/env.json"
stage doctor 150 "$PY" train_grpo.py doctor --report "$WORK/doctor.json"
stage models 120 "$PY" tools/gpu_check.py models "$WORK/models" qwen2-0.5b llama-tiny
stage plan 60 sh -c 'out=$1; shift; "$@" > "$out"' sh "$WORK/plan.json" "$PY" train_grpo.py \
    $(ours_args "$QWEN" "$WORK/runs/plan") --dry-run
stage ours_qwen 200 "$PY" tools/gpu_check.py wrap "$WORK/peak_ours_qwen.json" train_grpo.py \
    $(ours_args "$QWEN" "$WORK/runs/ours_qwen")
GPU_CHECK_PLAIN_MODEL=$QWEN stage plain_qwen 150 "$PY" tools/gpu_check.py wrap "$WORK/peak_plain_qwen.json" \
    bench/plain_trl_grpo.py "$WORK/runs/plain_qwen" --steps "$STEPS" --batch 8 --generations 4 --completion-length 256
stage ours_llama 100 "$PY" tools/gpu_check.py wrap "$WORK/peak_ours_llama.json" train_grpo.py \
    $(ours_args "$LLAMA" "$WORK/runs/ours_llama")

"$PY" tools/gpu_check.py report "$WORK" "$OUT"
[ -f "$WORK/doctor.json" ] && cp "$WORK/doctor.json" "$OUT/doctor.json"
for f in "$WORK"/logs/*.log; do echo "======== $(basename "$f" .log)"; tail -c 2000000 "$f"; done > "$OUT/stages.log"
echo "total $(( $(date +%s) - START )) s; report: $OUT/gpu_check.md"
cat "$OUT/gpu_check.md" 2>/dev/null | head -60
