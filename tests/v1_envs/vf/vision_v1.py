"""Vision: prompts with image parts (PIL images as data URLs) that must reach the provider,
and an LLM judge called from a reward through an OpenAI-compatible client."""

import os

from PIL import Image

import vf
from vf.utils.image import image_data_url

__all__ = ["SeeTaskset"]


class SeeData(vf.TaskData):
    n_images: int


class YesJudge(vf.Judge):
    prompt = "Does '{reply}' say there are {n} images? Answer yes or no."

    async def score(self, task, trace) -> float:
        response = await self.complete(self.build_messages(reply=trace.last_reply, n=task.n_images), trace=trace)
        return float(response.text.strip().lower().startswith("yes"))


class SeeTask(vf.Task[SeeData]):
    @vf.reward
    async def saw(self, task, trace) -> float:
        return float(trace.last_reply == f"images: {task.n_images}")

    @vf.reward(weight=0.5)
    async def judged(self, task, trace) -> float:
        judge = YesJudge(vf.JudgeConfig(model="yes", base_url=os.environ["JUDGE_BASE_URL"],
                                        api_key_var="JUDGE_KEY"))
        return await judge.score(task, trace)

    @vf.metric
    async def judge_calls(self, trace) -> float:
        return float(len(trace.info.get("judge_calls", [])))


def _image(color):
    return image_data_url(Image.new("RGB", (4, 4), color))


class SeeTaskset(vf.Taskset[SeeTask]):
    def load(self):
        for n in (0, 1, 2):
            parts = [vf.TextContentPart(text=f"How many images? ({n})")]
            parts += [vf.ImageUrlContentPart(image_url=vf.ImageUrlSource(url=_image((40 * i, 0, 0))))
                      for i in range(n)]
            yield SeeTask(SeeData(prompt=[vf.UserMessage(content=parts)], n_images=n))
