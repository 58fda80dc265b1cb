"""Notes: tasks for the `compact` harness package (compact_harness/, on PYTHONPATH). `setup`
writes the task's note into the runtime (the third task has none); the model reads it with the
program's bash tool; the rewards check the final reply and the file the program wrote (the
harness's `answer_file`, set to `final.txt` on the command line: the knob must reach the
program). Run: --env.agent.harness.id compact --env.agent.harness.answer_file final.txt."""

import verifiers.v1 as vf

__all__ = ["NotesTaskset"]

ANSWER_FILE = "final.txt"


class NoteData(vf.TaskData):
    note: str | None = None
    expected: str


class NoteTask(vf.Task[NoteData]):
    async def setup(self, runtime):
        if self.data.note is not None:
            await runtime.write("note.txt", self.data.note.encode())

    @vf.reward
    async def replied(self, trace) -> float:
        return float(trace.last_reply.strip() == self.data.expected)

    @vf.reward(weight=0.5)
    async def wrote(self, runtime) -> float:
        result = await runtime.run(["cat", ANSWER_FILE], {})
        return float(result.exit_code == 0 and result.stdout.strip() == self.data.expected)


class NotesTaskset(vf.Taskset[NoteTask]):
    def load(self):
        rows = [("alpha", "alpha"), ("beta gamma", "beta gamma"), (None, "delta")]
        return [NoteTask(NoteData(prompt="What does note.txt say?", note=n, expected=e)) for n, e in rows]
