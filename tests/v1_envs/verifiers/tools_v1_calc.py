"""The per-rollout toolset of tools_v1 (its own module: a served toolset runs as `python -m MODULE`)."""

import verifiers.v1 as vf


class CalcState(vf.State):
    calls: int = 0


class CalcConfig(vf.ToolsetConfig):
    offset: int = 0


class Calc(vf.Toolset[CalcConfig, CalcState]):
    TOOL_PREFIX = None

    async def setup(self):
        self.ready = True

    @vf.tool
    async def add(self, a: int, b: int) -> str:
        """Add two integers."""
        self.state.calls += 1
        return str(a + b + self.config.offset + (0 if getattr(self, "ready", False) else 100) + 10 * (self.state.calls - 1))


if __name__ == "__main__":
    Calc.run()
