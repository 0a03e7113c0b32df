"""``eval.snapshot_interval``: snapshots at the right steps, atomically, across a kill and a resume.

The runs go through ``scripts/cbop.py`` at the debug preset (40 CBOP steps, a checkpoint
every 10) on the bundled demo data, with a snapshot every 15 steps: at 15, 30 and 40 (the
last step). The kill lands inside the write of step 30 (after the checkpoint at 30 is not
yet written: the snapshot hook runs before the checkpoint hook), so the resume starts at
step 20 and must write step 30 again, the same bytes as the uninterrupted run's.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from inprocess import run_program

from cbop_torchrl.envs.starts import START_STATES_SEED, pick_start_states
from cbop_torchrl.evaluation.analysis import load_cbop_loss
from cbop_torchrl.trainers.checkpoint import load_checkpoint, load_policy
from cbop_torchrl.trainers.conservatism import member_q_values
from cbop_torchrl.trainers.snapshots import SNAPSHOT_DIR, snapshot_path, snapshot_steps

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "cbop.py"
OVERRIDES = (
    "preset=debug", "progress=false", "estimator.rollout_dtype=float32",
    "eval.snapshot_interval=15",
)  # fmt: skip

# Runs scripts/cbop.py with torch.save patched to write half of step 30's snapshot into its
# temporary file and SIGKILL the process there.
DRIVER = """
import io, os, signal, sys, runpy
import torch
original = torch.save

def save(obj, f, *args, **kwargs):
    if "step30" in str(f):
        buffer = io.BytesIO()
        original(obj, buffer)
        with open(f, "wb") as handle:
            handle.write(buffer.getvalue()[: len(buffer.getvalue()) // 2])
        os.kill(os.getpid(), signal.SIGKILL)
    return original(obj, f, *args, **kwargs)

torch.save = save
script = sys.argv[1]
sys.argv = sys.argv[1:]
runpy.run_path(script, run_name="__main__")
"""


def run_here(run_dir: Path, cache: Path, *extra: str):
    argv = [*OVERRIDES, f"hydra.run.dir={run_dir}", *extra]
    return run_program("cbop", argv, {"CBOP_TORCHRL_CACHE": str(cache)})


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """An uninterrupted run with snapshots: (its run directory, its cache)."""
    root = tmp_path_factory.mktemp("snapshots")
    done = run_here(root / "run", root / "cache")
    assert done.returncode == 0, done.stderr[-3000:]
    return root / "run", root / "cache"


def test_snapshots_at_every_interval_and_the_last_step(
    reference: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir, cache = reference
    assert snapshot_steps(run_dir) == [15, 30, 40]
    assert sorted(p.name for p in (run_dir / SNAPSHOT_DIR).iterdir()) == [
        "step15.pt", "step30.pt", "step40.pt",
    ]  # fmt: skip
    checkpoint = load_checkpoint(run_dir / "checkpoint.pt")
    last = load_checkpoint(snapshot_path(run_dir, 40))
    assert last["step"] == 40
    assert last["training_config_hash"] == checkpoint["training_config_hash"]
    # the last snapshot's actor is the run's final policy (what FQE selection reads)
    final_policy = load_checkpoint(run_dir / "policy.pt")["actor"]
    assert final_policy.keys() == last["actor"].keys()
    assert all(torch.equal(final_policy[k], last["actor"][k]) for k in final_policy)
    actor, _, meta = load_policy(snapshot_path(run_dir, 40))
    assert meta["step"] == 40 and actor is not None

    monkeypatch.setenv("CBOP_TORCHRL_CACHE", str(cache))
    loss, config, data, _ = load_cbop_loss(run_dir)  # the checkpoint at step 40
    states = last["states"]
    expected = pick_start_states(data.get("observation"), 100, START_STATES_SEED)
    assert torch.equal(states["observation"], expected)
    critic = last["critic"]
    members = config.agent.num_qvalue_nets
    assert critic["q_data"].shape == critic["q_policy"].shape == (members, 100)
    q_data = member_q_values(
        loss.qvalue_network, loss.qvalue_network_params, expected, states["action"]
    )
    torch.testing.assert_close(critic["q_data"], q_data)
    torch.testing.assert_close(critic["q_data_min"], q_data.min(0).values)
    torch.testing.assert_close(critic["q_policy_mean"], critic["q_policy"].mean(0))
    # snapshots before the end hold other weights
    first = load_checkpoint(snapshot_path(run_dir, 15))
    assert any(not torch.equal(first["actor"][k], last["actor"][k]) for k in last["actor"])


def test_training_is_unchanged_by_the_snapshots(
    tmp_path: Path, reference: tuple[Path, Path]
) -> None:
    run_dir, cache = reference
    done = run_here(tmp_path / "plain", cache, "eval.snapshot_interval=0")
    assert done.returncode == 0, done.stderr[-3000:]
    assert not (tmp_path / "plain" / SNAPSHOT_DIR).exists()
    plain = load_checkpoint(tmp_path / "plain" / "policy.pt")["actor"]
    snapped = load_checkpoint(run_dir / "policy.pt")["actor"]
    assert all(torch.equal(plain[k], snapped[k]) for k in plain)


def test_a_kill_inside_a_snapshot_write_leaves_no_file_and_the_resume_writes_each_once(
    tmp_path: Path, reference: tuple[Path, Path]
) -> None:
    reference_dir, cache = reference
    run_dir = tmp_path / "run"
    env = {**os.environ, "CBOP_TORCHRL_CACHE": str(cache), "WANDB_MODE": "offline"}
    killed = subprocess.run(
        [sys.executable, "-c", DRIVER, str(SCRIPT), *OVERRIDES, f"hydra.run.dir={run_dir}"],
        env=env, capture_output=True, text=True, timeout=600, cwd=ROOT,
    )  # fmt: skip
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert snapshot_steps(run_dir) == [15]  # step 30's half-written file never took its name
    assert not snapshot_path(run_dir, 30).exists()
    names = [p.name for p in (run_dir / SNAPSHOT_DIR).iterdir()]
    assert any(name.startswith(".step30.pt.") for name in names), names  # killed mid-write
    assert load_checkpoint(run_dir / "checkpoint.pt")["step"] == 20

    done = run_here(run_dir, cache)
    assert done.returncode == 0, done.stderr[-3000:]
    assert snapshot_steps(run_dir) == [15, 30, 40]
    visible = (p.name for p in (run_dir / SNAPSHOT_DIR).iterdir() if not p.name.startswith("."))
    assert sorted(visible) == [
        "step15.pt", "step30.pt", "step40.pt",
    ]  # fmt: skip
    for step in (15, 30, 40):
        resumed = load_checkpoint(snapshot_path(run_dir, step))
        alone = load_checkpoint(snapshot_path(reference_dir, step))
        assert resumed["step"] == step
        assert all(torch.equal(resumed["actor"][k], alone["actor"][k]) for k in alone["actor"])
        for key in ("q_data", "q_policy", "policy_action"):
            assert torch.equal(resumed["critic"][key], alone["critic"][key]), (step, key)
