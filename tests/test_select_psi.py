"""Offline selection by FQE: initial states, policy next actions, ranks, and the CLI.

The CLI test builds a sweep by hand: three "runs" on a dataset whose reward
is the mean action, each with a constant policy (action c everywhere), so
the true value of a policy grows with c and the FQE ranking is known.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import h5py
import pytest
import torch
from d4rl_files import write_d4rl_hdf5
from tensordict import TensorDict
from torch import nn

from cbop_torchrl.apps import select_psi as select_psi_program
from cbop_torchrl.data import load_dataset
from cbop_torchrl.evaluation.selection import (
    RunScore,
    SelectionFQEConfig,
    average_ranks,
    deterministic_actions,
    episode_starts,
    fit_policy_fqe,
    fqe_config_for_run,
    initial_state_value,
    policy_fqe_data,
    rank_runs,
    spearman_rho,
)
from cbop_torchrl.io import atomic_json_dump
from cbop_torchrl.modules.actor_critic import make_actor
from cbop_torchrl.registry import get_family
from cbop_torchrl.trainers.checkpoint import policy_metadata, save_policy

ROOT = Path(__file__).resolve().parents[1]
select_psi = select_psi_program.main

HOPPER = get_family("hopper")
OBS, ACT = 11, 3  # hopper's observation and action sizes
HIDDEN = [16, 16]


@pytest.fixture(autouse=True)
def restore_torch_threads():
    """select_psi threads= and the FQE test set torch's global thread count; put it back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def constant_actor(value: float, hidden: list[int] = HIDDEN):
    """A hopper actor whose deterministic action is ``value`` in every dimension."""
    torch.manual_seed(0)
    actor = make_actor(OBS, ACT, tuple(hidden))
    last = [module for module in actor.modules() if isinstance(module, nn.Linear)][-1]
    with torch.no_grad():
        last.weight.zero_()
        last.bias.zero_()
        last.bias[:ACT] = math.atanh(value)
    return actor


def test_episode_starts_are_the_rows_after_done() -> None:
    done = torch.tensor([False, False, True, False, True, True, False]).unsqueeze(-1)
    data = TensorDict({("next", "done"): done}, batch_size=[7])
    assert episode_starts(data).tolist() == [True, False, False, True, False, True, True]


def test_policy_fqe_data_uses_the_policys_next_action() -> None:
    actor = constant_actor(0.5)
    observation = torch.randn(5, OBS)
    actions = deterministic_actions(actor, observation)
    assert torch.allclose(actions, torch.full((5, ACT), 0.5), atol=1e-5)

    actor = make_actor(OBS, ACT, tuple(HIDDEN))
    data = TensorDict(
        {
            "observation": torch.randn(5, OBS),
            "action": torch.rand(5, ACT),
            ("next", "observation"): torch.randn(5, OBS),
            ("next", "reward"): torch.ones(5, 1),
            ("next", "terminated"): torch.zeros(5, 1, dtype=torch.bool),
            ("next", "action"): torch.zeros(5, ACT),  # the dataset's: ignored
        },
        batch_size=[5],
    )
    rows = policy_fqe_data(data, actor)
    expected = deterministic_actions(actor, data.get(("next", "observation")))
    assert torch.equal(rows.get(("next", "action")), expected)
    assert rows.get("row").tolist() == [0, 1, 2, 3, 4]


def test_fqe_recovers_a_known_value(tmp_path: Path) -> None:
    """Reward 1 everywhere, no terminals, gamma 0.5: Q = 1 / (1 - 0.5) = 2 for any policy."""
    torch.set_num_threads(1)
    n = 256
    data = TensorDict(
        {
            "observation": torch.randn(n, OBS),
            "action": torch.rand(n, ACT) * 2 - 1,
            ("next", "observation"): torch.randn(n, OBS),
            ("next", "reward"): torch.ones(n, 1),
            ("next", "terminated"): torch.zeros(n, 1, dtype=torch.bool),
            ("next", "done"): torch.zeros(n, 1, dtype=torch.bool),
        },
        batch_size=[n],
    )
    actor = make_actor(OBS, ACT, tuple(HIDDEN))
    config = SelectionFQEConfig(
        steps=250, batch_size=64, lr=3e-3, hidden_sizes=[32, 32], gamma=0.5, tau=0.05
    )
    dims = (OBS, ACT)
    watched = []

    def watch(step: int, fit) -> None:
        if step % 50 == 0:
            watched.append(initial_state_value(fit, actor, data.get("observation")[:32]))

    loss = fit_policy_fqe(data, actor, *dims, config, seed=0, work_dir=tmp_path, on_step=watch)
    value = initial_state_value(loss, actor, data.get("observation")[:32])
    assert abs(value - 2.0) < 0.2, value
    # the hook sees the fit as it goes: rising toward the value, ending at the final fit
    assert len(watched) == 5 and watched[0] < watched[-2] and watched[-1] == value
    # the finished fit is cached: the same call loads it instead of training
    assert (tmp_path / "result.pt").is_file() and not (tmp_path / "partial.pt").exists()
    again = fit_policy_fqe(data, actor, *dims, config, seed=0, work_dir=tmp_path)
    assert initial_state_value(again, actor, data.get("observation")[:32]) == value


def test_fqe_of_a_run_uses_its_fqe_stage_target_rate_not_the_critics() -> None:
    """The CPU preset's 5,000 FQE steps are sized for fqe.target_tau=0.1 (about 500 sweeps); at
    the critic's agent.tau=0.005 the same steps make about 25, and the start states' value stays
    far below their returns."""
    config = {
        "fqe": {"steps": 5000, "batch_size": 256, "lr": 3e-4, "target_tau": 0.1},
        "agent": {"tau": 0.005, "gamma": 0.99, "hidden_sizes": [64, 64]},
    }
    fit = fqe_config_for_run(config)
    assert (fit.steps, fit.tau, fit.gamma, fit.hidden_sizes) == (5000, 0.1, 0.99, [64, 64])
    assert fqe_config_for_run(config, tau=0.02).tau == 0.02
    del config["fqe"]["target_tau"]  # a run written before the FQE stage had its own rate
    assert fqe_config_for_run(config).tau == 0.005


def test_ranks_and_spearman() -> None:
    assert average_ranks([3.0, 1.0, 2.0]) == [1.0, 3.0, 2.0]
    assert average_ranks([1.0, 2.0, 2.0, 0.0]) == [3.0, 1.5, 1.5, 4.0]
    assert spearman_rho([4.0, 3.0, 2.0, 1.0], [4.0, 3.0, 1.0, 2.0]) == pytest.approx(0.8)
    assert spearman_rho([1.0, 2.0, 3.0], [3.0, 2.0, 1.0]) == pytest.approx(-1.0)
    assert spearman_rho([1.0, 2.0, 3.0], [1.0, 1.0, 1.0]) is None
    assert spearman_rho([1.0], [2.0]) is None


def run_score(psi: float, seed: int, fqe: float, online: float | None, env: str = "d") -> RunScore:
    settings = {"estimator.psi": psi, "agent.gamma": 0.99, "train.epochs": 10}
    return RunScore(Path(f"/r/{psi}/{seed}"), env, "data", seed, settings, fqe, online, 10)


def test_rank_runs_groups_seeds_and_labels_what_differs() -> None:
    runs = [
        run_score(0.5, 0, fqe=1.0, online=30.0),
        run_score(0.5, 1, fqe=3.0, online=10.0),  # psi 0.5: FQE 2.0, online 20.0
        run_score(2.0, 0, fqe=5.0, online=5.0),
        run_score(5, 0, fqe=0.0, online=40.0),  # psi=5 and psi=5.0: one candidate
        run_score(5.0, 1, fqe=0.0, online=40.0),
        run_score(5.0, 0, fqe=9.0, online=None, env="other"),
    ]
    first, second = rank_runs(runs)
    assert [c.label for c in first.candidates] == [
        "estimator.psi=2.0",
        "estimator.psi=0.5",
        "estimator.psi=5",
    ]
    assert len(first.candidates[2].runs) == 2
    assert first.candidates[1].fqe_value == 2.0 and first.candidates[1].online_score == 20.0
    assert [run.seed for run in first.candidates[1].runs] == [0, 1]
    assert first.fqe_ranks == [1.0, 2.0, 3.0] and first.online_ranks == [3.0, 2.0, 1.0]
    assert first.rho == pytest.approx(-1.0)
    assert first.selected.label == "estimator.psi=2.0"
    # one run, not evaluated online: ranked, with no online ranking nor rho
    assert second.env == "other" and second.online_ranks is None and second.rho is None

    first.candidates[0].runs[0].policy_step = 5  # a run still training
    table = select_psi_program.format_ranking(first)
    assert "note: the policies were saved at different gradient steps (5 to 10)" in table
    assert "Spearman's rho (FQE vs online ranking): -1.00" in table
    assert "n/a (online scores missing" in select_psi_program.format_ranking(second)


def write_run(run_dir: Path, dataset: Path, psi: float, action: float, online: float) -> None:
    run_dir.mkdir(parents=True)
    config = {
        "env": str(dataset),
        "seed": 0,
        "preset": "debug",
        "estimator": {"psi": psi, "horizon": 2},
        "agent": {"hidden_sizes": HIDDEN, "gamma": 0.2, "tau": 0.1},
        "fqe": {"steps": 1, "batch_size": 1, "lr": 3e-3, "checkpoint_interval": 1000},
        "eval": {"episodes": 1},
    }
    atomic_json_dump(config, run_dir / "config.json")
    meta = policy_metadata(HOPPER, OBS, ACT, HIDDEN, dataset.stem, 40)
    save_policy(run_dir / "policy.pt", constant_actor(action), meta)
    atomic_json_dump({"normalized_score_mean": online}, run_dir / "results.json")


@pytest.fixture
def hand_made_sweep(tmp_path: Path) -> Path:
    """Three runs whose constant policies have known values (reward = mean action)."""
    dataset = tmp_path / "hopper-medium-tiny.hdf5"
    write_d4rl_hdf5(dataset, episode_lengths=[40] * 8, terminal_episodes=(), timeout_episodes=())
    with h5py.File(dataset) as file:
        rewards = file["actions"][:].mean(-1)
    write_d4rl_hdf5(
        dataset,
        episode_lengths=[40] * 8,
        terminal_episodes=(),
        timeout_episodes=(),
        edit={"rewards": rewards},
    )
    sweep = tmp_path / "sweep"
    # psi -> constant action (its value's order) and online score (another order)
    for psi, action, online in ((0.5, -0.8, 20.0), (2.0, 0.8, 30.0), (5.0, 0.0, 10.0)):
        write_run(sweep / "data" / f"estimator.psi={psi},seed=0", dataset, psi, action, online)
    return sweep


def test_select_psi_ranks_policies_by_their_offline_value(
    hand_made_sweep: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    report = tmp_path / "selection.json"
    arguments = [f"sweep_dir={hand_made_sweep}", "steps=150", "batch_size=128", "threads=1"]
    assert select_psi([*arguments, "progress=false", f"json={report}"]) == 0
    out = capsys.readouterr().out
    assert "selected by FQE: estimator.psi=2.0" in out
    assert "Spearman's rho (FQE vs online ranking): 0.50" in out

    (ranking,) = json.loads(report.read_text())
    labels = [c["label"] for c in ranking["candidates"]]
    assert labels == ["estimator.psi=2.0", "estimator.psi=5.0", "estimator.psi=0.5"]
    assert [c["online_rank"] for c in ranking["candidates"]] == [1.0, 3.0, 2.0]
    assert ranking["rho"] == pytest.approx(0.5)
    # the value of a constant action c with reward mean(a) and gamma 0.2 is c / 0.8
    for candidate, action in zip(ranking["candidates"], (0.8, 0.0, -0.8), strict=True):
        assert candidate["fqe_value"] == pytest.approx(action / 0.8, abs=0.25)
    data = load_dataset(ranking["env"])
    assert episode_starts(data).sum() == 8  # the FQE score averaged over the 8 episode starts


def test_select_psi_sweeps_its_own_settings_with_hydra(
    hand_made_sweep: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``-m`` over FQE budgets, one rankings file per job (an interpolation in json=), and
    nothing of Hydra's in the working directory; ``--cfg job`` shows the composed settings."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("CBOP_TORCHRL_CACHE", str(tmp_path / "cache"))
    argv = ["-m", f"sweep_dir={hand_made_sweep}", "steps=10,20", "threads=1", "progress=false",
            "json=fqe_${steps}.json"]  # fmt: skip
    assert select_psi(argv) == 0
    assert capsys.readouterr().out.count("selected by FQE:") == 2
    # The rankings, and the manifest naming them as select-psi's (docs/reliability.md).
    written = [".cbop-outputs.json", "fqe_10.json", "fqe_20.json"]
    assert sorted(path.name for path in work.iterdir()) == written
    for steps in (10, 20):
        (ranking,) = json.loads((work / f"fqe_{steps}.json").read_text())
        assert len(ranking["candidates"]) == 3
    assert select_psi(["sweep_dir=x", "steps=7", "--cfg", "job"]) == 0
    shown = capsys.readouterr().out
    assert "sweep_dir: x" in shown and "steps: 7" in shown and "qvalue_nets: 2" in shown
    assert sorted(path.name for path in work.iterdir()) == written


def test_select_psi_bad_input_exits_with_a_message(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    assert select_psi([f"sweep_dir={tmp_path / 'missing'}"]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert select_psi([f"sweep_dir={tmp_path}"]) == 2
    assert "no trained runs" in capsys.readouterr().err
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text("{}")  # a run that never saved a checkpoint
    assert select_psi([f"sweep_dir={tmp_path}"]) == 2
    assert "no trained runs" in capsys.readouterr().err
    (run / "checkpoint.pt").write_bytes(b"not a checkpoint")
    assert select_psi([f"sweep_dir={tmp_path}", "progress=false"]) == 2
    assert "names no dataset" in capsys.readouterr().err
    (run / "config.json").write_text(json.dumps({"env": "demo"}))
    assert select_psi([f"sweep_dir={tmp_path}", "progress=false"]) == 2
    assert "error:" in capsys.readouterr().err
