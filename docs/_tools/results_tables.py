"""The results figures that appear on several pages, generated from one source.

The source is the benchmark's summaries (``benchmarks/results/<dataset>/<variant>/seed*.json``)
read with the report's functions (:mod:`cbop_torchrl.evaluation.summaries` and
:mod:`cbop_torchrl.evaluation.report`), the same ones that
write ``benchmarks/results/report/``. A page holds a generated block between

    <!-- generated: NAME (python docs/_tools/results_tables.py --write) -->
    ...
    <!-- end: NAME -->

and ``python docs/_tools/results_tables.py --write`` rewrites every block of README.md and the
docs pages from the summaries there are; ``--check`` (and tests/test_docs_results_tables.py)
fails when one differs. Blocks:

- ``headline-50k``: the 50,000-step protocol's rows (``<algo>-50k``), each row's final by its
  protocol (the last 4 evaluations) from ``rows.json``, with the lowest and highest seed's and
  the seeds run of 5 (:func:`long_headline_markdown`); the report's ``headline.md`` opens with
  the same table, made from the summaries.
- ``headline``: the earlier protocol's (20,000 CBOP steps): each algorithm's final score per
  dataset, with the lowest and highest seed's and the number of seeds, the data's behaviour
  policy and size (:func:`~cbop_torchrl.evaluation.report.headline_markdown`).
- ``datasets``: the sets the results were measured on, from the generator's provenance that
  each summary stores (transitions, episodes, behaviour policy, file).
- ``rows``: every row (algorithm or configuration) of every set on its current file, on both
  measures (reset and start states), with the seeds and 95% intervals of
  ``benchmarks/results/<dataset>/rows.json`` (``python benchmarks/learning.py --rows``).
- ``status`` (README.md) and ``status-site`` (the site's pages, links relative to docs/): at
  most :data:`STATUS_BULLETS` bullets of at most :data:`STATUS_WORDS` words, what is faithful,
  shown, not shown and on which data, from ``benchmarks/bar.py``'s verdict on each set's
  headline rows and ``rows.json``'s resolution (:func:`status_markdown`).
- ``first-run`` and ``first-run-output``: the first command's measured time with its CPU, and
  what it printed, each line explained (``benchmarks/first_run.json``).
- ``bar``: the one definition of the bar CBOP is held to and of the statistic every claim uses,
  made from ``benchmarks/bar.py``'s constants (:func:`bar_markdown`). ``--write`` also writes it
  to ``docs/_snippets/bar.md``, which the docs pages include (``--8<-- "bar.md"``,
  pymdownx.snippets); the README, which GitHub shows without includes, holds it as a block.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
PAGES = (
    ROOT / "README.md",
    ROOT / "docs" / "index.md",
    ROOT / "docs" / "results.md",
    ROOT / "docs" / "datasets.md",
    ROOT / "docs" / "getting-started.md",
    ROOT / "docs" / "cbop.md",
    ROOT / "docs" / "earlier.md",
    ROOT / "docs" / "speed.md",
)
FIRST_RUN = ROOT / "benchmarks" / "first_run.json"
SIDE_BY_SIDE_CPU = ROOT / "benchmarks" / "bench_side_by_side_cpu.json"
"""The README's first command, timed once from a fresh clone: its time, CPU and output."""
STATUS_BULLETS = 4
STATUS_WORDS = 30
"""The status is at most this many bullets of at most this many words each."""
SNIPPETS = ROOT / "docs" / "_snippets"
"""Generated text the docs pages include whole (pymdownx.snippets' ``base_path``)."""
BLOCK = re.compile(
    r"(<!-- generated: (?P<name>[\w-]+) \(python docs/_tools/results_tables.py --write\) -->\n)"
    r"(?P<body>.*?)"
    r"(<!-- end: (?P=name) -->)",
    re.S,
)


def _bar_constants() -> dict:
    """``benchmarks/bar.py``'s sets, seeds, margin and share: the bar as it is checked."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from benchmarks import bar as module

    names = ("SETS", "SEEDS", "MARGIN", "MARGIN_SETS", "KEEP")
    return {name: getattr(module, name) for name in names}


def bar_markdown() -> str:
    """The bar and the statistic, in words, from the constants the bar's checks use
    (:mod:`benchmarks.bar_long` and :mod:`cbop_torchrl.evaluation.protocol`; the earlier bar's
    from ``benchmarks/bar.py``)."""
    from cbop_torchrl.evaluation import protocol

    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from benchmarks import bar_long

    c = _bar_constants()
    sets = len(c["SETS"])
    words = {1: "one", 2: "two", 3: "three"}
    return (
        f"**The bar** CBOP is held to (`python benchmarks/bar.py` checks it condition by "
        f"condition, on each measure; declared in the notebook's Experiment 63): "
        f"on the {words.get(sets, sets)} `*-medium-replay-gen` sets, "
        f"{protocol.LONG_SEEDS} seeds a row, CBOP trained for {protocol.LONG_STEPS:,} steps "
        f"(`{bar_long.CBOP_ROW}`) and the baselines on their papers' recipes for as many "
        f"gradient steps as CBOP's whole pipeline (BC + FQE + CBOP; rows `<algo>-50k`),\n\n"
        f"1. CBOP's final score is at least every baseline's, on every set;\n"
        f"2. it is at least the best baseline's + {bar_long.MARGIN:g}, on at least "
        f"{words.get(bar_long.MARGIN_SETS, bar_long.MARGIN_SETS)} set;\n"
        f"3. it is at least its own BC start (the mean over seeds of the step-0 evaluation), "
        f"on every set;\n"
        f"4. on every seed, Q - MC < 0 at the end: the critics' value of the policy's actions "
        f"is below the true discounted return (Monte-Carlo) from 100 dataset states.\n\n"
        f"**The statistic.** A run's *final score* is the mean of its last "
        f"{protocol.LONG_FINAL_WINDOW} evaluations (one every 2,500 steps: the last 10,000 "
        f"steps), normalized (0 = random, 100 = D4RL's expert), on the *reset measure* (10 "
        f"episodes from `env.reset()`); a row's final is the mean over its seeds. The "
        f"*start-state final* (one episode from each of 100 fixed dataset states restored in "
        f"the simulator, less noisy) stands beside it. Two rows are said to differ only where "
        f"their finals differ by more than their resolution, t(0.975, df) x the root of the sum "
        f"of their squared standard errors over seeds, with Welch's df (`rows.json`'s `rule`); "
        f"a row of one seed has no resolution.\n\n"
        f"**The earlier protocol** (20,000 CBOP steps, {c['SEEDS']} seeds, the final the mean "
        f"of the last {protocol.EARLIER_FINAL_WINDOW} evaluations, `python benchmarks/bar.py "
        f"--protocol 20k`) asked for the best baseline's + {c['MARGIN']:g} on "
        f"{words.get(c['MARGIN_SETS'], c['MARGIN_SETS'])} sets and a final of at least "
        f"{c['KEEP']:g} x each run's best evaluation; the tables of 20,000-step rows are "
        f"judged by it.\n"
    )


def headline() -> dict[str, dict[str, str]]:
    """Each set's headline rows, ``dataset -> algorithm -> variant``
    (:func:`cbop_torchrl.evaluation.headline.headline_rows`) under the earlier protocol: the
    rows the report's ``curves_20k_<set>.png`` plots too."""
    from cbop_torchrl.evaluation.headline import headlines_in

    return headlines_in([RESULTS])


def summaries() -> list[dict]:
    """The benchmark's summaries, each set's current file the one its ``rows.json`` names (the
    repository's copy of the set), not only the file of its most recent run."""
    from cbop_torchrl.evaluation.headline import current_files_in
    from cbop_torchrl.evaluation.summaries import load_summaries

    return load_summaries([RESULTS], analysis=False, current=current_files_in([RESULTS]))


def datasets_markdown(found: list[dict], rows: dict[str, dict[str, str]]) -> str:
    """The sets of the headline (its rows' runs): size, behaviour policy, file."""
    from cbop_torchrl.evaluation.headline import headline_of
    from cbop_torchrl.evaluation.report import file_versions

    lines = [
        "| dataset | transitions | episodes | the data's mean episode score | behaviour policy "
        "(medium), normalized | file (sha256) |",
        "|---|---|---|---|---|---|",
    ]
    for dataset in sorted({s["dataset"] for s in found}):
        provenances = [
            s["dataset_provenance"]
            for s in found
            if s["dataset"] == dataset
            and s["variant"] in headline_of(rows, dataset).values()
            and s.get("dataset_provenance")
        ]
        if not provenances:
            continue
        p = provenances[0]
        lines.append(
            f"| {dataset} | {int(p['transitions']):,} | {int(p['episodes']):,} | "
            f"{float(p['episode_normalized_score_mean']):.1f} | "
            f"{float(p['policy_normalized_score']):.1f} | {file_versions(provenances)} |"
        )
    return "\n".join(lines) + "\n"


def _score(row: dict | None, key: str) -> str:
    if row is None:
        return ""
    if row[f"{key}_ci95"] is None:  # one seed: no interval over seeds
        return f"{row[key]:.1f} [1 seed]"
    low, high = row[f"{key}_ci95"]
    return f"{row[key]:.1f} [{low:.1f}, {high:.1f}]"


def superseded(name: str) -> bool:
    """Whether a row is an earlier configuration's: made on an earlier file of its set (named
    ``VARIANT (file SHA)``) or at the earlier preset (``<row>-dyn15``)."""
    return " (file " in name or "-dyn15" in name


def rows_markdown(results: Path = RESULTS, part: str = "all") -> str:
    """One table per set of its ``rows.json``: each row's final and last-10 on both measures.

    ``part``: ``current`` leaves out the :func:`superseded` rows (the results page's table),
    ``earlier`` keeps only those (the earlier configurations' page), ``all`` keeps every row.

    Rows made on an earlier file of the set (another sha256 than the current file's, the one
    ``rows.json`` names) are named with that file and come after the current file's rows;
    within each, the baselines first (in :data:`BASELINES` order), then CBOP's rows by name.
    An earlier file's row with the same seeds and numbers as the current file's row of its
    variant (the same runs, summarized for both files) is left out, and a line under the
    table says so.
    """
    from cbop_torchrl.evaluation.summaries import BASELINES

    def row_order(name: str) -> tuple[bool, int, str]:
        variant = name.split(" (file ")[0]
        rank = BASELINES.index(variant) if variant in BASELINES else len(BASELINES)
        return (variant != name, rank, name)

    parts = []
    for path in sorted(results.glob("*/rows.json")):
        rows = json.loads(path.read_text())
        current = str(rows["sha256"])[:12]
        by_name: dict[str, dict[str, dict]] = {}
        for row in rows["rows"]:
            file = row["dataset_sha256"]
            name = row["variant"] if file == current else f"{row['variant']} (file {file})"
            by_name.setdefault(name, {})[row["measure"]] = row
        repeated = []
        for name in list(by_name):
            variant = name.split(" (file ")[0]
            earlier = variant != name and variant in by_name
            if earlier and _same_runs(by_name[name], by_name[variant]):
                repeated.append(name)
                del by_name[name]
        keep = {"all": lambda n: True, "current": lambda n: not superseded(n)}.get(part, superseded)
        order = sorted((name for name in by_name if keep(name)), key=row_order)
        if part == "current":
            repeated = []
        parts += [
            f"**{rows['dataset']}** (file sha256 {current})",
            "",
            "| row | seeds | reset final [95% interval] | reset last 10 [95% interval] | "
            "start-state final [95% interval] | start-state last 10 [95% interval] |",
            "|---|---|---|---|---|---|",
        ]
        for name in order:
            measures = by_name[name]
            seeds = sorted({seed for row in measures.values() for seed in row["seeds"]})
            reset, starts = measures.get("reset"), measures.get("starts")
            parts.append(
                f"| {name} | {', '.join(map(str, seeds))} | {_score(reset, 'final')} | "
                f"{_score(reset, 'last10')} | {_score(starts, 'final')} | "
                f"{_score(starts, 'last10')} |"
            )
        if repeated:
            names = ", ".join(name.split(" (file ")[0] for name in repeated)
            files = ", ".join(sorted({name.split(" (file ")[1].rstrip(")") for name in repeated}))
            parts += [
                "",
                f"Not repeated: {names} on the earlier file {files}. Those are the same runs as "
                f"the rows above (the same seeds and scores): the runs were made on that file and "
                f"summarized again for the current one, which holds the same transitions.",
            ]
        parts.append("")
    return "\n".join(parts)


def _same_runs(earlier: dict[str, dict], current: dict[str, dict]) -> bool:
    """Whether an earlier file's row repeats the current file's (same seeds and numbers)."""
    reset_a, reset_b = earlier.get("reset"), current.get("reset")
    if reset_a is None or reset_b is None:
        return False
    keys = ("seeds", "final", "last10")
    return all(reset_a.get(k) == reset_b.get(k) for k in keys)


SHORT = {
    d: d.split("-", 1)[0]
    for d in (
        "hopper-medium-replay-gen",
        "walker2d-medium-replay-gen",
        "halfcheetah-medium-replay-gen",
    )
}


def _relation(rows: dict, cbop: str, baseline: str) -> tuple[str, dict, dict] | None:
    """``above``, ``level with`` or ``below``: CBOP's reset final against a baseline's, by their
    resolution (:func:`~cbop_torchrl.evaluation.protocol.resolution`, Welch's t over the
    seeds; a row of one seed has none, and is never above or below); None where a row is
    missing."""
    from cbop_torchrl.evaluation.headline import current_file
    from cbop_torchrl.evaluation.protocol import resolution as row_resolution

    file = current_file(rows)
    found = {
        r["variant"]: r
        for r in rows["rows"]
        if r["measure"] == "reset" and r.get("dataset_sha256") == file
    }
    a, b = found.get(cbop), found.get(baseline)
    if a is None or b is None:
        return None
    resolution = row_resolution(a.get("final_per_seed") or [], b.get("final_per_seed") or [])
    if resolution is None:
        return "level with", a, b
    lead = a["final"] - b["final"]
    word = "above" if lead > resolution else "below" if lead < -resolution else "level with"
    return word, a, b


def status_markdown(rows_of: dict[str, dict[str, str]], prefix: str) -> str:
    """The status: faithful, shown, not shown, on which data; ``prefix`` before docs' links."""
    from cbop_torchrl.evaluation.headline import SETS, load_rows
    from cbop_torchrl.evaluation.summaries import ALGO_NAMES, BASELINES

    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from benchmarks import bar, bar_long
    from cbop_torchrl.evaluation import protocol

    seeds = bar.SEEDS
    cbop_rows = {d: rows_of[d]["cbop"] for d in SETS if d in rows_of}
    checks = bar.check_bar(RESULTS, cbop_rows, "reset")
    shown = []
    for dataset, cbop in cbop_rows.items():
        rows = load_rows(RESULTS, dataset)
        relations = [_relation(rows, cbop, rows_of[dataset][b]) for b in BASELINES]
        present = [r for r in relations if r is not None]
        if not present:
            continue
        word, a, best = max(present, key=lambda r: r[2]["final"])
        name = ALGO_NAMES[best["variant"].split("-")[0]]
        if len(a["seeds"]) >= seeds and word != "below":
            shown.append(
                f"{word} {name}, the best baseline, on {SHORT.get(dataset, dataset)} "
                f"({a['final']:.1f} against {best['final']:.1f})"
            )
    q_holds = [c for c in checks if c.what.startswith("Q - MC") and c.holds]
    long_shown = _long_comparisons(SETS, BASELINES, ALGO_NAMES)
    long_checks = bar_long.check_long_bar(RESULTS, "reset")
    long_failed = sum(not c.holds for c in long_checks)
    made = sum(
        len(list((RESULTS / d / (a + protocol.LONG_SUFFIX)).glob("seed*.json")))
        for d in SETS
        for a in ("cbop", *BASELINES)
    )
    total = len(SETS) * (1 + len(BASELINES)) * protocol.LONG_SEEDS
    steps = sorted({int(s["gradient_steps"]) for s in _headline_cbop_runs(cbop_rows)})
    bullets = [
        f"**Faithful to the paper:** the h-step targets, the posterior over horizons and the LCB "
        f"target, tested against the equations written as loops "
        f"([the algorithm]({prefix}algorithm.md)).",
        f"**Shown** (20,000 steps, {seeds} seeds, reset measure): CBOP "
        + ("; ".join(shown) if shown else "level with or above its best baseline on no set yet")
        + (", Q below the true return on every seed." if shown and q_holds else "."),
        _within_words(
            f"**Not shown:** the [50,000-step bar]({prefix}results.md#the-bar-and-the-statistic)"
            + (
                f": {long_failed} of {len(long_checks)} conditions fail; {made} of {total} runs "
                "made"
                if long_failed
                else ": every condition holds"
            ),
            "; of the rows complete so far, CBOP ",
            long_shown,
        ),
        f"**On which data:** D4RL look-alikes this project generates, not D4RL's files; CPU "
        f"preset, {'/'.join(f'{n:,}' for n in steps)} CBOP steps; the paper's sizes need a "
        f"[GPU]({prefix}gpu.md).",
    ]
    return "\n".join(f"- {bullet}" for bullet in bullets) + "\n"


def _within_words(head: str, joint: str, clauses: list[str]) -> str:
    """``head``, then ``joint`` and as many of ``clauses`` as keep it within
    :data:`STATUS_WORDS` (the results page lists them all), then a full stop."""
    kept: list[str] = []
    for clause in clauses:
        if words(head + joint + "; ".join([*kept, clause]) + ".") > STATUS_WORDS:
            break
        kept.append(clause)
    return head + (joint + "; ".join(kept) if kept else "") + "."


def _long_comparisons(sets: tuple[str, ...], baselines: tuple[str, ...], names: dict) -> list[str]:
    """CBOP's 50,000-step row against each baseline's where both have every seed of the
    protocol: ``above``/``level with``/``below`` by their resolution, per set."""
    from cbop_torchrl.evaluation import protocol
    from cbop_torchrl.evaluation.headline import load_rows

    cbop = "cbop" + protocol.LONG_SUFFIX
    found = []
    for dataset in sets:
        rows = load_rows(RESULTS, dataset)
        if rows is None:
            continue
        for baseline in baselines:
            relation = _relation(rows, cbop, baseline + protocol.LONG_SUFFIX)
            if relation is None:
                continue
            word, a, b = relation
            if min(len(a["seeds"]), len(b["seeds"])) < protocol.LONG_SEEDS:
                continue
            found.append(
                f"{word} {names[baseline]} on {SHORT.get(dataset, dataset)} "
                f"({a['final']:.1f} against {b['final']:.1f})"
            )
    return found


def _headline_cbop_runs(cbop_rows: dict[str, str]) -> list[dict]:
    from cbop_torchrl.evaluation.headline import current_file, load_rows, seed_summaries

    runs = []
    for dataset, row in cbop_rows.items():
        found = load_rows(RESULTS, dataset)
        runs += seed_summaries(RESULTS, dataset, row, current_file(found))
    cbop_stage = [dict(r, gradient_steps=_cbop_steps(r)) for r in runs]
    return cbop_stage


def _cbop_steps(summary: dict) -> int:
    """The CBOP stage's gradient steps of a run (its curve's last step)."""
    curve = summary.get("curve") or [[summary["gradient_steps"], 0]]
    return int(max(step for step, _ in curve))


def words(bullet: str) -> int:
    """A bullet's words as a reader counts them: link targets and markup left out."""
    text = re.sub(r"\]\([^)]*\)", "]", bullet)
    return len(re.sub(r"[*`\[\]]", "", text).split())


LINE_MEANINGS = (
    ("task:", "the environment the policy is scored in, and the returns that score 0 and 100"),
    ("dynamics:", "the dynamics ensemble: members, elites (K), layers x width, epoch cap, batch"),
    ("bc:", "behaviour cloning of the actor, CBOP's starting policy"),
    ("fqe:", "fitted Q evaluation of that policy: the M critics' starting values"),
    (
        "cbop:",
        "the CBOP stage: steps, batch, psi (the LCB's pessimism), M critics, K elites, "
        "horizon H, the target, the rollouts' precision",
    ),
    ("eval:", "how the policy is scored: episodes, and when"),
    (
        "gradient steps in all",
        "the whole pipeline's budget, and a baseline trained for as many steps",
    ),
    ("estimator.psi=", "where psi came from: this project's offline choice for the set"),
    ("from the paper's table", "the keys left null, filled from the paper's table"),
    (
        "normalized score",
        "the result: the normalized score (0 random, 100 D4RL's expert) +- its "
        "std over the episodes, the raw return, E[h] (the posterior's expected "
        "horizon) at CBOP's start and end, the run's seconds",
    ),
    ("results:", "where the run's results.json is"),
)
"""What each line the first run prints says, by a phrase that line holds."""


def _meaning(line: str, first: bool) -> str:
    if first:
        return "the data, the preset, the seed, the device and its threads, the run directory"
    for phrase, meaning in LINE_MEANINGS:
        if phrase in line:
            return meaning
    raise ValueError(f"no meaning for the first run's line {line!r}: add it to LINE_MEANINGS")


def _minutes(seconds: float) -> str:
    minutes, rest = divmod(int(seconds), 60)
    return f"{minutes} min {rest} s" if minutes else f"{rest} s"


def side_by_side_markdown(path: Path = SIDE_BY_SIDE_CPU) -> str:
    """The CPU record of runs side by side against two one-thread processes, as a table."""
    if not path.is_file():
        name = SIDE_BY_SIDE_CPU.relative_to(ROOT)
        return f"Not measured on a CPU yet: `{name}` is made by the command above.\n"
    record = json.loads(path.read_text())
    machine = record["machine"]
    lines = [
        "| runs | how | step (all runs one step) | run-steps/s | x one run |",
        "|---|---|---|---|---|",
    ]
    for size in record["sizes"].values():
        for row in size["side_by_side"]:
            lines.append(
                f"| {row['runs']} | in turn, one process | {1000 * row['step_s']:.0f} ms | "
                f"{row['run_steps_per_s']:.1f} | {row['run_steps_per_s_ratio']:.2f} |"
            )
        if (other := size.get("two_processes")) is not None:
            lines.append(
                f"| {other['processes']} | one process each | - | {other['run_steps_per_s']:.1f} | "
                f"{other['run_steps_per_s_ratio']:.2f} |"
            )
    lines += [
        "",
        f"Measured by `{record['command']}` on a {machine['nproc']}-core {machine['cpu_model']} "
        f"({record['steps']} timed steps per run, one torch thread per run).",
    ]
    return "\n".join(lines) + "\n"


def first_run_markdown(record: dict) -> str:
    """One sentence: the first command's measured time, on which CPU, and its score."""
    return (
        f"Measured from a fresh clone with an empty cache ({record['date']}, "
        f"{record['cpu']}): the set-up {_minutes(record['setup_s'])}, then the run "
        f"{_minutes(record['run_s'])}, ending at a normalized score of "
        f"{record['normalized_score']:.1f} after a short CBOP stage.\n"
    )


def first_run_output_markdown(record: dict) -> str:
    """What the first run printed, then each line's meaning."""
    stdout = record["stdout"]
    lines = ["```text", *stdout, "```", "", "| line | what it says |", "|---|---|"]
    for index, line in enumerate(stdout):
        key = " ".join(line.removeprefix("[cbop]").split()[:3]).replace("|", "/")
        lines.append(f"| {index + 1}: `{key} ...` | {_meaning(line, index == 0)} |")
    stages = ", ".join(f"{name} {_minutes(t)}" for name, t in record["stages_s"].items())
    lines += [
        "",
        f"Its stages took {stages}; the CBOP stage ran {record['cbop_steps_per_s']:g} gradient "
        f"steps/s with {record['rollout_dtype']} rollouts; peak memory "
        f"{record['peak_rss_mib']} MiB.",
    ]
    return "\n".join(lines) + "\n"


HYPERPARAMETERS = (
    ("estimator.horizon", "H, the longest model rollout of a target"),
    ("estimator.psi", "psi, the lower confidence bound's width (pessimism)"),
    ("estimator.mode", "the target: lcb (the paper's), map, fixed or quantile"),
    ("agent.num_qvalue_nets", "M, the Q ensemble's size"),
    ("agent.critic_hidden_sizes", "the Q-networks' hidden widths"),
    ("agent.hidden_sizes", "the actor's hidden widths"),
    ("dynamics.num_members", "the dynamics ensemble's members"),
    ("dynamics.num_elites", "K, the members the rollouts use (the best on held-out data)"),
    ("dynamics.max_epochs", "the dynamics model's epoch cap"),
    ("bc.converge", "behaviour cloning fitted to held-out early stopping (the authors')"),
    ("bc.steps", "behaviour cloning's steps (CBOP's starting actor)"),
    ("fqe.converge", "each FQE round fitted to held-out early stopping (the authors')"),
    ("fqe.rounds", "FQE's rounds (null: one soft-target fit)"),
    ("fqe.steps", "fitted Q evaluation's steps (the critics' start)"),
    ("fqe.target_tau", "FQE's target-network rate"),
    ("agent.q_init", "the Q-networks' initialisation"),
    ("dynamics.separate_reward", "rewards from an ensemble of their own"),
    ("estimator.unbiased_variance", "the n - 1 variance over the M x K samples"),
    ("train.epochs", "CBOP's epochs (x train.steps_per_epoch gradient steps)"),
    ("train.steps_per_epoch", "gradient steps per epoch"),
    ("train.batch_size", "CBOP's batch"),
    ("agent.actor_lr", "the actor's learning rate"),
    ("agent.critic_lr", "the critics' learning rate"),
    ("agent.tau", "the critics' target-network rate"),
    ("agent.gamma", "the discount"),
)
"""The hyperparameters of the CBOP page's table: each config key and what it sets."""


def _show(value: object) -> str:
    from omegaconf import ListConfig, OmegaConf

    if isinstance(value, ListConfig):
        value = OmegaConf.to_container(value)
    value = getattr(value, "value", value)  # an enum choice
    if isinstance(value, bool):
        return str(value).lower()  # as an override writes it
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, list | tuple):
        return "x".join(map(str, value)) if len(set(value)) > 1 else f"{len(value)}x{value[0]}"
    return str(value)


def _null(key: str, preset: str) -> str:
    """What a null value of ``key`` resolves to under ``preset``."""
    from cbop_torchrl.config.paper import (
        GENERATED_PSI,
        PAPER_DEFAULT_QVALUE_NETS,
        PAPER_QVALUE_NETS,
        PAPER_SHARED,
    )

    if key == "estimator.psi":
        from cbop_torchrl.evaluation.headline import SETS

        # The benchmark's set order, not the dict's: a test that deletes and restores an
        # entry (monkeypatch.delitem) moves it to the end for the rest of its worker.
        order = {name: index for index, name in enumerate(SETS)}
        names = sorted(GENERATED_PSI, key=lambda name: (order.get(name, len(order)), name))
        chosen = ", ".join(f"{d.split('-')[0]} {GENERATED_PSI[d]:g}" for d in names)
        own = f"the set's offline choice ({chosen}); " if preset == "cpu" else ""
        return f"null: {own}the paper's D4RL table for a D4RL set"
    if key == "agent.num_qvalue_nets":
        families = ", ".join(f"{f} {n}" for f, n in PAPER_QVALUE_NETS.items())
        return f"null: {families}, {PAPER_DEFAULT_QVALUE_NETS} elsewhere"
    if key == "agent.critic_hidden_sizes":
        return "null: the actor's widths"
    if key == "dynamics.max_epochs":
        return "null: until the held-out loss stops improving"
    if key in PAPER_SHARED:
        return f"null: {_show(PAPER_SHARED[key])}"
    return "null"


#: Keys a preset does not use: the switch that makes them unused.
UNUSED_WHEN = {
    "bc.steps": "bc.converge",
    "fqe.steps": "fqe.converge",
    "fqe.target_tau": "fqe.converge",
}


def hyperparameters_markdown() -> str:
    """The paper's preset beside the CPU preset, key by key, from the composed configs."""
    from omegaconf import OmegaConf

    from cbop_torchrl.apps.api import compose_config

    presets = {p: compose_config([f"preset={p}"]) for p in ("paper", "cpu")}
    lines = [
        "| key | what it sets | the paper (`preset=paper`) | the CPU preset (`preset=cpu`) |",
        "|---|---|---|---|",
    ]
    for key, meaning in HYPERPARAMETERS:
        cells = []
        for preset, config in presets.items():
            value = OmegaConf.select(config, key)
            switch = UNUSED_WHEN.get(key)
            if switch is not None and OmegaConf.select(config, switch):
                cells.append(f"unused ({switch}=true)")
            else:
                cells.append(_null(key, preset) if value is None else _show(value))
        lines.append(f"| `{key}` | {meaning} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines) + "\n"


def reproduce_markdown(rows_of: dict[str, dict[str, str]], found: list[dict]) -> str:
    """The commands that make the headline rows again: one per set and set of seeds."""
    from cbop_torchrl.evaluation.headline import HEADLINE_ALGOS

    lines = ["```bash"]
    for dataset in sorted(rows_of):
        by_seeds: dict[tuple[int, ...], list[str]] = {}
        for algo in HEADLINE_ALGOS:
            variant = rows_of[dataset][algo]
            seeds = tuple(
                sorted(
                    int(s["seed"])
                    for s in found
                    if (s["dataset"], s["variant"]) == (dataset, variant)
                )
            )
            if seeds:
                by_seeds.setdefault(seeds, []).append(variant)
        for seeds, variants in by_seeds.items():
            lines.append(
                f"python benchmarks/learning.py --datasets {dataset} --algos "
                f"{' '.join(variants)} --seeds {' '.join(map(str, seeds))} --threads 1"
            )
    lines.append("```")
    return "\n".join(lines) + "\n"


def long_headline_markdown(results: Path = RESULTS) -> str:
    """The 50,000-step protocol's headline: each ``<algo>-50k`` row's final (``rows.json``,
    the reset measure on the set's current file) with its seeds' range and count against the
    protocol's seeds; "not run" where a row has no run. The report's own table
    (:func:`cbop_torchrl.evaluation.headline_tables.long_headline_markdown`, its finals from
    the summaries), from ``rows.json``'s per-seed finals."""
    from cbop_torchrl.evaluation.headline_tables import long_headline_markdown as table
    from cbop_torchrl.evaluation.headline_tables import rows_finals

    return table(rows_finals(results))


def blocks(found: list[dict] | None = None) -> dict[str, str]:
    from cbop_torchrl.evaluation.report import headline_markdown

    found = summaries() if found is None else found
    rows = headline()
    record = json.loads(FIRST_RUN.read_text())
    return {
        "headline": headline_markdown(found, rows),
        "headline-50k": long_headline_markdown(),
        "datasets": datasets_markdown(found, rows),
        "rows": rows_markdown(part="current"),
        "rows-earlier": rows_markdown(part="earlier"),
        "bar": bar_markdown(),
        "status": status_markdown(rows, "docs/"),
        "status-site": status_markdown(rows, ""),
        "first-run": first_run_markdown(record),
        "first-run-output": first_run_output_markdown(record),
        "hyperparameters": hyperparameters_markdown(),
        "reproduce": reproduce_markdown(rows, found),
        "side-by-side-cpu": side_by_side_markdown(),
    }


def render(text: str, generated: dict[str, str]) -> str:
    """``text`` with each generated block's body replaced by its current content."""

    def replace(match: re.Match) -> str:
        return f"{match[1]}\n{generated[match['name']]}\n{match[4]}"

    return BLOCK.sub(replace, text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite the pages' blocks")
    parser.add_argument("--check", action="store_true", help="fail when a block is stale")
    args = parser.parse_args(argv)
    generated = blocks()
    stale = []
    snippet = SNIPPETS / "bar.md"
    if not snippet.is_file() or snippet.read_text() != generated["bar"]:
        stale.append(snippet.relative_to(ROOT).as_posix())
        if args.write:
            SNIPPETS.mkdir(exist_ok=True)
            snippet.write_text(generated["bar"])
    for page in PAGES:
        text = page.read_text()
        new = render(text, generated)
        if new != text:
            stale.append(page.relative_to(ROOT).as_posix())
            if args.write:
                page.write_text(new)
    if stale and not args.write:
        command = "python docs/_tools/results_tables.py --write"
        print(f"stale generated blocks in {', '.join(stale)}: {command}")
        return 1
    print("rewrote " + ", ".join(stale) if stale else "every generated block is current")
    return 0


if __name__ == "__main__":
    sys.exit(main())
