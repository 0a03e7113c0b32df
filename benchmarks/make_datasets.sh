#!/usr/bin/env bash
# The learning benchmark's datasets: hopper, walker2d and halfcheetah medium-replay-gen and medium-gen at
# D4RL level (the medium policy scores >= 30 normalized on its recorded 10-episode evaluation).
#
#   bash benchmarks/make_datasets.sh                        # into <cache>/generated
#   FAMILIES=walker2d bash benchmarks/make_datasets.sh      # one family
#
# One SAC run per family gives both kinds: it trains until a checkpoint's 10-episode
# deterministic return reaches a third of D4RL's expert score (cbop_torchrl/configs/collect.yaml:
# medium_reference=d4rl, stop_at_medium=true; SAC_STEPS is only a cap). Medium = rollouts of
# that checkpoint, medium-replay = the replay buffer up to it. Each command is resumable:
# rerun it after a kill, or with a larger SAC_STEPS to continue a run that hit the cap.
# The benchmark reads the repository's copy of a set where it keeps one (benchmarks/set_files.py):
# this script makes the same file only on the CPU kind that made the copy (docs/datasets.md).
# Extra arguments are passed to scripts/collect.py. Wall time per family is printed and
# appended to benchmarks/results/make_datasets.log.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}
SAC_STEPS=${SAC_STEPS:-1000000}        # cap on the behaviour SAC's environment steps
ROLLOUTS=${ROLLOUTS:-200000}           # transitions of the medium rollouts (D4RL: 1M)
FAMILIES=${FAMILIES:-"hopper walker2d halfcheetah"}
mkdir -p benchmarks/results

for family in $FAMILIES; do
  start=$SECONDS
  "$PYTHON" scripts/collect.py env="$family" "kind=[medium-replay,medium]" seed=0 \
    sac.total_steps="$SAC_STEPS" rollout_transitions="$ROLLOUTS" "$@"
  line="$(date -u +%FT%TZ) $family sac.total_steps=$SAC_STEPS rollouts=$ROLLOUTS"
  line="$line wall_s=$((SECONDS - start)) nproc=$(nproc) load=$(cut -d' ' -f1-3 /proc/loadavg)"
  echo "$line" | tee -a benchmarks/results/make_datasets.log
done
