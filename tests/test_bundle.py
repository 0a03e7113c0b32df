"""The offline install bundle: ``python -m tools.bundle`` from a checkout.

A bundle for another Python and target (what benchmarks/gpu_session.sh installs from) is
built here; the dependency walk and the refusals are checked offline. The bundle for this
machine, its install into a fresh venv and the installed programs (the tests' one
end-to-end run of an installed ``cbop-train``) are in ``tests/test_install.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tools import bundle

CHECKOUT = Path(__file__).resolve().parents[1]  # tools/ is run from the checkout's root


@pytest.mark.install
def test_a_bundle_for_another_python_without_the_package_wheel_and_excluded_packages(
    tmp_path: Path,
) -> None:
    """What benchmarks/gpu_session.sh installs from: Python 3.12, the target's torch, no wandb,
    without MuJoCo's viewer and its OpenGL binding (docs/gpu.md's command)."""
    dest = tmp_path / "wheels"
    args = ["--dest", str(dest), "--python-version", "3.12", "--torch", "torch==2.11.0",
            "--no-package-wheel", "--exclude", "numpy", "wandb",
            "--without", "mujoco-studio", "pyopengl"]  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "tools.bundle", *args],
        cwd=CHECKOUT, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    manifest = json.loads((dest / "bundle.json").read_text())
    files = manifest["files"]
    assert not any(
        n.startswith(("cbop_torchrl", "torch-", "numpy", "wandb", "nvidia")) for n in files
    )
    assert any(n.startswith("setuptools-") for n in files)  # to build the checkout offline
    assert any(n.startswith("torchrl-") and "cp312" in n for n in files)
    assert all("cp311" not in n for n in files)
    assert {"wandb==", "numpy==", "torch==2.11.0"} <= {
        entry.split("==")[0] + "==" if "torch==" not in entry else entry
        for entry in manifest["left_out"]
    }
    requirements = (dest / "requirements.txt").read_text().split()
    assert any(r.startswith("torchrl") for r in requirements)
    assert not any(r.startswith(("torch>", "torch=", "wandb", "numpy")) for r in requirements)
    assert manifest["left_out_requirements"] == ["numpy", "wandb"]
    # MuJoCo's viewer and what only it needs are left out; the simulator itself is kept.
    assert any(n.startswith("mujoco_core-") for n in files)
    viewer = ("mujoco_studio", "pyopengl", "websockets")
    assert not any(n.lower().startswith(viewer) for n in files)
    assert any(n.startswith("glfw-") for n in files)  # gymnasium's MuJoCo envs import it
    assert manifest["without"] == ["mujoco-studio", "pyopengl"]
    assert manifest["install"].startswith(f"pip install --no-index --no-deps {dest}/*.whl && ")
    assert manifest["install"].endswith("--no-deps <checkout>")


def _item(name: str, *requires: str) -> dict:
    return {
        "metadata": {"name": name, "version": "1.0", "requires_dist": list(requires)},
        "download_info": {"url": f"https://example.org/{name}-1.0-py3-none-any.whl"},
    }


def test_the_walk_leaves_out_what_only_torch_needs_and_follows_markers_and_extras() -> None:
    report = {
        "install": [
            _item("cbop-torchrl", "torch>=2.4", "gymnasium[mujoco]>=1", "tomli; python_version<'3.11'"),  # noqa: E501
            _item("torch", "nvidia-cublas", "typing-extensions"),
            _item("nvidia-cublas"),
            _item("typing-extensions"),
            _item("gymnasium", "typing-extensions", "mujoco; extra == 'mujoco'", "ale; extra == 'atari'"),  # noqa: E501
            _item("mujoco"),
            _item("ale"),
            _item("tomli"),
        ]
    }  # fmt: skip
    target = bundle.Target("3.12", bundle.expand_platform("manylinux_2_28_x86_64"))
    env = target.marker_environment({"python_version": "3.11", "platform_machine": "x86_64"})
    names = [i["metadata"]["name"] for i in bundle.needed(report, ["cbop-torchrl"], env, {"torch"})]
    assert names == ["cbop-torchrl", "gymnasium", "mujoco", "typing-extensions"]
    old_python = {**env, "python_version": "3.10"}
    with_torch = bundle.needed(report, ["cbop-torchrl"], old_python, set())
    assert {"torch", "nvidia-cublas", "tomli"} <= {i["metadata"]["name"] for i in with_torch}


def test_for_this_machine_the_built_wheels_replace_their_source_archives(tmp_path: Path) -> None:
    (tmp_path / "antlr4_python3_runtime-4.9.3-py3-none-any.whl").touch()
    (tmp_path / "antlr4_python3_runtime-4.9.2-py3-none-any.whl").touch()
    sdist = _item("antlr4-python3-runtime")
    sdist["metadata"]["version"] = "4.9.3"
    sdist["download_info"]["url"] = "https://example.org/antlr4-python3-runtime-4.9.3.tar.gz"
    report = {"install": [_item("mujoco"), sdist]}
    files = [
        bundle.file_name(item) for item in bundle.with_built_wheels(report, tmp_path)["install"]
    ]
    assert files == ["mujoco-1.0-py3-none-any.whl", "antlr4_python3_runtime-4.9.3-py3-none-any.whl"]
    assert bundle.file_name(sdist) == "antlr4-python3-runtime-4.9.3.tar.gz"  # a copy was changed


def test_a_bundle_without_a_named_requirement_installs_as_it_is(tmp_path: Path) -> None:
    as_it_is = bundle.install_commands(tmp_path, "cbop-torchrl", True, [], as_it_is=True)
    assert as_it_is == f"pip install --no-index --no-deps {tmp_path}/*.whl"
    resolved = bundle.install_commands(tmp_path, "cbop-torchrl", True, [])
    assert resolved == f"pip install --no-index --find-links {tmp_path} cbop-torchrl"


def test_an_unknown_name_after_without_is_refused_with_the_names_to_choose_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    report = {
        "environment": {"python_version": "3.11", "platform_machine": "x86_64"},
        "install": [_item("cbop-torchrl", "mujoco"), _item("mujoco", "glfw"), _item("glfw")],
    }
    monkeypatch.setattr(bundle, "resolve", lambda *args, **kwargs: report)
    monkeypatch.setattr(bundle, "build_pure_wheels", lambda *args: [])
    target = bundle.Target("3.12", bundle.expand_platform("manylinux_2_28_x86_64"))
    with pytest.raises(bundle.BundleError, match="--without mujoco-viewer: no package") as error:
        bundle._bundle_around(
            tmp_path, tmp_path / "cbop_torchrl-0.1.0-py3-none-any.whl", target, "torch", False,
            [], [], tmp_path, True, ["mujoco_viewer"],
        )  # fmt: skip
    assert "cbop-torchrl, glfw, mujoco" in str(error.value)


def test_a_manylinux_tag_stands_for_every_older_one() -> None:
    tags = bundle.expand_platform("manylinux_2_28_x86_64")
    assert tags[0] == "manylinux_2_28_x86_64" and "manylinux_2_17_x86_64" in tags
    assert {"manylinux2014_x86_64", "manylinux1_x86_64"} <= set(tags)
    assert "manylinux_2_29_x86_64" not in tags
    assert bundle.expand_platform("win_amd64") == ["win_amd64"]
    assert "--python-version" in bundle.Target("3.12", tags).pip_flags()
    assert bundle.Target(bundle.host_python_version()).pip_flags() == []


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--python-version", "3"], "--python-version"),
        (["--torch", "numpy==2"], "--torch"),
        (["--torch", "torch=>2"], "--torch"),
        (["--source", "."], "not a checkout"),
    ],
)
def test_bad_input_is_refused_with_exit_code_2(
    args: list[str], named: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [a if a != "." else str(tmp_path) for a in args]
    assert bundle.main(["--dest", str(tmp_path / "b"), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and named in err
    assert not (tmp_path / "b").exists()
