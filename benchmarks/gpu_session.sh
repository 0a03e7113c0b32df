#!/usr/bin/env bash
# One GPU session, in calls of at most BUDGET_MIN minutes each (docs/gpu.md):
#
#   bash benchmarks/gpu_session.sh          # from the repository root, on the GPU machine
#
# Each call does what is left, in this order, and writes its logs and results under $OUT
# (default ./gpu-out): install from the offline bundle (.bundle, see docs/gpu.md; skipped
# when the package already imports), the CUDA tests, `scripts/bench.py --device cuda`, then
# slices of the paper preset on hopper-medium-replay-gen, seed 0, until the call's budget is
# spent. Run the same command again to go on: the steps already done are skipped (their
# markers are in $STATE) and the run continues from its last checkpoint. Nothing here needs
# the internet. The run's directory and caches live in $STATE, so they survive between calls
# only on the same machine (a cluster node's disk, or a lent GPU machine still held).
# SCREEN=2 is the same screen with the CBOP step captured as one CUDA graph (cuda_graph=true)
# and 50,000 CBOP steps; SCREEN=1 keeps the eager step (cuda_graph=false) for comparison.
#
# Settings (environment): BUDGET_MIN (9: minutes per call, start-up included), BUNDLE
# (.bundle), STATE (/tmp/cbop-gpu-session), PYTHON (python3), OUT (./gpu-out), STEPS
# (the paper's 1000000 CBOP gradient steps), PRESET (paper), SKIP ("": any of install tests
# bench slices), DATASET (hopper-medium-replay-gen; another set's file from $DATA_DIR,
# default .gpu-data), EVAL_INTERVAL (10000), START_STATES ("": learning.py's default; the screens:
# 0), LABEL ("": the runs' label, e.g. screen) and
# OVERRIDES ("": extra Hydra overrides of the run). SCREEN=1 sets the last four for a short
# look at the paper's sizes (docs/gpu.md, "A paper-size screen"): 10,000 CBOP steps after
# 10,000 BC and 20,000 FQE steps, the dynamics capped at 60 epochs, evaluation and the
# diagnostics (Q - MC at 100 dataset states) every 1,000 steps. At most 8 files come back
# from a lent machine: session.log, cuda_tests.log, bench_cuda.json, bench_cuda.log,
# slices.log, slices.json, run_logs.tgz (the run's scalar logs: every curve) and the
# finished run's summary cbop-paper[-LABEL]-seed0.json.
set -uo pipefail
cd "$(dirname "$0")/.."
START=$(date +%s)
BUDGET_MIN=${BUDGET_MIN:-9}
BUNDLE=${BUNDLE:-.bundle}
STATE=${STATE:-/tmp/cbop-gpu-session}
PYTHON=${PYTHON:-python3}
OUT=${OUT:-$PWD/gpu-out}
STEPS=${STEPS:-1000000}
SKIP=${SKIP:-}
PRESET=${PRESET:-paper}
EVAL_INTERVAL=${EVAL_INTERVAL:-10000}
LABEL=${LABEL:-}
OVERRIDES=${OVERRIDES:-}
SCREEN_PRETRAIN="bc.steps=10000 fqe.steps=20000 dynamics.max_epochs=60 eval.episodes=5 eval.diagnostics=true"
if [ "${SCREEN:-0}" = 1 ]; then
    STEPS=10000 EVAL_INTERVAL=1000 LABEL=screen
    OVERRIDES="$SCREEN_PRETRAIN cuda_graph=false"
elif [ "${SCREEN:-0}" = 2 ]; then  # the captured step: 50,000 CBOP steps
    STEPS=50000 EVAL_INTERVAL=1000 LABEL=screen50k
    OVERRIDES="$SCREEN_PRETRAIN cuda_graph=true"
fi
# The screens score the reset evaluation and Q - MC only: the start-state score (100 more
# episodes per evaluation, benchmarks/learning.py's default) would double their cost.
START_STATES=${START_STATES:-$([ "${SCREEN:-0}" != 0 ] && echo 0)}
variant=cbop-$PRESET${LABEL:+-$LABEL}
DATASET=${DATASET:-hopper-medium-replay-gen}
# Another set's file travels beside the tree, ignored by git (docs/gpu.md): $DATA_DIR/$DATASET.hdf5
DATA_DIR=${DATA_DIR:-.gpu-data}
export CBOP_TORCHRL_CACHE=${CBOP_TORCHRL_CACHE:-$STATE/cache}
export WANDB_MODE=offline PYTHONUNBUFFERED=1
mkdir -p "$OUT" "$STATE" "$CBOP_TORCHRL_CACHE/generated"

minutes_left() { echo "$BUDGET_MIN $START $(date +%s)" | awk '{printf "%.2f", $1 - ($3 - $2) / 60}'; }
skipped() { [[ " $SKIP " == *" $1 "* ]]; }
say() { echo "[gpu-session $(date -u +%H:%M:%S)] $*" | tee -a "$OUT/session.log"; }

say "start: budget ${BUDGET_MIN} min, state $STATE, python $($PYTHON -c 'import sys; print(sys.version.split()[0])')"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >>"$OUT/session.log" 2>&1

# 1. Install (offline): the bundle's packages, then this checkout without its requirements
#    (the bundle for this machine leaves out what it already has; see docs/gpu.md).
if ! skipped install && ! $PYTHON -c "import cbop_torchrl, torchrl, tensordict, gymnasium, mujoco, hydra" 2>/dev/null; then
    if [ ! -f "$BUNDLE/requirements.txt" ]; then
        say "no bundle at $BUNDLE (build it where pip reaches an index: docs/gpu.md)"; exit 2
    fi
    say "installing from $BUNDLE"
    { $PYTHON -m pip install --no-index --find-links "$BUNDLE" -r "$BUNDLE/requirements.txt" &&
      $PYTHON -m pip install --no-index --find-links "$BUNDLE" --no-deps -e . ; } >>"$OUT/session.log" 2>&1 \
        || { say "install failed: see session.log"; tail -20 "$OUT/session.log"; exit 1; }
    $PYTHON -m pip list 2>/dev/null | grep -i -E "^(torch|torchrl|tensordict|gymnasium|mujoco|hydra-core|numpy) " >>"$OUT/session.log"
fi
$PYTHON -c "import torch, cbop_torchrl; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name() if torch.cuda.is_available() else '')" | tee -a "$OUT/session.log"

# 2. The CUDA tests (and the device-placement and host-sync tests, which run on CUDA too).
if ! skipped tests && [ ! -f "$STATE/tests.done" ]; then
    say "CUDA tests"
    $PYTHON -m pytest -q -n 0 -p no:cacheprovider -rs tests/test_cuda.py \
        tests/test_device_placement.py tests/test_host_syncs.py >"$OUT/cuda_tests.log" 2>&1
    status=$?
    tail -3 "$OUT/cuda_tests.log" | tee -a "$OUT/session.log"
    [ $status -eq 0 ] && touch "$STATE/tests.done" || say "CUDA tests failed (exit $status): cuda_tests.log"
fi

# 3. The speed benchmark at the paper's sizes.
if ! skipped bench && [ ! -f "$STATE/bench.done" ]; then
    say "scripts/bench.py --device cuda"
    if $PYTHON scripts/bench.py --device cuda --json "$OUT/bench_cuda.json" >"$OUT/bench_cuda.log" 2>&1; then
        cp "$OUT/bench_cuda.json" "$STATE/bench_cuda.json" && touch "$STATE/bench.done"
    else
        say "bench failed: bench_cuda.log"
    fi
    grep -A8 "^== paper" "$OUT/bench_cuda.log" | tee -a "$OUT/session.log"
fi

# 4. Slices of the paper preset. learning.py stops at a checkpoint before its budget and may
#    need up to 90 s past it to stop a stage without a budget check (KILL_GRACE_S + SIGINT).
if ! skipped slices; then
    data="$CBOP_TORCHRL_CACHE/generated/$DATASET.hdf5"
    if [ ! -f "$data" ] && [ -f "$DATA_DIR/$DATASET.hdf5" ]; then
        cp "$DATA_DIR/$DATASET.hdf5" "$data"
        [ -f "$DATA_DIR/$DATASET.provenance.json" ] && cp "$DATA_DIR/$DATASET.provenance.json" "${data%.hdf5}.provenance.json"
    elif [ ! -f "$data" ] && [ "$DATASET" = hopper-medium-replay-gen ]; then
        # The bundled demo file is this dataset (same generator settings, data_key
        # 695feec0a915, 99,789 transitions): no SAC run needed on this machine.
        cp cbop_torchrl/assets/hopper-demo-medium-replay-gen.hdf5 "$data"
        cp cbop_torchrl/assets/hopper-demo-medium-replay-gen.provenance.json "${data%.hdf5}.provenance.json"
    elif [ ! -f "$data" ]; then
        say "no file for $DATASET: copy it and its provenance from the cache's generated/ to $DATA_DIR/ (docs/gpu.md)"; exit 2
    fi
    slice_min=$(echo "$(minutes_left)" | awk '{printf "%.2f", $1 - 2.0}')
    if awk "BEGIN {exit !($slice_min >= 1)}"; then
        say "slice of the $PRESET preset: --max-minutes $slice_min"
        # shellcheck disable=SC2086  # OVERRIDES: one Hydra override per word
        $PYTHON benchmarks/learning.py --preset "$PRESET" --datasets $DATASET --algos cbop --seeds 0 \
            --epochs $((STEPS / 1000)) --steps-per-epoch 1000 --eval-interval "$EVAL_INTERVAL" \
            ${LABEL:+--label "$LABEL"} ${START_STATES:+--start-states "$START_STATES"} \
            --results "$STATE/results" --max-minutes "$slice_min" \
            $OVERRIDES >>"$OUT/slices.log" 2>&1
        tail -4 "$OUT/slices.log" | tee -a "$OUT/session.log"
    else
        say "no time left for a slice in this call ($(minutes_left) min); run the command again"
    fi
    run_dir=$(ls -d "$CBOP_TORCHRL_CACHE"/benchmark_runs/$DATASET/*/$PRESET/$variant/seed0 2>/dev/null | head -1)
    if [ -n "$run_dir" ]; then
        [ -f "$run_dir/slices.json" ] && cp "$run_dir/slices.json" "$OUT/slices.json"
        # every scalar curve (CSV), without checkpoints: read with benchmarks/curves.py
        [ -d "$run_dir/logs" ] && tar czf "$OUT/run_logs.tgz" -C "$run_dir" logs
    fi
    summary="$STATE/results/$DATASET/$variant/seed0.json"
    [ -f "$summary" ] && cp "$summary" "$OUT/$variant-seed0.json" && say "the run finished: $variant-seed0.json"
fi
say "done in $(( $(date +%s) - START )) s; run the same command again to continue"
