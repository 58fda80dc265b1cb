"""Make tests/v1_envs/vf/ from tests/v1_envs/verifiers/: the same environments with only their
imports changed from `verifiers.v1` to `vf` (run: python tests/v1_envs/sync.py)."""

from pathlib import Path

HERE = Path(__file__).parent


def port(text: str) -> str:
    return text.replace("import verifiers.v1 as vf", "import vf").replace("verifiers.v1.", "vf.")


def sync() -> list[Path]:
    out = []
    for src in sorted((HERE / "verifiers").rglob("*")):
        if src.is_dir() or "__pycache__" in src.parts:
            continue
        dst = HERE / "vf" / src.relative_to(HERE / "verifiers")
        dst.parent.mkdir(parents=True, exist_ok=True)
        text = src.read_text()
        dst.write_text(port(text) if src.suffix == ".py" else text)
        out.append(dst)
    return out


if __name__ == "__main__":
    for p in sync():
        print(p)
