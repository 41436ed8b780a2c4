"""Images and videos in records: each reference read to bytes (hashed), its size read from the
header with EXIF orientation applied and its bytes checked whole, and its placeholder count
decided exactly as the model's own processor decides it (Qwen2-VL / Qwen2.5-VL / Qwen3-VL,
Gemma 3, LLaVA-1.5, LLaVA-NeXT, Idefics3 / SmolVLM; video for the Qwen family).

A leaf: it imports only ``sftdata.util`` and ``sftdata.errors``; Pillow (the ``vision`` extra)
only when an image is read, PyAV (the same extra) only when a video is (its container read,
no pixel decoded). Bad media is a ``MediaError`` whose ``reason`` the pipeline counts as a
reject (``media_missing``, ``media_unreadable``, ``media_unsupported``). docs/MEDIA.md.
"""

from .counts import MediaCount
from .errors import MEDIA_MISSING, MEDIA_UNREADABLE, MEDIA_UNSUPPORTED, MediaError
from .header import ImageHeader, image_header
from .qwen import VideoInfo
from .read import MediaBytes, read_media
from .settings import check_settings_agree, read_processor_settings, settings_differences, settings_from_dicts
from .tokens import image_count, video_count
from .video import video_info

__all__ = ["MEDIA_MISSING", "MEDIA_UNREADABLE", "MEDIA_UNSUPPORTED", "ImageHeader", "MediaBytes", "MediaCount",
           "MediaError", "VideoInfo", "check_settings_agree", "image_count", "image_header", "read_media",
           "read_processor_settings", "settings_differences", "settings_from_dicts", "video_count",
           "video_info"]
