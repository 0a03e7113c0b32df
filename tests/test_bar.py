"""benchmarks/bar.py: the results bar read from rows.json and the per-seed summaries."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import bar

SHA = "a" * 64


def write_set(results: Path, dataset: str, finals: dict[str, float], **cbop_seed) -> None:
    """rows.json with one reset row per variant (3 seeds) and CBOP's three seed summaries."""
    rows = [
        {
            "variant": name,
            "measure": "reset",
            "seeds": [0, 1, 2],
            "final": final,
            "dataset_sha256": SHA[:12],
        }
        for name, final in finals.items()
    ]
    (results / dataset).mkdir(parents=True)
    (results / dataset / "rows.json").write_text(json.dumps({"sha256": SHA, "rows": rows}))
    (results / dataset / "cbop").mkdir()
    for seed in range(3):
        summary = {
            "seed": seed,
            "dataset_provenance": {"sha256": SHA},
            "final_normalized_score": finals["cbop"],
            "best_normalized_score": cbop_seed.get("best", finals["cbop"]),
            "analysis": {"conservatism": {"overestimation": cbop_seed.get("gap", -10.0)}},
        }
        (results / dataset / "cbop" / f"seed{seed}.json").write_text(json.dumps(summary))


def baselines(best: float) -> dict[str, float]:
    return {"bc": best - 3, "td3bc": best - 2, "iql": best - 1, "cql": best}


def verdict(results: Path) -> tuple[list[bar.Check], str]:
    checks = bar.check_bar(results, "cbop", "reset")
    return checks, bar.render(checks, "cbop", "reset").strip().splitlines()[-1]


def test_the_bar_holds_when_cbop_leads_on_two_sets_and_ties_the_third(tmp_path):
    write_set(tmp_path, bar.SETS[0], {"cbop": 30.0, **baselines(24.0)})
    write_set(tmp_path, bar.SETS[1], {"cbop": 20.0, **baselines(15.0)})
    write_set(tmp_path, bar.SETS[2], {"cbop": 10.0, **baselines(10.0)})
    checks, line = verdict(tmp_path)
    assert line == "The bar holds.", [c for c in checks if not c.holds]


def test_each_condition_can_fail(tmp_path):
    write_set(tmp_path, bar.SETS[0], {"cbop": 30.0, **baselines(24.0)}, gap=+3.0)
    write_set(tmp_path, bar.SETS[1], {"cbop": 20.0, **baselines(16.0)}, best=40.0)
    write_set(tmp_path, bar.SETS[2], {"cbop": 9.0, **baselines(10.0)})
    checks, line = verdict(tmp_path)
    failed = {(c.where, c.what) for c in checks if not c.holds}
    assert failed == {
        (bar.SETS[0], "Q - MC < 0 at the end, every seed"),
        (bar.SETS[1], "final >= 0.8 x best, every seed"),
        (bar.SETS[2], "at least every baseline"),
        ("all sets", "best baseline + 5 on 2 sets"),  # leads +6, +4, -1
    }
    assert line == "The bar does not hold (4 of 25 fail)."


def test_a_summary_of_another_file_and_a_missing_row_are_reported(tmp_path):
    write_set(tmp_path, bar.SETS[0], {"cbop": 30.0, **baselines(24.0)})
    stale = tmp_path / bar.SETS[0] / "cbop" / "seed0.json"
    summary = json.loads(stale.read_text())
    summary.update(dataset_provenance={"sha256": "b" * 64}, best_normalized_score=99.0)
    stale.write_text(json.dumps(summary))  # made on another file: not read
    rows_path = tmp_path / bar.SETS[0] / "rows.json"
    rows = json.loads(rows_path.read_text())
    old_cbop = {**rows["rows"][0], "final": 99.0, "dataset_sha256": "b" * 12}
    rows["rows"].insert(0, old_cbop)  # a row of an earlier file: not the one checked
    rows_path.write_text(json.dumps(rows))
    write_set(tmp_path, bar.SETS[1], {"cbop": 20.0, "bc": 1.0, "td3bc": 1.0, "iql": 1.0})
    checks, _ = verdict(tmp_path)
    by_name = {(c.where, c.what): c for c in checks}
    assert by_name[(bar.SETS[0], "final >= 0.8 x best, every seed")].detail == "1.00, 1.00"
    assert by_name[(bar.SETS[0], "at least every baseline")].detail.startswith("cbop 30.0,")
    assert not by_name[(bar.SETS[1], "cql: 3 seeds")].holds
    assert by_name[(bar.SETS[2], "rows")].detail == "no rows.json"
    assert bar.main(["--results", str(tmp_path / "none")]) == 1


def test_one_set_can_name_its_own_cbop_row(tmp_path, capsys):
    for dataset in bar.SETS:
        write_set(tmp_path, dataset, {"cbop": 20.0, **baselines(10.0)})
    hopper = tmp_path / bar.SETS[0]
    rows = json.loads((hopper / "rows.json").read_text())
    rows["rows"] = [
        {**row, "variant": "cbop-starts"} if row["variant"] == "cbop" else row
        for row in rows["rows"]
    ]
    (hopper / "rows.json").write_text(json.dumps(rows))
    (hopper / "cbop").rename(hopper / "cbop-starts")
    earlier = ["--results", str(tmp_path), "--measure", "reset", "--protocol", "20k"]
    assert bar.main(earlier) == 0
    assert "The bar does not hold" in capsys.readouterr().out  # hopper has no "cbop" row
    own = f"{bar.SETS[0]}=cbop-starts"
    assert bar.main([*earlier, "--cbop", "cbop", own]) == 0
    out = capsys.readouterr().out
    assert "The bar holds." in out and "cbop-starts 20.0" in out


def test_a_bad_cbop_row_is_a_clear_error(tmp_path, capsys):
    write_set(tmp_path, bar.SETS[0], {"cbop": 20.0, **baselines(10.0)})
    for argv in (["--cbop", "hopper=cbop"], ["--cbop", "cbop", "cbop-m10"]):
        with pytest.raises(SystemExit) as exit:
            bar.main(["--results", str(tmp_path), *argv])
        assert exit.value.code == 2, argv
        assert "--cbop" in capsys.readouterr().err


def test_every_row_gives_one_line_per_cbop_row_with_what_it_fails(tmp_path, capsys):
    write_set(tmp_path, bar.SETS[0], {"cbop": 30.0, **baselines(24.0)})
    hopper = tmp_path / bar.SETS[0]
    rows = json.loads((hopper / "rows.json").read_text())
    cbop = next(row for row in rows["rows"] if row["variant"] == "cbop")
    rows["rows"].append({**cbop, "variant": "cbop-m10", "final": 20.0, "seeds": [0]})
    for row in rows["rows"]:
        row["last10"] = row["final"] - 1
    (hopper / "rows.json").write_text(json.dumps(rows))
    (hopper / "cbop-m10").mkdir()
    summary = json.loads((hopper / "cbop" / "seed0.json").read_text())
    summary.update(final_normalized_score=20.0, best_normalized_score=40.0)
    summary["analysis"]["conservatism"]["overestimation"] = 7.5
    (hopper / "cbop-m10" / "seed0.json").write_text(json.dumps(summary))

    assert bar.main(["--results", str(tmp_path), "--measure", "reset", "--every-row"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| hopper")]
    assert lines == [
        f"| {bar.SETS[0]} | cbop | 0, 1, 2 | 30.0 | 29.0 | +6.0 | 1.00 | -10.0 | none |",
        f"| {bar.SETS[0]} | cbop-m10 | 0 | 20.0 | 19.0 | -4.0 | 0.50 | +7.5 | cbop-m10: 3 seeds; "
        "at least every baseline; final >= 0.8 x best, every seed; "
        "Q - MC < 0 at the end, every seed |",
    ]
