#!/usr/bin/env bash
# One set's psi grid as one job: PSIS x SEEDS runs of scripts/cbop.py with snapshots and no
# evaluation inside the call, the snapshots brought back in one archive (docs/gpu.md):
#
#   GRID_SET=halfcheetah-medium-replay-gen bash benchmarks/gpu_grid.sh
#   GRID=halfcheetah-medium-replay-gen bash benchmarks/gpu_session.sh    # the same, as a step
#
# Every run trains with eval.interval=0 (no evaluation during training) and eval.episodes=1
# (the one end-of-run evaluation results.json needs costs one episode), and writes
# snapshots/step<k>.pt every SNAPSHOT_INTERVAL steps (the actor and the critics' Q at 100
# dataset states); `cbop-score paths=<the archive's folder>` scores them on the CPU afterwards.
# When scripts/cbop.py takes runs side by side (runs.seeds=[...] runs.psi=[...], each run in
# <run dir>/psi<P>-seed<S>), the grid is one process; otherwise the runs go one after another
# into the same folders. Either way every run stops at a checkpoint before the call's budget
# (the slice deadline, trainers/slicing.py) and the same command continues it; a finished run
# is skipped. Nothing here needs the internet.
#
# Settings (environment): GRID_SET (the set; its file is $CBOP_TORCHRL_CACHE/generated/<set>.hdf5),
# PSIS ("0.5 2 3 5"), SEEDS ("0 1 2"), PRESET (paper), STEPS ("": the preset's budget; else
# with STEPS_PER_EPOCH, 1000), SNAPSHOT_INTERVAL (2500), MAX_MINUTES (7: training budget of
# this call), PYTHON (python3), STATE (/tmp/cbop-gpu-session), OUT (./gpu-out), RUN_THREADS
# ("": torch's default), OVERRIDES ("": extra Hydra overrides of every run, e.g. device=cpu),
# SIDE_BY_SIDE (auto | 0: one run after another even where runs side by side are available).
# Comes back: $OUT/grid.tgz (<set>/psi<P>-seed<S>/ with config.json, data.json, snapshots/,
# logs/, results.json once finished; no checkpoint) and $OUT/grid.log.
set -uo pipefail
cd "$(dirname "$0")/.."
START=$(date +%s)
PYTHON=${PYTHON:-python3}
STATE=${STATE:-/tmp/cbop-gpu-session}
OUT=${OUT:-$PWD/gpu-out}
PRESET=${PRESET:-paper}
PSIS=${PSIS:-0.5 2 3 5}
SEEDS=${SEEDS:-0 1 2}
STEPS=${STEPS:-}
STEPS_PER_EPOCH=${STEPS_PER_EPOCH:-1000}
SNAPSHOT_INTERVAL=${SNAPSHOT_INTERVAL:-2500}
MAX_MINUTES=${MAX_MINUTES:-7}
OVERRIDES=${OVERRIDES:-}
export CBOP_TORCHRL_CACHE=${CBOP_TORCHRL_CACHE:-$STATE/cache}
export WANDB_MODE=offline PYTHONUNBUFFERED=1
mkdir -p "$OUT" "$STATE"
say() { echo "[gpu-grid $(date -u +%H:%M:%S)] $*" | tee -a "$OUT/grid.log"; }

if [ -z "${GRID_SET:-}" ]; then
    say "GRID_SET is not set: name the set, e.g. GRID_SET=halfcheetah-medium-replay-gen"; exit 2
fi
data="$CBOP_TORCHRL_CACHE/generated/$GRID_SET.hdf5"
if [ ! -f "$data" ]; then
    say "no file for $GRID_SET at $data: put the set's file there (benchmarks/set_files.py, docs/gpu.md)"
    exit 2
fi
read -r -a psis <<<"$PSIS"
read -r -a seeds <<<"$SEEDS"
root="$STATE/grid/$GRID_SET"
mkdir -p "$root"
# The slice deadline: each run stops right after the last checkpoint it can write before it.
export CBOP_TORCHRL_SLICE_DEADLINE=$((START + ${MAX_MINUTES%.*} * 60))
common=(env="$data" preset="$PRESET" progress=false eval.interval=0 eval.episodes=1
        eval.snapshot_interval="$SNAPSHOT_INTERVAL")
[ -n "$STEPS" ] && common+=(train.epochs=$((STEPS / STEPS_PER_EPOCH)) train.steps_per_epoch="$STEPS_PER_EPOCH")
[ -n "${RUN_THREADS:-}" ] && common+=(threads="$RUN_THREADS")
read -r -a extra <<<"$OVERRIDES"
common+=("${extra[@]}")
list() { local IFS=,; echo "[$*]"; }
side_by_side() {  # scripts/cbop.py takes runs.seeds / runs.psi (the runs' own config section)
    [ "${SIDE_BY_SIDE:-auto}" != 0 ] && $PYTHON -c "import importlib.util, sys
sys.exit(importlib.util.find_spec('cbop_torchrl.config.runs') is None)" 2>/dev/null
}
runs=$(( ${#psis[@]} * ${#seeds[@]} ))
failed=0
if side_by_side; then
    say "$GRID_SET: $runs runs side by side (psi $PSIS x seeds $SEEDS), snapshots every $SNAPSHOT_INTERVAL steps"
    $PYTHON scripts/cbop.py "${common[@]}" runs.seeds="$(list "${seeds[@]}")" \
        runs.psi="$(list "${psis[@]}")" hydra.run.dir="$root" >>"$STATE/grid-$GRID_SET.log" 2>&1
    status=$?
    [ $status -eq 0 ] || [ $status -eq 75 ] || failed=1
else
    say "$GRID_SET: $runs runs one after another (psi $PSIS x seeds $SEEDS), snapshots every $SNAPSHOT_INTERVAL steps"
    for seed in "${seeds[@]}"; do
        for psi in "${psis[@]}"; do
            if [ "$(date +%s)" -ge "$CBOP_TORCHRL_SLICE_DEADLINE" ]; then
                say "the budget is spent before psi $psi seed $seed: run the same command again"
                break 2
            fi
            $PYTHON scripts/cbop.py "${common[@]}" seed="$seed" estimator.psi="$psi" \
                hydra.run.dir="$root/psi$psi-seed$seed" >>"$STATE/grid-$GRID_SET.log" 2>&1
            status=$?
            case $status in
                0) say "psi $psi seed $seed: finished" ;;
                75) say "psi $psi seed $seed: stopped at a checkpoint (budget); run the same command again"
                    break 2 ;;
                *) say "psi $psi seed $seed: FAILED (exit $status), see the log in grid.tgz"; failed=1 ;;
            esac
        done
    done
fi
# Everything but the checkpoints, in one archive: <set>/psi<P>-seed<S>/.
pack="$STATE/grid-pack"
rm -rf "$pack"
mkdir -p "$pack/$GRID_SET"
for dir in "$root"/psi*-seed*; do
    [ -d "$dir" ] || continue
    dest="$pack/$GRID_SET/$(basename "$dir")"
    mkdir -p "$dest"
    for name in config.json data.json results.json slice_end.json snapshots logs; do
        [ -e "$dir/$name" ] && cp -r "$dir/$name" "$dest/"
    done
    say "$(basename "$dir"): $(ls "$dir/snapshots" 2>/dev/null | grep -c '^step') snapshot(s)$([ -f "$dir/results.json" ] && echo ', finished')"
done
cp "$STATE/grid-$GRID_SET.log" "$pack/$GRID_SET/run.log" 2>/dev/null
tar czf "$OUT/grid.tgz" -C "$pack" .
say "done in $(( $(date +%s) - START )) s; score on the CPU: cbop-score paths=<grid.tgz unpacked>/$GRID_SET"
exit $failed
