"""D4RL-recipe generator: a tiny SAC run writes valid, loadable, resumable datasets."""

from __future__ import annotations

import dataclasses
import importlib.util
import shlex
import subprocess
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from inprocess import run_program

from cbop_torchrl.data import load_dataset
from cbop_torchrl.data.collect_sac import SACConfig, SACRun, run_dir_for
from cbop_torchrl.data.generate import (
    GenerationRequest,
    dataset_file_name,
    generate_datasets,
    load_json,
    medium_reached,
    read_d4rl_hdf5,
    select_checkpoints,
)
from cbop_torchrl.registry import D4RL_KINDS, get_family

REPO = Path(__file__).resolve().parents[1]
CAP = 30  # a short episode cap so a few thousand steps hold many timeouts
TINY_SAC = SACConfig(
    total_steps=1_500,
    warmup_steps=500,
    frames_per_batch=250,
    checkpoint_every=500,
    eval_episodes=1,
    batch_size=32,
    hidden_sizes=(32, 32),
    max_episode_steps=CAP,
)


def tiny_request(root: Path, kinds=D4RL_KINDS) -> GenerationRequest:
    return GenerationRequest(
        family=get_family("hopper"),
        kinds=list(kinds),
        seed=3,
        sac=TINY_SAC,
        rollout_transitions=400,
        out_dir=root / "generated",
        runs_dir=root / "runs",
        command="pytest tiny run",
        progress=False,
    )


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """One thread, as scripts/collect.py uses: bit-reproducible and fast on a busy CPU."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, one_torch_thread):
    """All six kinds from one tiny hopper run, plus the request that made them."""
    root = tmp_path_factory.mktemp("collect")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CBOP_TORCHRL_CACHE", str(root / "cache"))
        request = tiny_request(root)
        paths = dict(zip(request.kinds, generate_datasets(request), strict=True))
        yield request, paths


def _episode_lengths_and_flags(terminals: np.ndarray, timeouts: np.ndarray):
    ends = np.flatnonzero(terminals | timeouts)
    return np.diff(ends, prepend=-1), terminals[ends], timeouts[ends]


@pytest.mark.parametrize("kind", D4RL_KINDS)
def test_files_load_and_follow_the_environment(tiny_run, kind, monkeypatch, tmp_path):
    monkeypatch.setenv("CBOP_TORCHRL_CACHE", str(tmp_path))
    request, paths = tiny_run
    path = paths[kind]
    assert path.name == dataset_file_name(request.family, kind) == f"hopper-{kind}-gen.hdf5"
    data = load_dataset(path)  # runs the data layer's validation
    arrays, metadata = read_d4rl_hdf5(path)
    n = len(arrays["rewards"])
    assert data.batch_size == torch.Size([n]) and n > 0
    assert torch.equal(data["observation"], torch.from_numpy(arrays["observations"]))
    for key in ("observations", "next_observations", "actions", "rewards", "infos/qpos"):
        assert arrays[key].dtype == np.float32
    assert arrays["terminals"].dtype == bool and arrays["timeouts"].dtype == bool

    # terminals are exactly the environment's termination of the real next observation
    family = request.family
    expected = family.termination_fn(torch.from_numpy(arrays["next_observations"])).numpy()
    np.testing.assert_array_equal(arrays["terminals"], expected)
    assert not (arrays["terminals"] & arrays["timeouts"]).any()
    # complete episodes only; a timeout ends exactly the episodes that reached the cap
    assert (arrays["terminals"] | arrays["timeouts"])[-1]
    lengths, ended_by_termination, ended_by_timeout = _episode_lengths_and_flags(
        arrays["terminals"], arrays["timeouts"]
    )
    assert (lengths <= CAP).all()
    np.testing.assert_array_equal(ended_by_timeout, (lengths == CAP) & ~ended_by_termination)
    # inside an episode the next observation is the following row's observation
    inside = ~(arrays["terminals"] | arrays["timeouts"])[:-1]
    np.testing.assert_array_equal(
        arrays["next_observations"][:-1][inside], arrays["observations"][1:][inside]
    )
    # hopper observations are qpos[1:] followed by the clipped qvel
    np.testing.assert_allclose(arrays["infos/qpos"][:, 1:], arrays["observations"][:, :5])
    np.testing.assert_allclose(
        np.clip(arrays["infos/qvel"], -10, 10), arrays["observations"][:, 5:], atol=1e-6
    )

    assert metadata["env_id"] == "Hopper-v4" and metadata["family"] == "hopper"
    assert metadata["kind"] == kind and metadata["seed"] == request.seed
    assert metadata["transitions"] == n and metadata["episodes"] == len(lengths)
    assert metadata["command"] == "pytest tiny run"


def test_kinds_follow_the_recipe(tiny_run):
    request, paths = tiny_run
    run = SACRun(
        run_dir_for(request.runs_dir, request.family, request.seed, request.sac),
        request.family,
        request.seed,
        request.sac,
    )
    evaluations = run.evaluations()
    assert [e["step"] for e in evaluations] == [500, 1000, 1500]
    medium, expert = select_checkpoints(evaluations, request.medium_fraction)
    arrays = {kind: read_d4rl_hdf5(paths[kind]) for kind in D4RL_KINDS}

    full, _ = arrays["full-replay"]
    replay, replay_meta = arrays["medium-replay"]
    # medium-replay is the buffer up to the medium checkpoint: a prefix of the full buffer
    assert len(replay["rewards"]) <= medium["step"] <= len(full["rewards"]) + CAP
    for key in full:
        np.testing.assert_array_equal(replay[key], full[key][: len(replay[key])])
    assert replay_meta["policy_step"] == medium["step"]
    assert np.isclose(replay_meta["policy_return"], medium["return"])
    # medium-expert is medium followed by expert
    stitched, stitched_meta = arrays["medium-expert"]
    for key in stitched:
        np.testing.assert_array_equal(
            stitched[key], np.concatenate([arrays["medium"][0][key], arrays["expert"][0][key]])
        )
    assert stitched_meta["expert_policy_step"] == expert["step"]
    assert arrays["expert"][1]["policy_step"] == expert["step"]
    assert np.isclose(
        arrays["expert"][1]["policy_normalized_score"],
        request.family.normalized_score(expert["return"]),
    )
    # the short cap makes some episodes of the random warm-up end by timeout
    assert full["timeouts"].any()
    # rollout kinds hold at most the requested number of transitions
    for kind in ("random", "medium", "expert"):
        assert request.rollout_transitions - CAP < len(arrays[kind][0]["rewards"]) <= 400


def test_medium_checkpoint_selection():
    evaluations = [{"step": 1000 * i, "return": r} for i, r in enumerate([10, 400, 900, 600], 1)]
    medium, expert = select_checkpoints(evaluations, 1 / 3)
    assert expert["step"] == 3000 and medium["step"] == 2000  # 400 is nearest 300
    hopper = get_family("hopper")  # a third of D4RL's expert score: 1078
    medium, _ = select_checkpoints(evaluations, 1 / 3, "d4rl", hopper)
    assert medium["step"] == 3000


def test_medium_floor_keeps_only_checkpoints_that_score_it():
    hopper = get_family("hopper")  # normalized 30 is return 956.1
    evaluations = [{"step": 1000 * i, "return": r} for i, r in enumerate([10, 950, 1220, 1400], 1)]
    medium, _ = select_checkpoints(evaluations, 1 / 3, "d4rl", hopper)
    assert medium["step"] == 2000  # 950 is nearest 1078, but scores 29.8 (below the floor):
    medium, _ = select_checkpoints(evaluations, 1 / 3, "d4rl", hopper, min_normalized=30)
    assert medium["step"] == 3000 and hopper.normalized_score(medium["return"]) >= 30
    with pytest.raises(
        ValueError, match=r"scores 43\.6 normalized after 4000 .*sac\.total_steps=8000"
    ):
        select_checkpoints(evaluations, 1 / 3, "d4rl", hopper, min_normalized=50)
    assert not medium_reached(evaluations[1], 1078.1, hopper)
    assert medium_reached(evaluations[2], 1078.1, hopper, min_normalized=30)
    assert not medium_reached(evaluations[2], 1078.1, hopper, min_normalized=40)


def _uninterrupted_run(request: GenerationRequest) -> SACRun:
    family, sac = request.family, request.sac
    return SACRun(
        run_dir_for(request.runs_dir, family, request.seed, sac), family, request.seed, sac
    )


def _without_wall_time(evaluations):
    return [{k: v for k, v in e.items() if k != "wall_time"} for e in evaluations]


def test_raising_total_steps_continues_the_same_run(tiny_run, tmp_path):
    request, _ = tiny_run
    family, long_sac = request.family, request.sac
    short_sac = dataclasses.replace(long_sac, total_steps=1_000)
    short = SACRun(tmp_path / "run", family, request.seed, short_sac)
    short.train(progress=False)
    assert short.finished and short.state()["step"] == 1_000
    extended = SACRun(tmp_path / "run", family, request.seed, long_sac)
    assert not extended.finished
    extended.train(progress=False)  # continues from step 1000, not from scratch
    uninterrupted = _uninterrupted_run(request)
    assert _without_wall_time(extended.evaluations()) == _without_wall_time(
        uninterrupted.evaluations()
    )
    assert (extended.buffer() == uninterrupted.buffer()).all()
    for name, tensor in uninterrupted.state()["loss"].items():
        assert torch.equal(extended.state()["loss"][name], tensor), name


def test_early_stop_ends_at_the_first_checkpoint_meeting_it_and_can_be_lifted(tiny_run, tmp_path):
    request, _ = tiny_run
    family, sac = request.family, request.sac
    full = _uninterrupted_run(request).evaluations()
    threshold = full[1]["return"]
    expected_stop = next(e["step"] for e in full if e["return"] >= threshold)

    def should_stop(evaluation):
        return evaluation["return"] >= threshold

    run = SACRun(tmp_path / "run", family, request.seed, sac)
    run.train(progress=False, should_stop=should_stop)
    assert run.state()["step"] == expected_stop < sac.total_steps and not run.finished
    assert run.stopped_early(should_stop)
    saved = run.state_path.stat().st_mtime_ns
    run.train(progress=False, should_stop=should_stop)  # a rerun has nothing to do
    assert run.state_path.stat().st_mtime_ns == saved
    run.train(progress=False)  # without the criterion the same run goes on to total_steps
    assert run.finished
    assert _without_wall_time(run.evaluations()) == _without_wall_time(full)


def test_generation_stops_at_the_medium_level_and_records_it(tiny_run, tmp_path):
    request, _ = tiny_run
    full = _uninterrupted_run(request).evaluations()
    # reference scores that put a third of "expert" at the second checkpoint's return, and the
    # floor (normalized) just below it: the run must stop at the first checkpoint reaching both
    target = full[1]["return"]
    family = dataclasses.replace(request.family, ref_min_score=0.0, ref_max_score=3 * target)
    floor = 100 * target / (3 * target) - 1  # 32.3, the floor in normalized points
    expected = next(e for e in full if e["return"] >= target)
    stop_request = dataclasses.replace(
        request,
        family=family,
        kinds=["medium-replay", "medium"],
        medium_reference="d4rl",
        medium_min_normalized=floor,
        stop_at_medium=True,
        out_dir=tmp_path / "generated",
        runs_dir=tmp_path / "runs",
    )
    replay_path, medium_path = generate_datasets(stop_request)
    for path in (replay_path, medium_path):
        provenance = load_json(path.with_suffix(".provenance.json"))
        assert provenance["sac_steps_trained"] == expected["step"]
        assert [e["step"] for e in provenance["sac"]["evaluations"]][-1] == expected["step"]
        assert provenance["policy_normalized_score"] >= floor
        assert provenance["policy_eval_episodes"] == request.sac.eval_episodes
        assert provenance["medium_target_return"] == pytest.approx(target)
        assert provenance["sha256"] and provenance["size_bytes"] == path.stat().st_size
        load_dataset(path)
    assert len(read_d4rl_hdf5(replay_path)[0]["rewards"]) <= expected["step"]

    unreachable = dataclasses.replace(stop_request, medium_min_normalized=99.0)
    with pytest.raises(ValueError, match="medium_min_normalized=99.0.*sac.total_steps="):
        generate_datasets(unreachable)
    with pytest.raises(ValueError, match="stop_at_medium=true needs medium_reference=d4rl"):
        generate_datasets(dataclasses.replace(stop_request, medium_reference="best"))


def test_rerun_keeps_finished_files(tiny_run):
    request, paths = tiny_run
    before = {kind: path.stat().st_mtime_ns for kind, path in paths.items()}
    generate_datasets(request)
    assert {kind: path.stat().st_mtime_ns for kind, path in paths.items()} == before


def test_resume_after_interruption_matches_uninterrupted_run(tiny_run, tmp_path):
    request, _ = tiny_run
    family, sac = request.family, request.sac
    uninterrupted = SACRun(
        run_dir_for(request.runs_dir, family, request.seed, sac), family, request.seed, sac
    )
    resumed = SACRun(tmp_path / "run", family, request.seed, sac)
    resumed.train(progress=False, stop_at=1_000)  # as if killed right after step 1000
    assert resumed.state()["step"] == 1_000 and not resumed.finished
    resumed.train(progress=False)
    assert resumed.finished

    def without_wall_time(evaluations):
        return [{k: v for k, v in e.items() if k != "wall_time"} for e in evaluations]

    assert without_wall_time(resumed.evaluations()) == without_wall_time(
        uninterrupted.evaluations()
    )
    assert (resumed.buffer() == uninterrupted.buffer()).all()
    final, expected = resumed.state(), uninterrupted.state()
    for name, tensor in expected["loss"].items():
        assert torch.equal(final["loss"][name], tensor), name
    assert torch.equal(final["rng"]["torch"], expected["rng"]["torch"])


def test_shorter_request_reads_the_prefix_of_a_longer_run(tiny_run):
    request, _ = tiny_run
    family, long_sac = request.family, request.sac
    short_sac = dataclasses.replace(long_sac, total_steps=1_000)
    long_dir = run_dir_for(request.runs_dir, family, request.seed, long_sac)
    assert run_dir_for(request.runs_dir, family, request.seed, short_sac) == long_dir
    long_run = SACRun(long_dir, family, request.seed, long_sac)
    short_run = SACRun(long_dir, family, request.seed, short_sac)
    assert short_run.finished
    assert short_run.evaluations() == long_run.evaluations()[:2]
    assert (short_run.buffer() == long_run.buffer()[:1_000]).all()


def test_bad_requests_get_clear_errors(tmp_path):
    # The refusal runs in this process (its message and exit code are checked); the
    # suggested command runs as the user would run it, as the installed console script.
    with pytest.raises(ValueError, match="unknown dataset kind"):
        generate_datasets(tiny_request(tmp_path, kinds=["medium-replay", "meduim"]))
    with pytest.raises(ValueError, match="multiple of sac.frames_per_batch"):
        SACConfig(total_steps=1_234).validate()
    result = run_program(
        "collect",
        ["env=swimmer", "progress=false"],
        {"CBOP_TORCHRL_CACHE": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 2
    assert "env=swimmer is not a known family" in result.stderr
    assert "task.gym_id=Swimmer-v4" in result.stderr
    assert "Traceback" not in result.stderr
    # the suggested command runs as printed (the console script, which a wheel has too),
    # here with 2,000 instead of 1M random transitions
    suggested = shlex.split(result.stderr.split("`")[1])
    assert Path(suggested[0]).name == "cbop-collect"
    done = subprocess.run(
        [*suggested, "rollout_transitions=2000", "progress=false"],
        capture_output=True, text=True,
        env={"CBOP_TORCHRL_CACHE": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    (written,) = map(Path, done.stdout.split())
    assert written == tmp_path / "generated" / "swimmer-random-gen.hdf5"
    with h5py.File(written) as handle:
        assert handle["observations"].shape == (2000, 8)  # Swimmer-v4's observations


def test_a_run_too_short_for_a_checkpoint_is_refused_up_front(tmp_path):
    short = dataclasses.replace(TINY_SAC, total_steps=1_000, checkpoint_every=1_250)
    request = dataclasses.replace(tiny_request(tmp_path, kinds=["medium"]), sac=short)
    with pytest.raises(ValueError, match="before its first evaluated checkpoint"):
        generate_datasets(request)
    assert not (tmp_path / "runs").exists()


def test_random_alone_needs_no_sac_run(tmp_path):
    request = dataclasses.replace(tiny_request(tmp_path, kinds=["random"]), rollout_transitions=60)
    (path,) = generate_datasets(request)
    arrays, metadata = read_d4rl_hdf5(path)
    assert 0 < len(arrays["observations"]) <= 60 and metadata["kind"] == "random"
    assert not (tmp_path / "runs").exists()


def test_generated_hdf5_is_compressed(tiny_run):
    _, paths = tiny_run
    with h5py.File(paths["full-replay"], "r") as handle:
        assert handle["observations"].compression == "gzip"
        assert handle["observations"].shuffle


def test_dataset_stats_prints_each_file_next_to_d4rl(tiny_run, capsys):
    _, paths = tiny_run
    files = [paths["medium-replay"], paths["medium"]]
    spec = importlib.util.spec_from_file_location(
        "dataset_stats", REPO / "benchmarks" / "dataset_stats.py"
    )
    dataset_stats = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dataset_stats)  # its main() in this process: its output is checked
    capsys.readouterr()
    assert dataset_stats.main(list(map(str, files))) == 0
    result = capsys.readouterr()
    rows = result.out.strip().splitlines()[2:]
    for line, path in zip(rows, files, strict=True):
        arrays, _ = read_d4rl_hdf5(path)
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        d4rl = "402,000" if "replay" in path.name else "1,000,000"
        assert cells[0] == path.stem
        assert cells[1] == f"{len(arrays['rewards']):,} ({d4rl})"
        assert cells[4] == f"{arrays['terminals'].mean():.4f}"
    assert dataset_stats.main(["nope.hdf5"]) == 2
    assert "no such file(s): nope.hdf5" in capsys.readouterr().err
