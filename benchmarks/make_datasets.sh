#!/usr/bin/env bash
# The learning benchmark's datasets: hopper and walker2d medium-replay-gen and medium-gen.
#
#   bash benchmarks/make_datasets.sh                 # into $CBOP_TORCHRL_CACHE/generated
#   SAC_STEPS=1000000 bash benchmarks/make_datasets.sh out_dir=/data/gen   # D4RL-sized run
#
# One SAC run per family gives both kinds (medium = rollouts of the checkpoint nearest a
# third of the run's best return, medium-replay = the replay buffer up to it). Each command
# is resumable: rerun it after a kill. Extra arguments are passed to scripts/collect.py.
# Wall time per family is printed and appended to benchmarks/results/make_datasets.log.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}
SAC_STEPS=${SAC_STEPS:-100000}         # environment steps of the behaviour SAC run
ROLLOUTS=${ROLLOUTS:-100000}           # transitions of the medium rollouts
FAMILIES=${FAMILIES:-"hopper walker2d"}
mkdir -p benchmarks/results

for family in $FAMILIES; do
  start=$SECONDS
  "$PYTHON" scripts/collect.py env="$family" "kind=[medium-replay,medium]" seed=0 \
    sac.total_steps="$SAC_STEPS" rollout_transitions="$ROLLOUTS" "$@"
  line="$(date -u +%FT%TZ) $family sac.total_steps=$SAC_STEPS rollouts=$ROLLOUTS"
  line="$line wall_s=$((SECONDS - start)) nproc=$(nproc) load=$(cut -d' ' -f1-3 /proc/loadavg)"
  echo "$line" | tee -a benchmarks/results/make_datasets.log
done
