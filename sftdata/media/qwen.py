"""Qwen2-VL, Qwen2.5-VL and Qwen3-VL: an image's or a video's grid and token count, decided as
their processors decide them (transformers ``models/qwen2_vl``: ``smart_resize``,
``Qwen2VLImageProcessor``, ``Qwen2VLVideoProcessor.sample_frames``, ``resize`` and ``patchify``).

An image of ``height`` x ``width`` is resized to a multiple of ``factor = patch_size *
merge_size`` on each side, holding its pixels within [min_pixels, max_pixels]::

    smart_resize(480, 640, factor=28, min_pixels=3136, max_pixels=1003520) == (476, 644)
    grid_thw = (1, 476 // 14, 644 // 14) == (1, 34, 46);  tokens = 1 * 34 * 46 // 2**2 == 391

A video keeps the frames its sampling rule picks (all of them unless ``do_sample_frames``),
padded to a multiple of ``temporal_patch_size`` by repeating the last: ``grid_t = ceil(frames /
temporal_patch_size)``; each frame is resized as an image is, within the video's own pixel
bounds (and, with ``cap_pixels_per_frame``, within a share of a whole-video budget).
Qwen3-VL's video processor (``models/qwen3_vl``) samples ``fps`` frames a second by
``linspace`` (24 fps assumed where the container says none), resizes within bounds over all
frames together, and its processor writes each temporal patch's time before its tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import ConfigError
from .counts import MediaCount
from .errors import MEDIA_UNSUPPORTED, MediaError

MAX_ASPECT_RATIO = 200  # smart_resize refuses a longer side over 200 times the shorter


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """(height, width) after Qwen2-VL's resize; an aspect ratio over 200 is ``media_unsupported``
    (the processor raises on it)."""
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise MediaError(MEDIA_UNSUPPORTED, f"an image of {width}x{height}: the Qwen-VL processor refuses an aspect "
                         f"ratio over {MAX_ASPECT_RATIO} ({max(height, width) / min(height, width):.1f})")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def qwen_image(settings: dict, width: int, height: int) -> MediaCount:
    """The grid ``(1, h, w)`` and tokens ``h * w // merge_size**2`` of one image (pinned
    ``settings``: min_pixels, max_pixels, patch_size, merge_size)."""
    patch, merge = settings["patch_size"], settings["merge_size"]
    h, w = smart_resize(height, width, patch * merge, settings["min_pixels"], settings["max_pixels"])
    grid = (1, h // patch, w // patch)
    return MediaCount(tokens=grid[1] * grid[2] // merge ** 2, processed=(h, w), grid=grid)


@dataclass(frozen=True)
class VideoInfo:
    """What a video's container says: its frame count, frame rate (None when unknown), and
    the size of its decoded frames."""

    frames: int
    fps: float | None
    width: int
    height: int

    @property
    def duration(self) -> float | None:
        return self.frames / self.fps if self.fps else None


def sampled_frames(settings: dict, video: VideoInfo) -> int:
    """How many frames ``Qwen2VLVideoProcessor.sample_frames`` keeps: all of them unless
    ``do_sample_frames``; else ``num_frames`` rounded to the temporal patch, or ``fps`` frames a
    second within [min_frames, max_frames] and the video's own count, floored to the temporal
    patch. The kept indices are ``arange(0, total, total / n)``: their count is
    ``ceil(total / (total / n))`` in double precision, as torch sizes it."""
    total, tps = video.frames, settings["temporal_patch_size"]
    if not settings.get("do_sample_frames"):
        return total
    num, fps = settings.get("num_frames"), settings.get("fps")
    if num is not None and fps is not None:
        raise ConfigError("the video settings give both num_frames and fps: the Qwen-VL processor takes one")
    if num is not None:
        num = round(num / tps) * tps
    elif fps is not None:
        if video.fps is None:
            raise MediaError(MEDIA_UNSUPPORTED, "a video without a frame rate, sampled at fps frames a second: "
                             "its container must say its frame rate")
        most = math.floor(min(settings["max_frames"], total) / tps) * tps
        num = min(max(total / video.fps * fps, settings["min_frames"]), most, total)
        num = math.floor(num / tps) * tps
    else:
        return total
    if num > total or num <= 0:
        raise MediaError(MEDIA_UNSUPPORTED, f"a video of {total} frames cannot be sampled to {num} frames "
                         f"(temporal patch {tps}); the Qwen-VL processor refuses it")
    return math.ceil(total / (total / num))


def qwen_video(settings: dict, video: VideoInfo) -> MediaCount:
    """The frames kept, the grid ``(t, h, w)`` and tokens ``t * h * w // merge_size**2`` of one
    video, as ``Qwen2VLVideoProcessor`` (or, for ``family`` qwen3_vl, ``Qwen3VLVideoProcessor``)
    decides them (pinned video ``settings``)."""
    if settings.get("family") == "qwen3_vl":
        return qwen3_video(settings, video)
    patch, merge, tps = settings["patch_size"], settings["merge_size"], settings["temporal_patch_size"]
    frames = sampled_frames(settings, video)
    factor = patch * merge
    max_pixels = settings["max_pixels"]
    if settings.get("cap_pixels_per_frame"):
        total_pixels = int(settings["max_video_tokens"] * factor * factor * 0.9)
        max_pixels = max(min(max_pixels, total_pixels * tps // frames), int(settings["min_pixels"] * 1.05))
    h, w = smart_resize(video.height, video.width, factor, settings["min_pixels"], max_pixels)
    grid = (-(-frames // tps), h // patch, w // patch)
    return MediaCount(tokens=grid[0] * grid[1] * grid[2] // merge ** 2, processed=(h, w), grid=grid, frames=frames)


# ------------------------------------------------------------------------------------- Qwen3-VL
QWEN3_DEFAULT_FPS = 24  # what Qwen3-VL's processor assumes of a video whose frame rate is unknown


def qwen3_frame_indices(settings: dict, video: VideoInfo) -> list[int]:
    """The frames ``Qwen3VLVideoProcessor.sample_frames`` keeps: ``num_frames``, or ``fps`` a
    second within [min_frames, max_frames] and the video's count, else the video's count within
    the bounds; spread by ``linspace(0, total - 1, n)`` rounded half to even (numpy)."""
    total = video.frames
    if not settings.get("do_sample_frames"):
        return list(range(total))
    num, fps = settings.get("num_frames"), settings.get("fps")
    if num is not None and fps is not None:
        raise ConfigError("the video settings give both num_frames and fps: the Qwen-VL processor takes one")
    if num is None and fps is not None:
        num = int(total / (video.fps or QWEN3_DEFAULT_FPS) * fps)
        num = min(max(num, settings["min_frames"]), settings["max_frames"], total)
    if num is None:
        num = min(max(total, settings["min_frames"]), settings["max_frames"])
    if num == 1:
        return [0]
    step = (total - 1) / (num - 1)
    return [round(i * step) if i < num - 1 else total - 1 for i in range(num)]


def qwen3_smart_resize(frames: int, height: int, width: int, temporal: int, factor: int, min_pixels: int,
                       max_pixels: int) -> tuple[int, int]:
    """(height, width) of Qwen3-VL's video ``smart_resize``: a side under ``factor`` scaled up
    first, the pixel bounds over all frames (``t_bar * h * w``)."""
    if frames < temporal:
        raise MediaError(MEDIA_UNSUPPORTED, f"a video sampled to {frames} frames: the Qwen3-VL processor needs at "
                         f"least {temporal} (its temporal patch)")
    if height < factor or width < factor:
        scale = max(factor / height, factor / width)
        height, width = int(height * scale), int(width * scale)
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise MediaError(MEDIA_UNSUPPORTED, f"a video of {width}x{height}: the Qwen-VL processor refuses an aspect "
                         f"ratio over {MAX_ASPECT_RATIO} ({max(height, width) / min(height, width):.1f})")
    h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
    t_bar = round(frames / temporal) * temporal
    if t_bar * h_bar * w_bar > max_pixels:
        beta = math.sqrt((frames * height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif t_bar * h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (frames * height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def qwen3_timestamps(indices: list[int], fps: float, temporal: int) -> tuple[float, ...]:
    """Each temporal patch's time, the mean of its first and last frame's (``Qwen3VLProcessor.
    _calculate_timestamps``): the processor writes ``<{t:.1f} seconds>`` before its tokens."""
    indices = list(indices) + [indices[-1]] * (-len(indices) % temporal)
    times = [i / fps for i in indices]
    return tuple((times[i] + times[i + temporal - 1]) / 2 for i in range(0, len(times), temporal))


def qwen3_video(settings: dict, video: VideoInfo) -> MediaCount:
    patch, merge, tps = settings["patch_size"], settings["merge_size"], settings["temporal_patch_size"]
    indices = qwen3_frame_indices(settings, video)
    frames, factor, max_pixels = len(indices), patch * merge, settings["max_pixels"]
    if settings.get("cap_pixels_per_frame"):
        per_frame = max(min(settings["max_video_tokens"] * factor * factor, max_pixels // frames),
                        int(settings["min_pixels"] * 1.05))
        max_pixels = per_frame * frames
    h, w = qwen3_smart_resize(frames, video.height, video.width, tps, factor, settings["min_pixels"], max_pixels)
    grid = (-(-frames // tps), h // patch, w // patch)
    return MediaCount(tokens=grid[0] * grid[1] * grid[2] // merge ** 2, processed=(h, w), grid=grid, frames=frames,
                      timestamps=qwen3_timestamps(indices, video.fps or QWEN3_DEFAULT_FPS, tps))
