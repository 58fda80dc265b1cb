"""verifiers' library environment classes that build their own rows and rubric, for migrated code
(`compat.ReasoningGymEnv` builds them from here).

`vf-migrate` keeps a `load_environment()` that returns one of these and runs it at load time
through `compat.V0Taskset` (rule ENV013), as it does EnvGroup: the class here builds the same
rows and the same v0 rubric the release did, so a migrated env gives the rewards v0 gave.

- `ReasoningGymEnv(gym, num_train_examples, num_eval_examples, system_prompt, parser, seed)`
  (0.1.8+; 0.1.14+ under `envs.integrations`, 0.3.x in `verifiers.legacy`): the
  `reasoning-gym` package's generated problems, one procedural dataset (a name, or a list of
  names / `DatasetSpec` dicts made into a composite) of `train + eval` entries; row i's answer is
  `str(i)`, and the reward is the generator's `score_answer` on the `<answer>` field (`XMLParser`
  by default), plus the parser's format reward at weight 0. The same code as 0.1.8–0.3.1.

Nothing here imports reasoning_gym until such an env is built.
"""

from __future__ import annotations

from typing import Any

from vf.errors import UsageError
from vf.migrate.compat import Parser, Rubric, SingleTurnEnv, XMLParser

RG_HINT = "pip install reasoning-gym   (or the vf extras: pip install 'vf[gym]')"


def _reasoning_gym():
    try:
        import reasoning_gym
        from reasoning_gym.composite import DatasetSpec
        from reasoning_gym.utils import SYSTEM_PROMPTS
    except ImportError:
        raise UsageError("this migrated environment is a v0 ReasoningGymEnv, which needs the `reasoning-gym` "
                         "package; it is not installed", hint=RG_HINT) from None
    return reasoning_gym, DatasetSpec, SYSTEM_PROMPTS


class ReasoningGymEnv(SingleTurnEnv):
    """v0 `ReasoningGymEnv` (see the module docstring)."""

    def __init__(self, gym: str | list[str | dict], num_train_examples: int = 1000, num_eval_examples: int = 100,
                 system_prompt: str | None = None, parser: Parser | None = None, seed: int = 0, **kwargs: Any):
        rg, DatasetSpec, prompts = _reasoning_gym()
        self.gym, self.seed = gym, seed
        self.num_train_examples, self.num_eval_examples = num_train_examples, num_eval_examples
        total = num_train_examples + num_eval_examples
        if isinstance(gym, str):
            self.rg_dataset = rg.create_dataset(gym, size=total, seed=seed)
        else:
            specs = []
            for spec in gym:
                if isinstance(spec, str):
                    specs.append(DatasetSpec(name=spec, weight=1.0, config={}))
                elif isinstance(spec, dict):
                    specs.append(DatasetSpec(**spec))
                else:
                    raise ValueError(f"Invalid dataset config: {spec}")
            self.rg_dataset = rg.create_dataset("composite", datasets=specs, size=total, seed=seed)
        train, evals = [], []
        for i, entry in enumerate(self.rg_dataset):
            row = {"question": entry["question"], "answer": str(i),
                   "info": {"source_dataset": entry["metadata"]["source_dataset"]}}
            (train if i < num_train_examples else evals).append(row)
        parser = parser or XMLParser(fields=["answer"])
        rubric = Rubric(parser=parser)
        rg_dataset = self.rg_dataset

        async def check_answer_reward_func(completion, answer: str, **kwargs: Any) -> float:
            entry = rg_dataset[int(answer)]  # the row's answer is its entry's index
            response = str(parser.parse_answer(completion)).strip()
            return rg_dataset.score_answer(answer=response, entry=entry)

        rubric.add_reward_func(check_answer_reward_func)
        rubric.add_reward_func(parser.get_format_reward_func(), weight=0.0)
        super().__init__(parser=parser, rubric=rubric, dataset=train, eval_dataset=evals,
                         system_prompt=prompts["default"] if system_prompt is None else system_prompt, **kwargs)
