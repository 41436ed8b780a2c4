"""One image's or video's placeholder count under pinned settings: the family's rule, chosen
by ``settings["family"]``. Pure functions of (settings, size), so ``verify`` can re-derive
every count from a dataset's recorded sizes and ``tokenizer_state.json`` alone."""

from __future__ import annotations

from ..errors import ConfigError
from .counts import MediaCount
from .qwen import VideoInfo, qwen_image, qwen_video
from .settings import FAMILY_NAMES, QWEN, known_family
from .tiles import gemma3_image, idefics3_image, llava_image, llava_next_image

IMAGE_RULES = {**dict.fromkeys(QWEN, qwen_image), "gemma3": gemma3_image, "llava": llava_image,
               "llava_next": llava_next_image, "idefics3": idefics3_image, "smolvlm": idefics3_image}


def _family(settings: dict) -> str:
    return known_family(settings, IMAGE_RULES, "pinned processor settings of family {family!r}: sftdata counts "
                                               "image tokens for {supported} only")


def image_count(settings: dict, width: int, height: int) -> MediaCount:
    """The tokens an image of ``width`` x ``height`` (EXIF orientation applied) expands to."""
    return IMAGE_RULES[_family(settings)](settings, width, height)


def video_count(settings: dict, video: VideoInfo) -> MediaCount:
    """The frames kept and the tokens a video expands to: the Qwen family only."""
    family = _family(settings)
    if family not in QWEN:
        raise ConfigError(f"{FAMILY_NAMES[family]} takes no video in sftdata: video is counted for the Qwen family only")
    return qwen_video({**settings["video"], "family": family}, video)
