"""The README's code must run as written (the SACLoss swap example)."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)


def test_sacloss_swap_example_runs_and_reports_a_horizon(capsys):
    swap = [block for block in python_blocks(README.read_text()) if "from_sac_loss" in block]
    assert len(swap) == 1, "the README should hold exactly one SACLoss swap example"
    namespace: dict = {}
    exec(compile(swap[0], "README.md", "exec"), namespace)
    estimator = namespace["loss"].value_estimator
    assert type(estimator).__name__ == "CBOPValueEstimator"
    assert "E[h] =" in capsys.readouterr().out
    diagnostics = estimator.last_diagnostics
    assert diagnostics["weights"].shape == (11,)
    assert abs(float(diagnostics["weights"].sum()) - 1.0) < 1e-5
