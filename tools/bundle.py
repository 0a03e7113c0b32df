"""An offline install bundle: every wheel cbop-torchrl needs on a target, in one folder.

    python -m tools.bundle --dest bundle                       # this machine
    python -m tools.bundle --dest bundle --python-version 3.12 --torch torch==2.11.0
    python -m tools.bundle --dest bundle --with-torch --torch torch==2.13.0

Run it from the root of a checkout (it is a packaging tool, not part of the installed
package) on a machine that reaches a package index; copy the
folder to the target (a cluster node, a GPU machine with no internet) and
install there with::

    pip install --no-index --find-links bundle cbop-torchrl

What it does, all with pip (``docs/gpu.md``):

1. builds this checkout's wheel (``pip wheel``) into the folder;
2. resolves the package's requirements for this interpreter first, to find the
   ones published only as source archives (``antlr4-python3-runtime``, Hydra's
   parser): each is built here into a wheel, which must be pure Python
   (``py3-none-any``) so that it installs on any target;
3. resolves them again for the target (``--python-version``, ``--platform``;
   binary wheels only, the folder's own wheels included), with ``--torch`` as the
   torch the target has, and keeps the packages the package needs, leaving out
   torch and what only torch needs unless ``--with-torch`` (GPU machines ship their
   own CUDA build of torch), the packages named with ``--exclude`` (ones the
   target already has, e.g. numpy) and those named with ``--without`` (ones a
   requirement names that the target does without, e.g. MuJoCo's viewer; the bundle
   is then installed as it is, ``pip install --no-deps``, since pip's resolver would
   ask for them); for this machine itself the first resolution is kept, with the
   wheels built in step 2 in place of their source archives;
4. downloads them (``pip download --no-deps``, pip's cache reused), writes
   ``bundle.json`` (target, files, sizes, the install command) and prints the
   size, the largest files and what was left out.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlparse

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

from cbop_torchrl.io import atomic_json_dump, unwritable_reason

EXIT_BAD_INPUT = 2
PACKAGE = "cbop-torchrl"
CHECKOUT = Path(__file__).resolve().parents[1]
#: Platform tags a manylinux tag stands for: pip matches ``--platform`` tags exactly, so a
#: target with glibc 2.N takes every ``manylinux_2_M`` with M <= N and the legacy aliases.
LEGACY_MANYLINUX = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
MANYLINUX = re.compile(r"^manylinux_2_(\d+)_(x86_64|aarch64)$")


class BundleError(Exception):
    """The bundle cannot be built as asked; the message says what to change."""


@dataclass
class Target:
    """The interpreter and platform the bundle is for."""

    python_version: str  # "3.12"
    platforms: list[str] = field(default_factory=list)  # empty: this machine's

    @property
    def is_host(self) -> bool:
        return not self.platforms and self.python_version == host_python_version()

    def pip_flags(self) -> list[str]:
        """pip's target flags (none for this machine: pip then uses its own tags)."""
        if self.is_host:
            return []
        abi = "cp" + self.python_version.replace(".", "")
        flags = ["--python-version", self.python_version, "--implementation", "cp"]
        flags += ["--abi", abi, "--abi", "abi3", "--abi", "none"]
        for platform in self.platforms:
            flags += ["--platform", platform]
        return flags

    def marker_environment(self, host: dict[str, str]) -> dict[str, str]:
        """PEP 508 marker values on the target (``host``'s, with the target's Python)."""
        env = dict(host)
        if not self.is_host:
            env.update(python_version=self.python_version, python_full_version=self.python_version)
            env.update(implementation_version=self.python_version)
            machine = next((m.group(2) for p in self.platforms if (m := MANYLINUX.match(p))), None)
            if machine:
                env["platform_machine"] = machine
        return env


def host_python_version() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def expand_platform(tag: str) -> list[str]:
    """``manylinux_2_N_<arch>`` -> every manylinux tag a glibc 2.N machine takes; else ``[tag]``."""
    match = MANYLINUX.match(tag)
    if match is None:
        return [tag]
    newest, arch = int(match.group(1)), match.group(2)
    tags = [f"manylinux_2_{minor}_{arch}" for minor in range(newest, 4, -1)]
    tags += [f"{alias}_{arch}" for minor, alias in LEGACY_MANYLINUX.items() if minor <= newest]
    return tags


def pip(*args: str, quiet: bool = True) -> subprocess.CompletedProcess:
    """``python -m pip ARGS`` (this interpreter's pip, the user's pip configuration)."""
    command = [sys.executable, "-m", "pip", *args, *(["-q"] if quiet else [])]
    return subprocess.run(command, capture_output=True, text=True, check=False)


def pip_error(done: subprocess.CompletedProcess) -> str:
    """pip's own error lines, without its warnings about ignored index locations."""
    lines = [line for line in done.stderr.splitlines() if "is ignored" not in line]
    return "\n".join(lines[-12:]).strip() or f"pip exited with {done.returncode}"


def build_own_wheel(source: Path, dest: Path) -> Path:
    """This checkout's wheel in ``dest`` (an older wheel of the same version is replaced).

    Built from a copy of the package's files: building in the checkout would leave
    setuptools' ``build/`` folder there.
    """
    for old in dest.glob("cbop_torchrl-*.whl"):
        old.unlink()
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp)
        for name in ("pyproject.toml", "README.md"):
            shutil.copy(source / name, copy / name)
        shutil.copytree(
            source / "cbop_torchrl",
            copy / "cbop_torchrl",
            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
        )
        done = pip("wheel", str(copy), "--no-deps", "--no-build-isolation", "-w", str(dest))
    if done.returncode != 0:
        raise BundleError(f"building the wheel of {source} failed:\n{pip_error(done)}")
    (wheel,) = dest.glob("cbop_torchrl-*.whl")
    return wheel


def resolve(requirements: list[str], dest: Path, flags: list[str], binary_only: bool) -> dict:
    """pip's installation report (``--dry-run --report``) for ``requirements`` on a target."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        args = ["install", "--dry-run", "--ignore-installed", "--report", str(report)]
        args += ["--find-links", str(dest), *flags]
        args += ["--only-binary=:all:"] if binary_only else ["--prefer-binary"]
        if flags:
            args += ["--target", str(Path(tmp) / "target")]
        done = pip(*args, *requirements)
        if done.returncode != 0:
            raise BundleError(
                f"pip could not resolve {' '.join(requirements)} for the target:\n"
                f"{pip_error(done)}\nCheck --python-version/--platform/--torch (e.g. "
                "--python-version 3.12 --platform manylinux_2_28_x86_64 --torch torch==2.11.0)"
            )
        return json.loads(report.read_text())


def file_name(item: dict) -> str:
    return unquote(Path(urlparse(item["download_info"]["url"]).path).name)


def build_pure_wheels(report: dict, dest: Path) -> list[str]:
    """Builds a wheel in ``dest`` for each package the report takes from a source archive.

    Raises:
        BundleError: such a package builds to a platform-specific wheel (it would not
            install on another target).
    """
    built = []
    for item in report["install"]:
        name = file_name(item)
        if name.endswith(".whl"):
            continue
        pin = f"{item['metadata']['name']}=={item['metadata']['version']}"
        done = pip("wheel", "--no-deps", "-w", str(dest), pin)
        if done.returncode != 0:
            raise BundleError(f"building a wheel of {pin} (no wheel published) failed:\n"
                              f"{pip_error(done)}")  # fmt: skip
        wheels = sorted(
            dest.glob(f"{canonicalize_name(pin.split('==')[0]).replace('-', '_')}-*.whl")
        )
        if not wheels or not wheels[-1].name.endswith("-none-any.whl"):
            raise BundleError(
                f"{pin} is published only as a source archive and does not build to a pure "
                "Python wheel; build the bundle on a machine like the target (same Python "
                "and platform) instead"
            )
        built.append(wheels[-1].name)
    return built


def with_built_wheels(report: dict, dest: Path) -> dict:
    """``report`` with each package it takes from a source archive taken from the wheel
    :func:`build_pure_wheels` built of it in ``dest`` (same name and version) instead."""
    report = copy.deepcopy(report)
    for item in report["install"]:
        if not file_name(item).endswith(".whl"):
            name = canonicalize_name(item["metadata"]["name"]).replace("-", "_")
            version = Version(item["metadata"]["version"])
            (wheel,) = (
                w for w in dest.glob(f"{name}-*.whl") if parse_wheel_filename(w.name)[1] == version
            )
            item["download_info"] = {"url": wheel.resolve().as_uri()}
    return report


def needed(report: dict, roots: list[str], env: dict[str, str], skip: set[str]) -> list[dict]:
    """The report's packages that ``roots`` need on the target, not through ``skip``.

    Walks the requirements (``Requires-Dist`` with their markers and extras) from
    the roots; a package in ``skip`` is not entered, so what only it needs is left out.
    """
    by_name = {canonicalize_name(i["metadata"]["name"]): i for i in report["install"]}
    keep: dict[str, dict] = {}
    seen: set[tuple[str, str]] = set()
    stack = [Requirement(root) for root in roots]
    while stack:
        requirement = stack.pop()
        name = canonicalize_name(requirement.name)
        if name in skip or name not in by_name:
            continue
        keep[name] = by_name[name]
        for extra in ("", *sorted(requirement.extras)):
            if (name, extra) in seen:
                continue
            seen.add((name, extra))
            for text in by_name[name]["metadata"].get("requires_dist") or []:
                dependency = Requirement(text)
                if dependency.marker is None or dependency.marker.evaluate({**env, "extra": extra}):
                    stack.append(dependency)
    return sorted(keep.values(), key=lambda item: canonicalize_name(item["metadata"]["name"]))


def download(items: list[dict], dest: Path, flags: list[str]) -> None:
    """Downloads the wheels of ``items`` not yet in ``dest`` (pinned, no dependencies)."""
    missing = [i for i in items if not (dest / file_name(i)).is_file()]
    if not missing:
        return
    pins = [f"{i['metadata']['name']}=={i['metadata']['version']}" for i in missing]
    args = ["download", "--no-deps", "--only-binary=:all:", "--find-links", str(dest)]
    done = pip(*args, "-d", str(dest), *flags, *pins)
    if done.returncode != 0:
        raise BundleError(f"downloading {' '.join(pins)} failed:\n{pip_error(done)}")
    for item in missing:
        if not (dest / file_name(item)).is_file():
            raise BundleError(f"pip did not write {file_name(item)} into {dest}")


def human(size: int) -> str:
    return f"{size / 2**20:.1f} MiB"


def build_requirements(source: Path) -> list[str]:
    """The checkout's ``[build-system] requires`` (to install from the checkout offline)."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: pip's own copy of the same parser
        from pip._vendor import tomli as tomllib
    with open(source / "pyproject.toml", "rb") as handle:
        return list(tomllib.load(handle)["build-system"]["requires"])


def build_bundle(
    dest: Path,
    target: Target,
    torch_spec: str,
    with_torch: bool,
    extras: list[str],
    exclude: list[str],
    source: Path,
    package_wheel: bool = True,
    without: list[str] | None = None,
) -> dict:
    """Builds the bundle in ``dest`` and returns its manifest (also written to ``bundle.json``).

    ``package_wheel=False``: the package's own wheel is left out and its build
    requirements (setuptools, wheel) are put in instead, for a target that installs
    from its copy of the checkout (``pip install --no-index --find-links DEST <checkout>``).
    ``without``: packages left out although a requirement names them (see ``--without``).
    """
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        wheel = build_own_wheel(source, dest if package_wheel else Path(tmp))
        if not package_wheel:  # resolution still needs it: found next to the bundle's wheels
            wheel = Path(shutil.copy(wheel, dest / wheel.name))
        try:
            manifest = _bundle_around(
                dest, wheel, target, torch_spec, with_torch, extras, exclude, source,
                package_wheel, without or [],
            )  # fmt: skip
        finally:
            if not package_wheel:
                wheel.unlink(missing_ok=True)
    return manifest


def _bundle_around(
    dest: Path,
    wheel: Path,
    target: Target,
    torch_spec: str,
    with_torch: bool,
    extras: list[str],
    exclude: list[str],
    source: Path,
    package_wheel: bool,
    without: list[str],
) -> dict:
    suffix = f"[{','.join(extras)}]" if extras else ""
    root = f"{PACKAGE}{suffix}"
    extra_roots = [] if package_wheel else build_requirements(source)
    requirements = [f"{wheel}{suffix}", torch_spec, *extra_roots]
    host_report = resolve(requirements, dest, [], binary_only=False)
    built = build_pure_wheels(host_report, dest)
    if target.is_host:  # resolving again, binary only, would pick the same versions
        report = with_built_wheels(host_report, dest)
    else:
        report = resolve(requirements, dest, target.pip_flags(), binary_only=True)
    resolved = {canonicalize_name(i["metadata"]["name"]) for i in report["install"]}
    without_names = {canonicalize_name(name) for name in without}
    if unknown := sorted(without_names - resolved):
        raise BundleError(
            f"--without {' '.join(unknown)}: no package of that name is among what "
            f"{PACKAGE} needs on the target; name some of: {', '.join(sorted(resolved))}"
        )
    skip = {canonicalize_name(name) for name in exclude} | without_names
    if not with_torch:
        skip.add("torch")
    if not package_wheel:
        skip.add(canonicalize_name(PACKAGE))  # its requirements are walked from its metadata
    env = target.marker_environment(host_report["environment"])
    own = next(i for i in report["install"] if canonicalize_name(i["metadata"]["name"]) == PACKAGE)
    own_requirements = [
        text
        for text in own["metadata"].get("requires_dist") or []
        if (r := Requirement(text)).marker is None
        or any(r.marker.evaluate({**env, "extra": e}) for e in ("", *extras))
    ]
    roots = [root] if package_wheel else list(own_requirements)
    roots += [*([torch_spec] if with_torch else []), *extra_roots]
    items = needed(report, roots, env, skip)
    download(items, dest, target.pip_flags())
    files = {file_name(i): (dest / file_name(i)).stat().st_size for i in items}
    # The package's own requirements as it states them (a version the target already
    # has is kept), less what was left out: the first step of a --no-deps install.
    direct = [
        torch_spec if canonicalize_name(Requirement(t).name) == "torch" else t
        for t in own_requirements
        if canonicalize_name(Requirement(t).name) not in skip
    ]
    (dest / "requirements.txt").write_text("\n".join(direct) + "\n")
    missing_direct = sorted(
        {canonicalize_name(Requirement(t).name) for t in own_requirements} & skip - {"torch"}
    )
    kept = {canonicalize_name(i["metadata"]["name"]) for i in items}
    left_out = sorted(
        f"{i['metadata']['name']}=={i['metadata']['version']}"
        for i in report["install"]
        if canonicalize_name(i["metadata"]["name"]) not in kept
    )
    manifest = {
        "package": wheel.name if package_wheel else None,
        "python_version": target.python_version,
        "platforms": target.platforms or ["this machine's"],
        "torch": torch_spec,
        "with_torch": with_torch,
        "extras": extras,
        "excluded": sorted(exclude),
        "without": sorted(without),
        "built_from_source_archives": built,
        "files": dict(sorted(files.items())),
        "total_bytes": sum(files.values()),
        "left_out": left_out,
        "install": install_commands(dest, root, package_wheel, missing_direct, bool(without)),
        "left_out_requirements": missing_direct,
    }
    atomic_json_dump(manifest, dest / "bundle.json")
    return manifest


def install_commands(
    dest: Path, root: str, package_wheel: bool, missing: list[str], as_it_is: bool = False
) -> str:
    """The offline install command(s) for a bundle in ``dest``.

    ``as_it_is``: every wheel of the bundle without pip's resolver (``--no-deps``), for a
    bundle that leaves out packages a requirement names (``--without``).
    """
    links = f"pip install --no-index --find-links {shlex.quote(str(dest))}"
    what = root if package_wheel else "<checkout>"
    if as_it_is:
        every_wheel = f"pip install --no-index --no-deps {shlex.quote(str(dest))}/*.whl"
        return every_wheel if package_wheel else f"{every_wheel} && {links} --no-deps {what}"
    if not missing:
        return f"{links} {what}"
    # A requirement left out (--exclude) that the target lacks would stop pip's resolver:
    # the bundled packages go in first, then the package itself without its requirements.
    return f"{links} -r {shlex.quote(str(dest / 'requirements.txt'))} && {links} --no-deps {what}"


def describe(manifest: dict, dest: Path) -> str:
    """What the bundle holds: size, the largest files, what was left out, how to install."""
    files = manifest["files"]
    largest = sorted(files.items(), key=lambda kv: -kv[1])[:5]
    total = manifest["total_bytes"]
    lines = [
        f"bundle {dest}: {len(files)} wheels, {human(total)} for Python "
        f"{manifest['python_version']} on {', '.join(manifest['platforms'][:1])}"
        f"{' (and older manylinux tags)' if len(manifest['platforms']) > 1 else ''}",
        "largest: " + ", ".join(f"{n} {human(s)} ({100 * s / total:.0f}%)" for n, s in largest),
    ]
    if manifest["left_out"]:
        flags = "--exclude, --without" if manifest.get("without") else "--exclude"
        why = flags + ("" if manifest["with_torch"] else "; torch: the target's own")
        lines.append(
            f"left out, with what only they need ({why}): {', '.join(manifest['left_out'])}"
        )
    if manifest.get("without"):
        lines.append(
            f"left out though a requirement names them (--without): "
            f"{', '.join(manifest['without'])}; the bundle installs as it is (--no-deps)"
        )
    if manifest["left_out_requirements"]:
        lines.append(
            f"requirements of {PACKAGE} left out (--exclude): "
            f"{', '.join(manifest['left_out_requirements'])}; the target must have them "
            "or do without them"
        )
    lines.append(f"install on the target (no network):\n    {manifest['install']}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tools.bundle", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--dest", type=Path, required=True, help="the bundle folder")
    parser.add_argument(
        "--python-version", default=host_python_version(), help="the target's X.Y (default: this)"
    )
    parser.add_argument(
        "--platform",
        action="append",
        default=None,
        help="the target's platform tag, e.g. manylinux_2_28_x86_64 (every older manylinux "
        "tag is added); default: this machine's, or manylinux_2_28_x86_64 for another Python",
    )
    parser.add_argument(
        "--torch",
        default="torch",
        help="the torch the target has or gets (a requirement, e.g. torch==2.11.0); the other "
        "packages are resolved to work with it",
    )
    parser.add_argument(
        "--with-torch", action="store_true", help="put torch and its dependencies in the bundle"
    )
    parser.add_argument("--extras", nargs="*", default=[], help="extras, e.g. minari report")
    parser.add_argument(
        "--exclude", nargs="*", default=[], help="packages the target already has (e.g. numpy)"
    )
    parser.add_argument(
        "--without",
        nargs="*",
        default=[],
        help="packages a requirement names that the target does without (e.g. mujoco-studio "
        "pyopengl: MuJoCo's viewer, which simulation never imports); left out with what "
        "only they need, and the bundle is then installed with pip --no-deps",
    )
    parser.add_argument("--source", type=Path, default=CHECKOUT, help="the checkout to package")
    parser.add_argument(
        "--no-package-wheel",
        action="store_true",
        help="leave this package's wheel out and put its build requirements in: the target "
        "installs from its own copy of the checkout",
    )
    return parser.parse_args(argv)


def refuse(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return EXIT_BAD_INPUT


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not re.fullmatch(r"3\.\d+", args.python_version):
        return refuse(f"--python-version {args.python_version!r}: give X.Y, e.g. 3.12")
    if not (args.source / "pyproject.toml").is_file():
        return refuse(
            f"{args.source} is not a checkout of {PACKAGE} (no pyproject.toml); run this from "
            "a clone of the repository or pass --source <checkout>"
        )
    try:
        Requirement(args.torch)
    except ValueError:
        return refuse(f"--torch {args.torch!r} is not a requirement; give e.g. torch==2.11.0")
    if canonicalize_name(Requirement(args.torch).name) != "torch":
        return refuse(f"--torch {args.torch!r} names another package; give e.g. torch==2.11.0")
    if (reason := unwritable_reason(args.dest)) is not None:
        return refuse(f"--dest {args.dest} cannot be written: {reason}")
    platforms = [tag for given in args.platform or [] for tag in expand_platform(given)]
    if not platforms and args.python_version != host_python_version():
        platforms = expand_platform("manylinux_2_28_x86_64")
    target = Target(args.python_version, platforms)
    try:
        manifest = build_bundle(
            args.dest, target, args.torch, args.with_torch, args.extras, args.exclude,
            args.source, package_wheel=not args.no_package_wheel, without=args.without,
        )  # fmt: skip
    except BundleError as error:
        return refuse(str(error))
    print(describe(manifest, args.dest))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    sys.exit(main())
