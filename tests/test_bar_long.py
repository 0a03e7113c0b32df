"""benchmarks/bar_long.py: the 50,000-step bar from rows.json and CBOP's per-seed summaries."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import bar, bar_long

SHA = "c" * 64
BASELINES = ("bc-50k", "td3bc-50k", "iql-50k", "cql-50k")


def write_set(
    results: Path,
    dataset: str,
    cbop: float,
    best_baseline: float,
    start: float = 5.0,
    gap: float = -10.0,
    seeds: int = 5,
    last_step: int = 50_000,
) -> None:
    """rows.json with the five -50k rows, and CBOP's per-seed summaries with their curves."""

    def row(variant: str, final: float) -> dict:
        per_seed = [final - 1, final + 1, final, final - 0.5, final + 0.5][:seeds]
        return {
            "variant": variant,
            "measure": "reset",
            "seeds": list(range(seeds)),
            "final": sum(per_seed) / seeds,
            "final_per_seed": per_seed,
            "dataset_sha256": SHA[:12],
        }

    finals = dict(
        zip(
            BASELINES,
            (best_baseline - 3, best_baseline - 2, best_baseline - 1, best_baseline),
            strict=True,
        )
    )
    rows = [row("cbop-50k", cbop), *(row(name, final) for name, final in finals.items())]
    (results / dataset / "cbop-50k").mkdir(parents=True)
    (results / dataset / "rows.json").write_text(json.dumps({"sha256": SHA, "rows": rows}))
    for seed in range(seeds):
        summary = {
            "seed": seed,
            "dataset_provenance": {"sha256": SHA},
            "curve": [[0, start], [last_step, cbop]],
            "analysis": {"conservatism": {"overestimation": gap}},
        }
        (results / dataset / "cbop-50k" / f"seed{seed}.json").write_text(json.dumps(summary))


def failed(results: Path) -> set[tuple[str, str]]:
    return {(c.where, c.what) for c in bar_long.check_long_bar(results, "reset") if not c.holds}


def test_the_long_bar_holds_with_one_set_ahead_by_the_margin(tmp_path: Path) -> None:
    write_set(tmp_path, bar.SETS[0], cbop=30.0, best_baseline=24.0)
    write_set(tmp_path, bar.SETS[1], cbop=20.0, best_baseline=20.0)
    write_set(tmp_path, bar.SETS[2], cbop=12.0, best_baseline=11.0)
    assert failed(tmp_path) == set()


def test_each_condition_of_the_long_bar_can_fail(tmp_path: Path) -> None:
    write_set(tmp_path, bar.SETS[0], cbop=28.0, best_baseline=24.0, gap=+2.0)
    write_set(tmp_path, bar.SETS[1], cbop=20.0, best_baseline=18.0, start=25.0)
    write_set(tmp_path, bar.SETS[2], cbop=9.0, best_baseline=11.0, seeds=3, last_step=20_000)
    assert failed(tmp_path) == {
        (bar.SETS[0], "Q - MC < 0 at the end, every seed"),
        (bar.SETS[1], "at least its BC start"),
        *((bar.SETS[2], f"{name}: 5 seeds") for name in ("cbop-50k", *BASELINES)),
        (bar.SETS[2], "cbop-50k: 50,000 steps"),
        (bar.SETS[2], "at least every baseline"),
        ("all sets", "best baseline + 5 on 1 set"),  # leads +4, +2, -2
    }


def test_a_lead_is_printed_beside_its_resolution(tmp_path: Path, capsys) -> None:
    for dataset in bar.SETS:
        write_set(tmp_path, dataset, cbop=30.0, best_baseline=24.0)
    assert bar.main(["--results", str(tmp_path), "--measure", "reset"]) == 0
    out = capsys.readouterr().out
    assert "(lead +6.0; resolution " in out and "The bar holds." in out
