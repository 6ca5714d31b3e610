#!/usr/bin/env bash
# The GPU check (docs/gpu.md "The GPU check"): one command for a bare GPU machine without network, run in the
# repository root with gpu_bundle/ beside it (python tools/gpu_bundle.py build, on a machine with network). It installs
# the bundle into a --target on PYTHONPATH, then runs the stages below in this order (the most valuable first), each
# under its own timeout cut to what is left of the budget, and goes on past a failed one. Stage by stage:
#   install      the bundle's wheels (--no-index --no-deps)
#   nvidia_smi   the card, driver, memory (and a sampler of nvidia-smi's memory.used every second, to the end)
#   models       random-weight Llamas with a byte-level tokenizer (no download): a tiny one, and one at
#                Llama-3.1-8B's width and vocabulary with 4 layers
#   plans        train_grpo.py --dry-run of each run below, in parallel: the objective it states, the load plan
#   default_8b   the default path (Unsloth, 4-bit, LoRA, batch 8 x 4 x 256) at 8B width: (c) peak memory against
#                the load plan; (a) the default objective against the dry run's
#   dynsample    dynamic sampling, beta 0.04, dr_grpo, on the tiny Llama: (b) the KL of merged batches; (a) dr_grpo
#   best_cispo   cispo, an evaluation and a checkpoint every step, load_best_model_at_end: (a) cispo; (d)
#   eval_only    --eval-only on that run's adapter: (d)
#   env          versions, CUDA, `import unsloth, trl, datasets, bitsandbytes` for real, unmet requirements (after the
#                runs: where an import fails they fail in seconds, and this says why)
#   doctor       train_grpo.py doctor --skip-run (the CLI's own checks; the runs above are its run)
#   tool         --tool calculator on the tiny Llama: (e); "not available in this checkout" without that option
# Everything lands in $OUT as it happens: stages.tsv (a line per stage), stages/<stage>/ (log.txt, the dry run's
# plan.json, the wrapped run's steps.jsonl / peak.json / objective.json, the run's small result files), gpu_memory.tsv,
# commit.txt; at the end gpu_check.json + gpu_check.md (the answers, the stages, each run's figures). A stage cut by
# its timeout keeps what it wrote; `python tools/gpu_check.py report $OUT` rebuilds the report from them anywhere.
#
#   bash tools/gpu_check.sh                       # on the GPU machine
#   GPU_CHECK_ONLY="dynsample tool" bash tools/gpu_check.sh   # a rerun: these stages and what they need
#   GPU_CHECK_DRY=1 bash tools/gpu_check.sh       # anywhere: the stages replaced by fixtures (tests/test_gpu_check.py)
# Settings: GPU_CHECK_BUDGET_S (330: the script ends within it, the report included; with a machine's start and the
# transfers, two tries fit in 15 minutes), GPU_CHECK_PYTHON (python3), GPU_CHECK_WORK (/tmp/gpu_check: bundle,
# models, run directories), GPU_CHECK_STEPS (3), GPU_CHECK_LIMITS ("stage=seconds ...": other limits),
# GPU_CHECK_BUNDLE (gpu_bundle: the wheels and COMMIT).
# Dry mode only: GPU_CHECK_FAKE_HANG=<stage> (that stage hangs until cut), GPU_CHECK_FAKE_ELAPSED="stage=seconds ..."
# (the budget's clock moves on that much after the stage, as if it had run that long).
set -u
cd "$(dirname "$0")/.." || exit 2
ROOT=$PWD
OUT=${OUT:-$ROOT/gpu_check_out}
WORK=${GPU_CHECK_WORK:-/tmp/gpu_check}
PY=${GPU_CHECK_PYTHON:-python3}
DRY=${GPU_CHECK_DRY:-0}
BUDGET=${GPU_CHECK_BUDGET_S:-330}
STEPS=${GPU_CHECK_STEPS:-3}
ONLY=${GPU_CHECK_ONLY:-}
BUNDLE=${GPU_CHECK_BUNDLE:-gpu_bundle}
# Kept back from the stages: the last stage's kill grace (timeout -k 5) and the report.
RESERVE=12
KILL_AFTER=5
START=$(date +%s)
OFFSET=0  # dry mode: GPU_CHECK_FAKE_ELAPSED's simulated seconds
rm -rf "$WORK" "$OUT/stages" && mkdir -p "$WORK/runs" "$OUT/stages" || exit 2
rm -f "$OUT/stages.tsv" "$OUT/gpu_memory.tsv" "$OUT/gpu_check.json" "$OUT/gpu_check.md" && : > "$OUT/stages.tsv"
export GPU_CHECK_WORK=$WORK
# The dynsample stage's rewards: accuracy (0 on random text) and gpu_check:coin, which leaves every other prompt's
# group flat, so dynamic sampling drops groups and merges rounds (the default qa rewards' length term varies on any
# text: no group would be dropped).
echo '{"description": "the GPU check: accuracy plus --reward gpu_check:coin", "accuracy_weight": 1.0}' \
    > "$WORK/coin_rewards.json"

# The commit under test: git's where the checkout has its history, else the one gpu_bundle.py wrote into the bundle
# folder when it was built (a copied working tree carries no .git).
if git -C "$ROOT" rev-parse --short HEAD > /dev/null 2>&1; then
    changed=$(git -C "$ROOT" status --porcelain --untracked-files=no 2>/dev/null | wc -l)
    echo "$(git -C "$ROOT" rev-parse --short HEAD)$( (( changed )) && echo " + $changed changed files") (git)" \
        > "$OUT/commit.txt"
elif [ -f "$BUNDLE/COMMIT" ]; then
    echo "$(head -n 1 "$BUNDLE/COMMIT") (gpu_bundle/COMMIT)" > "$OUT/commit.txt"
else
    echo "unknown (no git, no gpu_bundle/COMMIT)" > "$OUT/commit.txt"
fi

export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=disabled \
    TOKENIZERS_PARALLELISM=false PIP_DISABLE_PIP_VERSION_CHECK=1 UNSLOTH_COMPILE_LOCATION="$WORK/unsloth_compiled_cache" \
    HF_HOME="$WORK/hf_home" COLUMNS=160
SITE=$WORK/site
# tools/ last: the dynsample stage's reward is gpu_check:coin
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}:$ROOT/tools"

# The stages, most valuable first: limit (s, cut to what is left), the least worth starting (s), what each needs.
declare -A LIMIT MIN NEEDS
while read -r name limit min needs; do
    LIMIT[$name]=$limit MIN[$name]=$min NEEDS[$name]=${needs//-/}
done <<'TABLE'
install     40  10  -
nvidia_smi  10  3   -
models      60  20  install
plans       45  10  models
default_8b  100 45  plans
dynsample   60  30  plans
best_cispo  60  30  plans
eval_only   45  20  best_cispo
env         45  15  install
doctor      45  20  install
tool        60  30  models
TABLE
for pair in ${GPU_CHECK_LIMITS:-}; do LIMIT[${pair%%=*}]=${pair#*=}; done
declare -A FAKE_ELAPSED
for pair in ${GPU_CHECK_FAKE_ELAPSED:-}; do FAKE_ELAPSED[${pair%%=*}]=${pair#*=}; done

# GPU_CHECK_ONLY: the stages named and, transitively, what they need.
declare -A CHOSEN
choose() { local n; for n in "$@"; do [ -n "${CHOSEN[$n]:-}" ] && continue; CHOSEN[$n]=1; choose ${NEEDS[$n]}; done; }
[ -n "$ONLY" ] && choose $ONLY
chosen() { [ -z "$ONLY" ] || [ -n "${CHOSEN[$1]:-}" ]; }
elapsed() { echo $(( $(date +%s) - START + OFFSET )); }
echo "{\"budget_s\": $BUDGET, \"stages_end_by_s\": $(( BUDGET - RESERVE )), \"reserve_s\": $RESERVE}" > "$OUT/budget.json"
echo "budget $BUDGET s: the stages end by $(( BUDGET - RESERVE )) s, $RESERVE s kept for a cut stage's kill grace and the report"

# record NAME STATUS SECONDS LIMIT START END NOTE: one line of stages.tsv
record() { local IFS=$'\t'; echo "$*" >> "$OUT/stages.tsv"; }

# stage NAME COMMAND...: COMMAND under `timeout` (the stage's limit cut to what is left of the budget), its output in
# $OUT/stages/NAME/log.txt. Skipped (and recorded so) when not chosen or when less than its minimum is left. Never
# stops the script.
stage() {
    local name=$1 limit=${LIMIT[$1]} min=${MIN[$1]} dir=$OUT/stages/$1 left rc t0 t1
    shift
    mkdir -p "$dir"
    if ! chosen "$name"; then
        record "$name" skipped 0 "$limit" "" "" "not chosen (GPU_CHECK_ONLY)"
        return 0
    fi
    left=$(( BUDGET - RESERVE - $(elapsed) ))
    if (( left < min )); then
        record "$name" skipped 0 "$limit" "" "" "out of budget: ${left} s left, needs ${min} s"
        echo "== $name: skipped (out of budget: ${left} s left, needs ${min} s)"
        return 0
    fi
    (( limit > left )) && limit=$left
    if [ "$DRY" = 1 ]; then
        case $name in
            default_8b|dynsample|best_cispo|eval_only|tool) set -- "$PY" tools/gpu_check.py wrap "$dir" --fake "$name" ;;
            *) set -- "$PY" tools/gpu_check.py fake "$name" "$OUT" "$WORK" ;;
        esac
    fi
    echo "== $name (limit ${limit} s, $(elapsed) s in): $*"
    t0=$(date +%s.%N)
    timeout -k "$KILL_AFTER" "$limit" "$@" > "$dir/log.txt" 2>&1
    rc=$?
    t1=$(date +%s.%N)
    record "$name" "$rc" "$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.1f", b-a}')" "$limit" "$t0" "$t1" ""
    echo "   rc $rc; last lines:"
    tail -n 3 "$dir/log.txt" | cut -c1-200 | sed 's/^/   | /'
    collect "$name"
    [ "$DRY" = 1 ] && OFFSET=$(( OFFSET + ${FAKE_ELAPSED[$name]:-0} ))
    return 0
}

# The small files a run leaves, beside its figures in $OUT (the run directories stay in $WORK).
collect() {
    local name=$1 dir=$OUT/stages/$1 run=$WORK/runs/$1 f
    case $name in
        eval_only)
            f=$(ls -d "$WORK"/runs/best_cispo/eval_only/*/eval_metrics.json 2>/dev/null | head -n 1)
            [ -n "$f" ] && cp "$f" "$dir/" ;;
        models) cp "$WORK/models/models.json" "$dir/" 2>/dev/null ;;
        *)
            for f in run_config.json trainer_state.json metrics_summary.json best_checkpoint.json; do
                [ -f "$run/$f" ] && cp "$run/$f" "$dir/"
            done
            [ "$name" = best_cispo ] && "$PY" tools/gpu_check.py best-kept "$run" > "$dir/best_kept.json" 2>> "$dir/log.txt"
            ;;
    esac
    return 0
}

TINY=$WORK/models/llama-tiny
WIDE=$WORK/models/llama-8b-width
# run_args STAGE: the CLI's arguments of a run stage. W&B off, generation logs capped at 2 prompts; the tiny model's
# runs cap completions at 64 tokens (random weights always run to the cap).
run_args() {
    local out=$WORK/runs/$1
    local common="--custom-data examples/qa.jsonl --no-wandb --set max_generation_samples=2 --set max_eval_samples=4"
    case $1 in
        default_8b) echo --model "$WIDE" $common --output-dir "$out" --max-steps "$STEPS" --set save_steps=0 ;;
        dynsample) echo --model "$TINY" $common --output-dir "$out" --max-steps "$STEPS" --set save_steps=0 \
            --set max_completion_length=64 --set beta=0.04 --set loss_type=dr_grpo --set dynamic_sampling=true \
            --reward-config "$WORK/coin_rewards.json" --reward gpu_check:coin ;;
        best_cispo) echo --model "$TINY" $common --output-dir "$out" --max-steps 2 --set max_completion_length=64 \
            --set loss_type=cispo --set eval_fraction=0.25 --set eval_steps=1 --set save_steps=1 \
            --set load_best_model_at_end=true ;;
        eval_only) echo "$(run_args best_cispo)" --eval-only --resume-from-checkpoint "$WORK/runs/best_cispo" ;;
        tool) echo --model "$TINY" $common --output-dir "$out" --max-steps 2 --set save_steps=0 \
            --set max_completion_length=64 --tool calculator ;;
    esac
}
# plan STAGE: its dry run into its folder (what the run must train: the objective; where: the load plan)
plan() { mkdir -p "$OUT/stages/$1" && "$PY" train_grpo.py $(run_args "$1") --dry-run > "$OUT/stages/$1/plan.json"; }
export -f plan run_args
export OUT WORK PY STEPS TINY WIDE

stage install sh -c '[ -d "$2" ] || { echo "no $2/: build it (python tools/gpu_bundle.py build) and copy it here"; exit 2; }
    "$0" -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --target "$1" "$2"/*.whl' \
    "$PY" "$SITE" "$BUNDLE"
stage nvidia_smi nvidia-smi
if [ "$DRY" = 1 ]; then SMI="echo 0"; else SMI="nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0"; fi
if [ "$DRY" = 1 ] || command -v nvidia-smi > /dev/null; then
    # ends with the script, however it ends ($$ is this script's pid inside the subshell too)
    (while kill -0 $$ 2>/dev/null; do m=$($SMI 2>/dev/null | head -n 1); [ -n "$m" ] \
        && printf '%s\t%s\n' "$(date +%s.%N)" "$m" >> "$OUT/gpu_memory.tsv"; sleep 1; done) &
    SAMPLER=$!
fi
stage models "$PY" tools/gpu_check.py models "$WORK/models" llama-tiny llama-8b-width
stage plans bash -c 'plan default_8b & plan dynsample & plan best_cispo & fail=0
    for job in $(jobs -p); do wait "$job" || fail=1; done; exit $fail'
stage default_8b "$PY" tools/gpu_check.py wrap "$OUT/stages/default_8b" train_grpo.py $(run_args default_8b)
stage dynsample "$PY" tools/gpu_check.py wrap "$OUT/stages/dynsample" train_grpo.py $(run_args dynsample)
stage best_cispo "$PY" tools/gpu_check.py wrap "$OUT/stages/best_cispo" train_grpo.py $(run_args best_cispo)
stage eval_only "$PY" tools/gpu_check.py wrap "$OUT/stages/eval_only" train_grpo.py $(run_args eval_only)
stage env "$PY" tools/gpu_check.py env "$OUT/stages/env/env.json"
stage doctor "$PY" train_grpo.py doctor --skip-run --report "$OUT/stages/doctor/doctor.json"
# The tool option is newer than this script: without it the stage says so instead of failing the check.
if ! chosen tool || "$PY" train_grpo.py --help 2>/dev/null | grep -q -- "--tool"; then
    stage tool "$PY" tools/gpu_check.py wrap "$OUT/stages/tool" train_grpo.py $(run_args tool)
else
    mkdir -p "$OUT/stages/tool"
    record tool n/a 0 "${LIMIT[tool]}" "" "" "not available in this checkout (train_grpo.py has no --tool)"
    echo "== tool: not available in this checkout (train_grpo.py has no --tool)"
fi

[ -n "${SAMPLER:-}" ] && kill "$SAMPLER" 2>/dev/null
total=$(( $(date +%s) - START ))
"$PY" - "$OUT/budget.json" "$total" <<'EOF'
import json, sys
path, total = sys.argv[1], int(sys.argv[2])
data = json.load(open(path)); data["total_s"] = total; json.dump(data, open(path, "w"))
EOF
"$PY" tools/gpu_check.py report "$OUT"
echo "total $(( $(date +%s) - START )) s (budget $BUDGET s); report: $OUT/gpu_check.md"
