"""The README's and the quick-start pages' code must run as written.

The README's Python blocks and those of docs/torchrl.md run here (the SACLoss swap examples);
the Python API example, in the README and docs/python-api.md, is run by tests/test_api.py.
"""

import re
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
QUICK_STARTS = [README, ROOT / "docs" / "torchrl.md"]


def python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)


@pytest.mark.parametrize("page", QUICK_STARTS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_sacloss_swap_example_runs_and_reports_a_horizon(page: Path, capsys):
    swap = [block for block in python_blocks(page.read_text()) if "from_sac_loss" in block]
    assert len(swap) == 1, f"{page.name} should hold exactly one SACLoss swap example"
    namespace: dict = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exec(compile(swap[0], str(page), "exec"), namespace)
    # a reader copying the example sees no warning (TorchRL's "No target network updater")
    assert not [w for w in caught if "target network updater" in str(w.message)]
    estimator = namespace["loss"].value_estimator
    assert type(estimator).__name__ == "CBOPValueEstimator"
    assert "E[h] =" in capsys.readouterr().out
    diagnostics = estimator.last_diagnostics
    assert diagnostics["weights"].shape == (11,)
    assert abs(float(diagnostics["weights"].sum()) - 1.0) < 1e-5


def test_readme_is_a_short_front_door_with_the_setup_commands_first():
    text = README.read_text()
    assert len(text.splitlines()) <= 200
    first_block = re.search(r"```bash\n(.*?)```", text, flags=re.DOTALL)[1]
    assert "bash setup.sh && .venv/bin/python scripts/cbop.py" in first_block
    assert "bash setup.sh && .venv/bin/python -m pytest -q" in first_block


def test_the_python_api_example_is_the_same_in_the_readme_and_its_page():
    page = python_blocks((ROOT / "docs" / "python-api.md").read_text())
    readme = python_blocks(README.read_text())
    assert [block for block in readme if "compose_config" in block] == page
