"""The wheel installs everything under the `vf` namespace: no generic top-level packages."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).parent.parent


def test_wheel_installs_only_the_vf_namespace(tmp_path):
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w",
                            str(tmp_path / "dist"), str(ROOT)], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("vf-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"vf", f"{wheel.name.split('-')[0]}-{wheel.name.split('-')[1]}.dist-info"}
    for sub in ("vf/models/transformer.py", "vf/trainer/losses/ipo.py", "vf/commands/eval.py",
                "vf/environments/reverse_text/__init__.py", "vf/environments/reverse_text/README.md",
                "vf/environments/swe_mini/repos/median.txt",
                "vf/schemas/trace-v1.schema.json", "vf/models/tiny_trained/model.safetensors",
                "vf/models/tiny_trained/tokenizer.json"):
        assert sub in names, sub
    target = tmp_path / "site"
    inst = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-compile", "--target",
                           str(target), str(wheel)], capture_output=True, text=True)
    assert inst.returncode == 0, inst.stderr[-2000:]
    top = sorted(p.name for p in target.iterdir() if not p.name.endswith(".dist-info") and p.name != "bin")
    assert top == ["vf"]
    entry = (next(target.glob("vf-*.dist-info")) / "entry_points.txt").read_text()
    assert "vf-eval = vf.commands.eval:main" in entry and "vf-rollout = vf.commands.rollout:main" in entry
    assert "vf-serve = vf.commands.serve:main" in entry and "vf = vf.commands.vf:main" in entry
    # the installed copy imports from the target dir, with the commands under vf.commands
    code = "import vf, vf.commands.eval, vf.environments.reverse_text as r; print(vf.__file__); print(r.__name__)"
    out = subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(target)!r}); {code}"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0].startswith(str(target))
