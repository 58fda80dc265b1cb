"""Tiny SWE: two one-file repos whose test fails, for a real mini-swe-agent episode. `setup`
writes the repo into the runtime; the reward runs the repo's test there after the agent stops.
`sign` has `a - b` where `a + b` belongs; `offset` adds a stray `+ 1`. Run it with the
`mini_swe_local` harness (mini_swe_local.py, on PYTHONPATH): a scripted model whose fix is a
`sed` for the `sign` bug fixes one repo and leaves the other failing."""

import verifiers.v1 as vf

__all__ = ["SweTinyTaskset"]

TEST = "from calc import add\n\nassert add(2, 3) == 5, add(2, 3)\nassert add(-1, 1) == 0, add(-1, 1)\nprint('ok')\n"
REPOS = {
    "sign": "def add(a, b):\n    return a - b\n",
    "offset": "def add(a, b):\n    return a + b + 1\n",
}


class RepoData(vf.TaskData):
    code: str


class RepoTask(vf.Task[RepoData]):
    async def setup(self, runtime):
        await runtime.write("calc.py", self.data.code.encode())
        await runtime.write("test_calc.py", TEST.encode())

    @vf.reward
    async def solved(self, runtime) -> float:
        await runtime.write("test_calc.py", TEST.encode())  # a pristine test: an edited one does not count
        result = await runtime.run(["python3", "test_calc.py"], {})
        return float(result.exit_code == 0 and result.stdout.strip() == "ok")


class SweTinyTaskset(vf.Taskset[RepoTask]):
    def load(self):
        prompt = "`python3 test_calc.py` fails in this repository. Fix the bug in calc.py, then submit."
        return [RepoTask(RepoData(prompt=prompt, name=name, code=code)) for name, code in REPOS.items()]
