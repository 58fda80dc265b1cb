"""The shared (taskset-wide) toolset of tools_v1."""

import vf


class Notes(vf.Toolset[vf.SharedToolsetConfig]):
    @vf.tool
    async def note(self, text: str) -> str:
        """Remember a note."""
        return text


if __name__ == "__main__":
    Notes.run()
