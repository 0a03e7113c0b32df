"""Prints the generated benchmark sets' sizes and statistics next to D4RL's.

    python benchmarks/dataset_stats.py                      # <cache>/generated/<name>.hdf5
    python benchmarks/dataset_stats.py path/to/file.hdf5    # any generated file

One markdown row per file: transitions (D4RL's for the same name), episodes, mean
episode return (normalized), fraction of terminal transitions, and from the
provenance file the behaviour policy (checkpoint step, normalized score on its
recorded evaluation episodes), SAC steps trained and generation wall time.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cbop_torchrl.data.generate import (
    D4RL_TRANSITIONS,
    dataset_statistics,
    load_json,
    read_d4rl_hdf5,
)
from cbop_torchrl.io import cache_dir
from cbop_torchrl.registry import get_family

DEFAULT_NAMES = (
    "hopper-medium-replay-gen",
    "hopper-medium-gen",
    "walker2d-medium-replay-gen",
    "walker2d-medium-gen",
)
HEADER = (
    "| dataset | transitions (D4RL) | episodes | mean return (normalized) | terminals "
    "| behaviour policy: step, normalized (episodes) | SAC steps | wall time |\n"
    "|---|---|---|---|---|---|---|---|"
)


def row(path: Path) -> str:
    """The markdown row of one generated file."""
    arrays, metadata = read_d4rl_hdf5(path)
    family = get_family(str(metadata["family"]))
    stats = dataset_statistics(arrays, family)
    provenance = load_json(path.with_suffix(".provenance.json"))
    name = path.name.removesuffix(".hdf5")
    d4rl = D4RL_TRANSITIONS.get(name.removesuffix("-gen"))
    policy = (
        f"{provenance['policy_step']:,}, {provenance['policy_normalized_score']:.1f} "
        f"({provenance.get('policy_eval_episodes', '?')})"
    )
    minutes = provenance["wall_time_s"]["total"] / 60
    return (
        f"| {name} | {stats['transitions']:,} ({f'{d4rl:,}' if d4rl else '-'}) "
        f"| {stats['episodes']:,} | {stats['episode_return_mean']:.1f} "
        f"({stats['episode_normalized_score_mean']:.1f}) | {stats['terminal_fraction']:.4f} "
        f"| {policy} | {provenance.get('sac_steps_trained', provenance['sac_total_steps']):,} "
        f"| {minutes:.0f} min |"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", type=Path, help="generated .hdf5 files")
    args = parser.parse_args(argv)
    paths = args.files or [cache_dir("generated") / f"{name}.hdf5" for name in DEFAULT_NAMES]
    missing = [str(path) for path in paths if not path.is_file()]
    if missing:
        print(
            f"dataset_stats.py: no such file(s): {', '.join(missing)}; generate them with "
            "`bash benchmarks/make_datasets.sh` or pass the paths of generated .hdf5 files.",
            file=sys.stderr,
        )
        return 2
    print(HEADER)
    for path in paths:
        print(row(path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
