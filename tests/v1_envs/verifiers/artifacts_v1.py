"""Artifacts: a task declares the files its grading needs (`TaskData.artifacts`), its finalize
collects them with `vf.collect` into `trace.state.artifacts` (source → tar archive, None for a
missing optional one), and the reward and metrics read the collected archives, not the runtime.

verifiers 0.4 collects declared artifacts only when an env asks (`collect_artifacts=True`, which
its subprocess runtime refuses) and resolves a relative source against the runtime config's
`workdir` ("/" on subprocess), so finalize names each declared file by its absolute path in the
rollout's working directory and collects it itself, without the `/logs/artifacts` sweep."""

import io
import tarfile
from pathlib import Path

import verifiers.v1 as vf

__all__ = ["ArtifactTaskset"]


class ArtifactData(vf.TaskData):
    expected: str


def files(archive: bytes | None) -> dict[str, str]:
    """Basename → text of every regular file in a collected archive."""
    if archive is None:
        return {}
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        return {Path(m.name).name: tar.extractfile(m).read().decode() for m in tar.getmembers() if m.isfile()}


class ArtifactTask(vf.Task[ArtifactData]):
    async def finalize(self, trace, runtime):
        where = Path(str(runtime.workdir))
        declared = [a.model_copy(update={"source": str(where / a.source)}) for a in self.data.artifacts]
        trace.state.artifacts = await vf.collect(runtime, declared, sweep=False)

    @vf.reward
    async def answered(self, trace) -> float:
        got = {}
        for archive in trace.state.artifacts.values():
            got.update(files(archive))
        return float(got.get("out.txt", "").strip() == self.data.expected)

    @vf.metric
    async def collected(self, trace) -> float:
        return float(sum(a is not None for a in trace.state.artifacts.values()))

    @vf.metric
    async def missing(self, trace) -> float:
        return float(sum(a is None for a in trace.state.artifacts.values()))

    @vf.metric
    async def files_in_dir(self, trace) -> float:
        return float(sum(len(files(a)) for a in trace.state.artifacts.values()))


class ArtifactTaskset(vf.Taskset[ArtifactTask]):
    def load(self):
        out = vf.Artifact(source="out.txt")
        folder = vf.Artifact(source="notes", exclude=["*.tmp"])
        optional = vf.Artifact(source="extra.txt", required=False)
        yield ArtifactTask(ArtifactData(prompt="Write 42 to out.txt.", expected="42", artifacts=[out]))
        yield ArtifactTask(ArtifactData(prompt="Write 7 to out.txt.", expected="7", artifacts=[out, optional]))
        yield ArtifactTask(ArtifactData(prompt="Write 42 to out.txt; keep notes.", expected="42",
                                        artifacts=[out, folder, optional]))
        yield ArtifactTask(ArtifactData(prompt="Write 42 to missing.txt.", expected="42",
                                        artifacts=[vf.Artifact(source="missing.txt")]))
