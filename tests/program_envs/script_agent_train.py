"""`script_agent`'s tasks with a reward that varies between rollouts (whether the token ids of
the policy's first reply sum to an odd number), so the tiny random policy gives groups something
to learn from."""

import vf
from script_agent import Data, FileTask, ScriptAgent


class VariedTask(FileTask):
    @vf.reward
    def odd_first_reply(self, trace) -> float:
        replies = [n for n in trace.nodes if n.sampled]
        return float(sum(replies[0].token_ids or []) % 2) if replies else 0.0


class VariedTaskset(vf.Taskset[VariedTask]):
    def load(self):
        return [VariedTask(Data(prompt=f"Write {w} into out.txt.", expected=w)) for w in ("hi", "bye", "yes", "no")]


__all__ = ["ScriptAgent", "VariedTaskset"]
