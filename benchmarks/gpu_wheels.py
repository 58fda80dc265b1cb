"""Build the wheel bundle that installs vf on a GPU machine with no registry (CPython 3.12, torch
2.11, transformers 5.17: the image's own stack), and check it is complete before it travels.

    python benchmarks/gpu_wheels.py [--out .whl] [--no-vf]

Here, where PyPI is reachable: downloads benchmarks/gpu_wheels.toml's [bundle] pins as wheels for
the target (`pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp
--platform manylinux…_x86_64`), builds vf's own wheel (`pip wheel --no-deps .`), removes any other
wheel from the folder (two versions of one package stop the install there), then checks:

  - no wheel is a package the image already has ([image]), and the bundle is under max_mib;
  - every Requires-Dist of every wheel (markers evaluated for CPython 3.12 on Linux x86_64, extras
    followed where a requirement names them) is met by a bundle wheel, or by the image: by version
    where the image's is known, by name otherwise (listed as "unverified" on stderr: the install
    line's `pip check` settles those there).

stdout: the install commands for the GPU machine (data); stderr: the bundle's list and size, and
every problem. Exit 0 when the bundle is complete, 1 when a check failed, 2 on bad usage. The
folder (default `.whl/`, git-ignored) is what the device tool's `carry` takes along.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tomllib
import zipfile
from email.parser import Parser
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "benchmarks" / "gpu_wheels.toml"


def load_spec(path: Path = SPEC) -> dict:
    return tomllib.loads(path.read_text())


def target_env(spec: dict) -> dict[str, str]:
    """The marker environment of the GPU machines' python3."""
    env = default_environment()
    full = spec["target"]["python_full"]
    env.update(python_version=spec["target"]["python"], python_full_version=full, sys_platform="linux",
               platform_system="Linux", platform_machine="x86_64", implementation_name="cpython",
               platform_python_implementation="CPython", os_name="posix", implementation_version=full)
    return env


def download(spec: dict, out: Path) -> None:
    pins = [f"{name}=={version}" for name, version in spec["bundle"].items()]
    platforms = [a for p in spec["target"]["platforms"] for a in ("--platform", p)]
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
           "--python-version", spec["target"]["python"], "--implementation", "cp", *platforms, "-d", str(out), *pins]
    _run(cmd, "pip download")


def build_vf(out: Path) -> None:
    # --no-build-isolation: the setuptools/wheel of this environment build it (nothing fetched)
    _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", str(out),
          str(ROOT)], "pip wheel .")


def _run(cmd: list[str], what: str) -> None:
    p = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if p.returncode != 0:
        noise = re.compile(r"^WARNING: Location .* is ignored")
        err = "\n".join(x for x in p.stderr.splitlines() if not noise.match(x))
        raise SystemExit(f"gpu_wheels: {what} failed (exit {p.returncode}):\n{err.strip()[-3000:]}")


def wheels(out: Path) -> dict[str, tuple[str, Path]]:
    """canonical name -> (version, path) of the wheels in `out`."""
    found = {}
    for w in sorted(out.glob("*.whl")):
        name, version, _, _ = parse_wheel_filename(w.name)
        found[canonicalize_name(name)] = (str(version), w)
    return found


def prune(out: Path, keep: dict[str, str | None]) -> list[str]:
    """Delete the wheels of packages not in `keep` (name -> pinned version, None: any), and those
    of another version than the pin."""
    removed = []
    for w in sorted(out.glob("*.whl")):
        name, version, _, _ = parse_wheel_filename(w.name)
        name = canonicalize_name(name)
        if name not in keep or (keep[name] is not None and str(version) != keep[name]):
            w.unlink()
            removed.append(w.name)
    return removed


def requires(path: Path) -> list[Requirement]:
    with zipfile.ZipFile(path) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        msg = Parser().parsestr(z.read(meta).decode())
    return [Requirement(r) for r in msg.get_all("Requires-Dist") or []]


def check(spec: dict, found: dict[str, tuple[str, Path]]) -> tuple[list[str], list[str]]:
    """(problems, unverified): requirements the bundle + image do not meet, and those met by an
    image package of unknown version."""
    env = target_env(spec)
    image = {canonicalize_name(n) for n in spec["image"]["names"]}
    image_versions = {canonicalize_name(k): v for k, v in spec["image"]["versions"].items()}
    problems, unverified = [], []
    for name in sorted(found):
        if name in image and name != "vf":
            problems.append(f"{name}: the image already has it (carry one only for another version)")
    # (package, extras it is asked for with): walk every wheel's requirements, following extras
    pending = [(name, frozenset()) for name in found]
    done = set()
    while pending:
        name, extras = pending.pop()
        if (name, extras) in done or name not in found:
            continue
        done.add((name, extras))
        for req in requires(found[name][1]):
            wanted = [{**env, "extra": e} for e in extras] + [{**env, "extra": ""}]
            if req.marker and not any(req.marker.evaluate(w) for w in wanted):
                continue
            dep = canonicalize_name(req.name)
            who = f"{name} requires {req}"
            if dep in found:
                if not req.specifier.contains(found[dep][0], prereleases=True):
                    problems.append(f"{who}, the bundle has {found[dep][0]}")
                pending.append((dep, frozenset(req.extras)))
            elif dep in image:
                version = image_versions.get(dep)
                if version is None:
                    if str(req.specifier):
                        unverified.append(f"{who} (image version unknown)")
                elif not req.specifier.contains(version, prereleases=True):
                    problems.append(f"{who}, the image has {version}")
                if req.extras:
                    unverified.append(f"{who}: extras {sorted(req.extras)} of an image package")
            else:
                problems.append(f"{who}: neither in the bundle nor in the image")
    return problems, sorted(set(unverified))


def install_lines(out: Path) -> str:
    rel = out.relative_to(ROOT) if out.is_relative_to(ROOT) else out
    return "\n".join([
        "# on the GPU machine, in the repo root (the device tool: carry the folder, e.g. carry=['.whl']):",
        f"python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site {rel}/*.whl",
        "export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH",
        "python3 -m pip check | grep -v '^No broken' || true   # requirements the image may not meet",
    ])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="gpu_wheels", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / ".whl"), help="bundle folder (default .whl/ in the repo root)")
    ap.add_argument("--no-vf", action="store_true", help="leave out vf's own wheel (e.g. a checkout installed -e)")
    ap.add_argument("--check-only", action="store_true", help="check the folder as it is: download nothing")
    args = ap.parse_args(argv)
    spec = load_spec()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    keep = {canonicalize_name(n): v for n, v in spec["bundle"].items()} | ({} if args.no_vf else {"vf": None})
    if not args.check_only:
        for w in out.glob("vf-*.whl"):
            w.unlink()  # always this checkout's code
        download(spec, out)
        if not args.no_vf:
            build_vf(out)
    removed = prune(out, keep)
    found = wheels(out)
    missing = sorted(set(keep) - set(found))
    problems, unverified = check(spec, found)
    problems += [f"{n}: no wheel in {out}" for n in missing]
    total = sum(p.stat().st_size for _, p in found.values())
    limit = spec["target"]["max_mib"] * 2**20
    if total > limit:
        problems.append(f"the bundle is {total / 2**20:.1f} MiB, over {spec['target']['max_mib']} MiB")
    for name, (version, path) in sorted(found.items()):
        print(f"  {path.stat().st_size / 2**20:6.2f} MiB  {name} {version}", file=sys.stderr)
    print(f"gpu_wheels: {len(found)} wheels, {total / 2**20:.1f} MiB in {out}"
          + (f" (removed {len(removed)} not in the list)" if removed else ""), file=sys.stderr)
    for u in unverified:
        print(f"gpu_wheels: unverified: {u}", file=sys.stderr)
    for p in problems:
        print(f"gpu_wheels: PROBLEM: {p}", file=sys.stderr)
    print(install_lines(out))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
