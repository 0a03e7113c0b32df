"""``cbop-report`` (``scripts/report.py``): the analysis report: results table, learning
curves and the paper's figures.

    cbop-report benchmarks/results                     # the committed summaries
    cbop-report runs/hopper-medium-replay-gen/cpu --out report/
    cbop-report multirun/ runs/x/cpu/default --no-analysis

Arguments are run directories (holding results.json), sweep directories or
folders of benchmark summaries, in any mix. Writes into --out: results.md/.csv
(normalized score mean +- std over seeds, final and best), runs.csv,
curves_<dataset>.png, horizon_<dataset>.png (E[h], paper Fig. 1 right),
rh_<dataset>_<variant>.png (R_h at one state, Fig. 5), share_<...>.png
(A/(A+B), Fig. 8), conservatism.md/.csv (Table 2), rliable.md/.json/.png
(IQM, optimality gap, probability of improvement; needs rliable) and
README_results.md (the README's results section). The checkpoint-based figures
come from a run directory's checkpoint, or from a summary that stored them.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from cbop_torchrl.config import ConfigError
from cbop_torchrl.data import DatasetError
from cbop_torchrl.envs import filter_env_warnings
from cbop_torchrl.evaluation.report import ReportError, load_summaries, write_report
from cbop_torchrl.trainers.checkpoint import CheckpointError
from cbop_torchrl.utils import unwritable_reason


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", help="run dirs, sweep dirs or summary folders")
    parser.add_argument("--out", default="report", help="output directory (default: report/)")
    parser.add_argument(
        "--no-analysis",
        action="store_true",
        help="do not load checkpoints of run directories (no R_h, A/(A+B), conservatism)",
    )
    parser.add_argument(
        "--figure-prefix",
        default=None,
        help="prefix of figure links in README_results.md (default: --out relative to cwd)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    filter_env_warnings()
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if (reason := unwritable_reason(args.out)) is not None:
        print(f"error: --out {args.out} cannot be written: {reason}", file=sys.stderr)
        return 2
    try:
        summaries = load_summaries(args.paths, analysis=not args.no_analysis)
        prefix = args.figure_prefix
        if prefix is None:
            prefix = os.path.relpath(args.out).rstrip("/") + "/"
        report = write_report(summaries, args.out, figure_prefix=prefix)
    except (ReportError, ConfigError, DatasetError, CheckpointError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(Path(args.out, "results.md").read_text(), end="")
    print(f"[report] {len(summaries)} runs; {len(report['files'])} files in {args.out}/")
    if report["rliable"] is None:
        print("[report] rliable is not installed: no IQM/optimality gap (pip install rliable)")
    return 0
