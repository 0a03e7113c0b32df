#!/usr/bin/env bash
# One GPU session, in calls of at most BUDGET_MIN minutes each (docs/gpu.md):
#
#   bash benchmarks/gpu_session.sh          # from the repository root, on the GPU machine
#
# Each call does what is left, in this order, and writes its logs and results under $OUT
# (default ./gpu-out): install from the offline bundle (.bundle, see docs/gpu.md; skipped
# when the package already imports), the CUDA tests, `scripts/bench.py --device cuda`, then
# slices of the paper preset, one run per set and seed (default hopper-medium-replay-gen,
# seed 0), all at once, until the call's budget is spent. Run the same command again to go
# on: the steps already done are skipped (their markers are in $STATE) and each run continues
# from its last checkpoint. Nothing here needs the internet. The runs' directories and caches
# live in $STATE, so they survive between calls only on the same machine (a cluster node's
# disk, or a lent GPU machine still held).
# SCREEN=2 is the screen below with the CBOP step captured as one CUDA graph (cuda_graph=true)
# and 50,000 CBOP steps; SCREEN=1 keeps the eager step (cuda_graph=false) for comparison.
#
# Settings (environment): BUDGET_MIN (9: minutes per call, start-up included), BUNDLE
# (.bundle), STATE (/tmp/cbop-gpu-session), PYTHON (python3), OUT (./gpu-out), STEPS
# (the paper's 1000000 CBOP gradient steps), STEPS_PER_EPOCH (1000), PRESET (paper), SKIP
# ("": any of install tests bench slices), DATASETS (hopper-medium-replay-gen, or DATASET's
# value; other sets' files from $DATA_DIR, default .gpu-data), SEEDS (0; "0 1 2" for three
# runs per set), RUN_THREADS (torch threads per run; default: the cores shared out),
# BENCH_ARGS ("": more options of scripts/bench.py, e.g. "--compiled-step --no-extras"),
# GRID ("": a set whose psi grid runs as one job instead of the slices, benchmarks/gpu_grid.sh;
# GRID_STEPS: its CBOP steps, "": the preset's), EVAL_INTERVAL (10000), START_STATES ("": learning.py's default; the screens: 0), LABEL ("":
# the runs' label, e.g. screen), OVERRIDES ("": extra Hydra overrides of every run) and RUNS
# ("": the runs as set:seed[:override[:override...]] words instead of DATASETS x SEEDS, each
# with its own overrides after OVERRIDES, e.g. the psi grid side by side:
# RUNS="halfcheetah-medium-replay-gen:0:estimator.psi=2 halfcheetah-medium-replay-gen:0:estimator.psi=3";
# a run with overrides is labelled by them, psi2, so its directory, log and summary are its own;
# a word's algo=<name> field runs that algorithm instead of ALGO and is no override) and ALGO
# (cbop: the algorithm of every run, or a baseline of benchmarks/learning.py --algos, e.g. the
# 50,000-step protocol's rows: ALGO=cql PRESET=cpu STEPS=50000 EVAL_INTERVAL=2500 LABEL=50k).
# SCREEN=1 sets the last four for a short look at the paper's sizes (docs/gpu.md, "A
# paper-size screen"): 10,000 CBOP steps after 10,000 BC and 20,000 FQE steps, the dynamics
# capped at 60 epochs, evaluation and the diagnostics (Q - MC at 100 dataset states) every
# 1,000 steps. At most 8 files come back from a lent machine; these are at most 5:
# gpu_session.log, cuda_tests.log, bench_cuda.json, bench_cuda.log and runs.tgz (per run,
# <set>/seed<k>/ with its scalar logs, slice history, output and, once finished, summary).
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
ALGO=${ALGO:-cbop}
SCREEN_PRETRAIN="bc.steps=10000 fqe.steps=20000 dynamics.max_epochs=60 eval.episodes=5 eval.diagnostics=true eval.background=true"
if [ "${SCREEN:-0}" = 1 ]; then
    STEPS=10000 EVAL_INTERVAL=1000 LABEL=screen
    OVERRIDES="$SCREEN_PRETRAIN cuda_graph=false"
elif [ "${SCREEN:-0}" = 2 ]; then  # the captured step: 50,000 CBOP steps
    # Evaluation every 2,500 steps: at about 7 ms a step the learning diagnostics (14-41 s
    # on an H200) would make training wait for them at every 1,000.
    STEPS=50000 EVAL_INTERVAL=2500 LABEL=screen50k
    OVERRIDES="$SCREEN_PRETRAIN cuda_graph=true"
fi
# The screens score the reset evaluation and Q - MC only: the start-state score (100 more
# episodes per evaluation, benchmarks/learning.py's default) would double their cost.
START_STATES=${START_STATES:-$([ "${SCREEN:-0}" != 0 ] && echo 0)}
DATASETS=${DATASETS:-${DATASET:-hopper-medium-replay-gen}}
SEEDS=${SEEDS:-0}
STEPS_PER_EPOCH=${STEPS_PER_EPOCH:-1000}
# Another set's file travels beside the tree, ignored by git (docs/gpu.md): $DATA_DIR/<set>.hdf5
DATA_DIR=${DATA_DIR:-.gpu-data}
export CBOP_TORCHRL_CACHE=${CBOP_TORCHRL_CACHE:-$STATE/cache}
export WANDB_MODE=offline PYTHONUNBUFFERED=1
mkdir -p "$OUT" "$STATE" "$CBOP_TORCHRL_CACHE/generated"

minutes_left() { echo "$BUDGET_MIN $START $(date +%s)" | awk '{printf "%.2f", $1 - ($3 - $2) / 60}'; }
skipped() { [[ " $SKIP " == *" $1 "* ]]; }
# The set's file in the cache: copied from $DATA_DIR, or the repository's copy (set_files.py).
prepare_data() {
    local data="$CBOP_TORCHRL_CACHE/generated/$1.hdf5"
    if [ -f "$data" ]; then return 0; fi
    if [ -f "$DATA_DIR/$1.hdf5" ]; then
        cp "$DATA_DIR/$1.hdf5" "$data"
        [ -f "$DATA_DIR/$1.provenance.json" ] && cp "$DATA_DIR/$1.provenance.json" "${data%.hdf5}.provenance.json"
    elif $PYTHON benchmarks/set_files.py --copies-only "$1" >>"$OUT/gpu_session.log" 2>&1; then
        # The repository's copy (hopper's is the package's demo file): no SAC run here.
        return 0
    else
        say "no file for $1: copy it and its provenance from the cache's generated/ to $DATA_DIR/ (docs/gpu.md)"
        return 1
    fi
}
say() { echo "[gpu-session $(date -u +%H:%M:%S)] $*" | tee -a "$OUT/gpu_session.log"; }

say "start: budget ${BUDGET_MIN} min, state $STATE, python $($PYTHON -c 'import sys; print(sys.version.split()[0])')"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >>"$OUT/gpu_session.log" 2>&1

# 1. Install (offline): the bundle's packages, then this checkout without its requirements
#    (the bundle for this machine leaves out what it already has and MuJoCo's viewer, so it
#    goes in as it is, without pip's resolver, when bundle.json names a --without; docs/gpu.md).
if ! skipped install && ! $PYTHON -c "import cbop_torchrl, torchrl, tensordict, gymnasium.envs.mujoco, hydra" 2>/dev/null; then
    if [ ! -f "$BUNDLE/requirements.txt" ]; then
        say "no bundle at $BUNDLE (build it where pip reaches an index: docs/gpu.md)"; exit 2
    fi
    say "installing from $BUNDLE"
    if $PYTHON -c "import json, sys; sys.exit(not json.load(open('$BUNDLE/bundle.json')).get('without'))" 2>/dev/null; then
        bundled=(--no-deps "$BUNDLE"/*.whl)
    else
        bundled=(--find-links "$BUNDLE" -r "$BUNDLE/requirements.txt")
    fi
    { $PYTHON -m pip install --no-index "${bundled[@]}" &&
      $PYTHON -m pip install --no-index --find-links "$BUNDLE" --no-deps -e . ; } >>"$OUT/gpu_session.log" 2>&1 \
        || { say "install failed: see gpu_session.log"; tail -20 "$OUT/gpu_session.log"; exit 1; }
    $PYTHON -m pip list 2>/dev/null | grep -i -E "^(torch|torchrl|tensordict|gymnasium|mujoco|hydra-core|numpy) " >>"$OUT/gpu_session.log"
fi
$PYTHON -c "import torch, cbop_torchrl, gymnasium.envs.mujoco; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name() if torch.cuda.is_available() else '')" | tee -a "$OUT/gpu_session.log"

# 2. The CUDA tests (and the device-placement and host-sync tests, which run on CUDA too).
if ! skipped tests && [ ! -f "$STATE/tests.done" ]; then
    say "CUDA tests"
    $PYTHON -m pytest -q -n 0 -p no:cacheprovider -rs tests/test_cuda.py \
        tests/test_device_placement.py tests/test_host_syncs.py >"$OUT/cuda_tests.log" 2>&1
    status=$?
    tail -3 "$OUT/cuda_tests.log" | tee -a "$OUT/gpu_session.log"
    if [ $status -eq 0 ]; then
        touch "$STATE/tests.done" && rm -f "$STATE/tests.failed"
    else
        touch "$STATE/tests.failed" && say "CUDA tests failed (exit $status): cuda_tests.log"
    fi
fi

# 3. The speed benchmark at the paper's sizes.
if ! skipped bench && [ ! -f "$STATE/bench.done" ]; then
    say "scripts/bench.py --device cuda"
    # shellcheck disable=SC2086  # BENCH_ARGS: extra options, one per word
    if $PYTHON scripts/bench.py --device cuda ${BENCH_ARGS:-} --json "$OUT/bench_cuda.json" >"$OUT/bench_cuda.log" 2>&1; then
        cp "$OUT/bench_cuda.json" "$STATE/bench_cuda.json" && touch "$STATE/bench.done"
    else
        say "bench failed: bench_cuda.log"
    fi
    grep -A10 "^== paper" "$OUT/bench_cuda.log" | tee -a "$OUT/gpu_session.log"
fi

# 4. Slices of the preset: one run per (set, seed) of $DATASETS x $SEEDS, all at once on the
#    one GPU (the eager step is bound by the host's launches and the evaluations run on the
#    CPU, so runs side by side use GPU time one run leaves idle), each with RUN_THREADS torch
#    threads (default: the cores shared out). learning.py stops at a checkpoint before its
#    budget and may need up to 90 s past it to stop a stage without a budget check
#    (KILL_GRACE_S + SIGINT).
# A run's label from its own overrides: the last part of each key and its value, joined by
# "-" (estimator.psi=2 -> psi2; agent.eta=0.5 estimator.psi=2 -> eta0.5-psi2).
overrides_label() {
    local label="" override key part
    for override in "$@"; do
        key=${override%%=*}
        part="${key##*.}${override#*=}"
        part=$(echo "$part" | tr -c 'A-Za-z0-9._\n' '_' | tr -d '\n')
        label="${label:+$label-}$part"
    done
    echo "$label"
}
# 4'. GRID=<set>: that set's psi grid x seeds as one job of runs with snapshots and no
#    evaluation in the window (benchmarks/gpu_grid.sh, its settings PSIS, SEEDS,
#    SNAPSHOT_INTERVAL), in place of the slices; $OUT/grid.tgz holds the snapshots.
if [ -n "${GRID:-}" ] && ! skipped slices; then
    prepare_data "$GRID" || exit 2
    grid_min=$(echo "$(minutes_left)" | awk '{printf "%d", $1 - 1.5}')
    if [ "$grid_min" -ge 1 ]; then
        GRID_SET=$GRID MAX_MINUTES=$grid_min PRESET=$PRESET OVERRIDES=$OVERRIDES OUT=$OUT STATE=$STATE \
            PYTHON=$PYTHON STEPS=${GRID_STEPS:-} bash benchmarks/gpu_grid.sh || say "the grid job failed: grid.log"
    else
        say "no time left for the grid in this call ($(minutes_left) min); run the same command again"
    fi
    SKIP="$SKIP slices"
fi
if ! skipped slices; then
    # The runs: (set, seed, own overrides, label) for each RUNS word, else DATASETS x SEEDS.
    run_sets=() run_seeds=() run_overrides=() run_labels=() run_algos=()
    if [ -n "${RUNS:-}" ]; then
        read -r -a words <<<"$RUNS"
        for word in "${words[@]}"; do
            IFS=: read -r -a fields <<<"$word"
            if [ "${#fields[@]}" -lt 2 ] || ! [[ "${fields[1]}" =~ ^[0-9]+$ ]]; then
                say "RUNS: '$word' is not set:seed[:override...] (e.g. hopper-medium-replay-gen:0:estimator.psi=2)"
                exit 2
            fi
            own=() algo=$ALGO
            for field in "${fields[@]:2}"; do  # algo=<name> picks the run's algorithm
                if [[ $field == algo=* ]]; then algo=${field#algo=}; else own+=("$field"); fi
            done
            run_sets+=("${fields[0]}") run_seeds+=("${fields[1]}") run_algos+=("$algo")
            run_overrides+=("${own[*]}")
            own_label=$(overrides_label "${own[@]}")
            run_labels+=("$LABEL${LABEL:+${own_label:+-}}$own_label")
        done
    else
        read -r -a seeds <<<"$SEEDS"
        read -r -a sets <<<"$DATASETS"
        for set in "${sets[@]}"; do
            for seed in "${seeds[@]}"; do
                run_sets+=("$set") run_seeds+=("$seed") run_overrides+=("") run_labels+=("$LABEL")
                run_algos+=("$ALGO")
            done
        done
    fi
    for set in $(printf '%s\n' "${run_sets[@]}" | sort -u); do prepare_data "$set" || exit 2; done
    if [ -f "$STATE/tests.failed" ] && [[ " $OVERRIDES ${run_overrides[*]} " == *" cuda_graph=true "* ]]; then
        # The captured step is unchecked on this machine: the runs still give their curves.
        OVERRIDES="${OVERRIDES/cuda_graph=true/cuda_graph=false}"
        for i in "${!run_overrides[@]}"; do
            run_overrides[i]="${run_overrides[i]/cuda_graph=true/cuda_graph=false}"
        done
        say "the CUDA tests failed: the slices run the eager step (cuda_graph=false)"
    fi
    # The name of run i: its log, its folder in runs.tgz (<set>/[<algo>-]seed<k>[-<own label>],
    # the algorithm named unless it is CBOP).
    run_name() {
        local prefix=""
        [ "${run_algos[$1]}" != cbop ] && prefix="${run_algos[$1]}-"
        echo "${prefix}seed${run_seeds[$1]}${run_overrides[$1]:+-$(overrides_label ${run_overrides[$1]})}"
    }
    # The variant of run i, by the rule of benchmarks/learning.py's variant_name:
    # <algo>[-<preset>][-<label>], no preset for cpu.
    run_variant() {
        local preset_part=-$PRESET label=${run_labels[$1]}
        [ "$PRESET" = cpu ] && preset_part=""
        echo "${run_algos[$1]}$preset_part${label:+-$label}"
    }
    runs=${#run_sets[@]}
    threads=${RUN_THREADS:-$(( $(nproc) / runs > 0 ? $(nproc) / runs : 1 ))}
    mkdir -p "$STATE/logs"
    slice_min=$(echo "$(minutes_left)" | awk '{printf "%.2f", $1 - 2.0}')
    if awk "BEGIN {exit !($slice_min >= 1)}"; then
        what=${RUNS:+$RUNS}
        say "slices of the $PRESET preset: $runs run(s) at once (${what:-$DATASETS x seeds $SEEDS}, $threads thread(s) each), --max-minutes $slice_min"
        pids=()
        for i in "${!run_sets[@]}"; do
            set=${run_sets[i]} seed=${run_seeds[i]} label=${run_labels[i]}
            # shellcheck disable=SC2086  # the overrides: one Hydra override per word
            $PYTHON benchmarks/learning.py --preset "$PRESET" --datasets "$set" --algos "${run_algos[i]}" \
                --seeds "$seed" --threads "$threads" \
                --epochs $((STEPS / STEPS_PER_EPOCH)) --steps-per-epoch "$STEPS_PER_EPOCH" \
                --eval-interval "$EVAL_INTERVAL" \
                ${label:+--label "$label"} ${START_STATES:+--start-states "$START_STATES"} \
                --results "$STATE/results" --max-minutes "$slice_min" \
                $OVERRIDES ${run_overrides[i]} >>"$STATE/logs/$set-$(run_name "$i").log" 2>&1 &
            pids+=($!)
        done
        failed=0
        for pid in "${pids[@]}"; do wait "$pid" || failed=$((failed + 1)); done
        for i in "${!run_sets[@]}"; do
            set=${run_sets[i]} name=$(run_name "$i")
            say "$set ${name/seed/seed }: $(grep -E '^\[bench\] (finished|slice ended|FAILED|the --max-minutes|done )' \
                "$STATE/logs/$set-$name.log" | tail -1)"
        done
        [ "$failed" -eq 0 ] || say "$failed run(s) exited with an error: their logs are in runs.tgz"
    else
        say "no time left for a slice in this call ($(minutes_left) min); run the same command again"
    fi
    # Everything a run made but its checkpoints, in one archive (a lent machine returns at
    # most 8 files): <set>/seed<k>/ with logs/ (every scalar curve, for benchmarks/curves.py),
    # slices.json (the slice history), run.log (learning.py's output) and, once the run has
    # finished, summary.json.
    pack="$STATE/pack"
    rm -rf "$pack"
    for i in "${!run_sets[@]}"; do
        set=${run_sets[i]} seed=${run_seeds[i]} name=$(run_name "$i") variant=$(run_variant "$i")
        dest="$pack/$set/$name"
        mkdir -p "$dest"
        [ -f "$STATE/logs/$set-$name.log" ] && cp "$STATE/logs/$set-$name.log" "$dest/run.log"
        run_dir=$(ls -d "$CBOP_TORCHRL_CACHE"/benchmark_runs/"$set"/*/"$PRESET"/"$variant"/seed"$seed" 2>/dev/null | head -1)
        if [ -n "$run_dir" ]; then
            [ -f "$run_dir/slices.json" ] && cp "$run_dir/slices.json" "$dest/"
            [ -d "$run_dir/logs" ] && cp -r "$run_dir/logs" "$dest/logs"
        fi
        summary="$STATE/results/$set/$variant/seed$seed.json"
        [ -f "$summary" ] && cp "$summary" "$dest/summary.json" && say "$set ${name/seed/seed } finished: summary.json"
    done
    tar czf "$OUT/runs.tgz" -C "$pack" .
fi
say "done in $(( $(date +%s) - START )) s; run the same command again to continue"
