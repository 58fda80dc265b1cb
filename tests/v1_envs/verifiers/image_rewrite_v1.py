"""Image rewrite: a request hook adds an image to the newest user message on its way to the model.
Run it with the stub model `vision` (it replies "images: N", N = the image parts it received).

`add_image` (priority 1) appends one image part (a data URL); `count_images` (priority 0) then
appends "(N images)" to the message's text, N = the image parts the message has by then, so it
shows the order the hooks ran in. The rewards: the model saw one image more than the prompt had,
and the prompt records the count after the image was added. A hook not run, run out of order or
run twice (an image too many) changes them.
"""

import verifiers.v1 as vf

__all__ = ["ImageRewriteTaskset"]

# a 1x1 PNG
PIXEL = ("data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIA"
         "X8jx0gAAAABJRU5ErkJggg==")


class ImageData(vf.TaskData):
    n_images: int
    """Image parts in the prompt as written."""


def _parts(message) -> list:
    content = message.content
    return [vf.TextContentPart(text=content)] if isinstance(content, str) else list(content)


def _images(parts) -> int:
    return sum(isinstance(p, vf.ImageUrlContentPart) for p in parts)


class ImageTask(vf.Task[ImageData]):
    @vf.intercept(priority=1)
    async def add_image(self, request: vf.Request) -> vf.Request | None:
        last = request.messages[-1]
        if last.role != "user":
            return None
        last.content = [*_parts(last), vf.ImageUrlContentPart(image_url=vf.ImageUrlSource(url=PIXEL))]
        return request

    @vf.intercept
    async def count_images(self, request: vf.Request) -> vf.Request | None:
        last = request.messages[-1]
        if last.role != "user":
            return None
        parts = _parts(last)
        last.content = [*parts, vf.TextContentPart(text=f"({_images(parts)} images)")]
        return request

    @vf.reward
    async def saw_the_added_image(self, trace) -> float:
        return float(trace.last_reply == f"images: {self.data.n_images + 1}")

    @vf.reward(weight=0.5)
    async def counted_after_adding(self, trace) -> float:
        (user,) = [m for m in trace.messages if m.role == "user"]
        parts = _parts(user)
        return float(_images(parts) == self.data.n_images + 1
                     and isinstance(parts[-1], vf.TextContentPart)
                     and parts[-1].text == f"({self.data.n_images + 1} images)")


class ImageRewriteTaskset(vf.Taskset[ImageTask]):
    def load(self):
        yield ImageTask(ImageData(prompt="How many images?", n_images=0))
        parts = [vf.TextContentPart(text="And now?"), vf.ImageUrlContentPart(image_url=vf.ImageUrlSource(url=PIXEL))]
        yield ImageTask(ImageData(prompt=[vf.UserMessage(content=parts)], n_images=1))
