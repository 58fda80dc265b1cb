"""Shell: tasks that need the `bash` harness. `setup` writes a file into the rollout's runtime
(its own working directory); the model reads it through the harness's bash tool; `finalize`
reads the runtime back; the reward compares the reply with the file."""

import vf

__all__ = ["ShellTaskset"]


class ShellData(vf.TaskData):
    secret: str


class ShellTask(vf.Task[ShellData]):
    async def setup(self, runtime):
        await runtime.write("secret.txt", self.data.secret.encode())

    async def finalize(self, trace, runtime):
        result = await runtime.run(["cat", "secret.txt"], {})
        trace.info["secret_still_there"] = result.stdout.strip() == self.data.secret

    @vf.reward
    async def read_it(self, trace) -> float:
        return float(trace.last_reply.strip() == self.data.secret)

    @vf.metric
    async def kept(self, trace) -> float:
        return float(trace.info.get("secret_still_there", False))


class ShellTaskset(vf.Taskset[ShellTask]):
    def load(self):
        return [ShellTask(ShellData(prompt="What is in secret.txt?", secret=s)) for s in ("alpha", "beta")]
