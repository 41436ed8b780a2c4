"""An episode's media as a model takes them: each span's bytes read again from its recorded
URI and checked against its recorded sha256, decoded with Pillow (EXIF orientation applied,
as transformers' ``load_image``), and run through the model's image processor, built from
the settings pinned in ``tokenizer_state.json``::

    spans of one batch (in token order)  ->  pixel_values   (sum of t*h*w patches, C * T * P * P)
                                             image_grid_thw (images, 3), one row per span

Each grid the processor returns is checked equal to the grid recorded at prepare time: a
processor that resizes differently (other min/max pixels, another library version) would
give another number of vision features than the image tokens the ids hold, so it is refused
by name (``ResolutionDriftError``) instead of failing inside the model. This runs where the
collator runs: in the ``DataLoader``'s worker processes.
"""

from __future__ import annotations

import importlib.util
import io
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import ConfigError, DatasetError
from ..media.errors import MediaError
from ..media.item import IMAGE, MediaSpan
from ..media.pillow import pillow
from ..media.read import read_media
from ..media.settings import FAMILY_NAMES, QWEN


class MediaChangedError(DatasetError):
    """A media file's bytes are not the ones the dataset was prepared from (its sha256 differs)."""


class ResolutionDriftError(DatasetError):
    """The image processor makes another grid of an image than the one recorded at prepare time."""


def image_processor(settings: dict):
    """The model's image processor, built from pinned ``settings``: the Qwen-VL family's
    ``Qwen2VLImageProcessor`` (its torchvision backend where torchvision is installed, else
    the Pillow one) with the pinned min / max pixels, patch, merge and temporal patch sizes."""
    family = settings.get("family")
    if family not in QWEN:
        raise ConfigError(f"sftdata loads the pixels of the Qwen-VL family only so far, not "
                          f"{FAMILY_NAMES.get(family, family)}'s; pass your own processor (processor=...)")
    import transformers  # optional dependency: only where pixels are made

    if importlib.util.find_spec("torchvision") is not None:
        cls = transformers.Qwen2VLImageProcessor
    else:
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil as cls
    return cls(size={"shortest_edge": int(settings["min_pixels"]), "longest_edge": int(settings["max_pixels"])},
               patch_size=int(settings["patch_size"]), merge_size=int(settings["merge_size"]),
               temporal_patch_size=int(settings["temporal_patch_size"]))


def span_bytes(span: MediaSpan, media_root: str | Path | None = None, where: str = "") -> bytes:
    """The bytes of a span's item, read from its recorded URI (a relative path against
    ``media_root``) and checked against its recorded sha256."""
    item = span.item
    name = f"{where}: " if where else ""
    if item.uri == "data:":
        raise DatasetError(f"{name}{item.kind} at token {span.offset} was an inline data: URL, whose bytes the dataset "
                           f"does not keep; give such media as files (or URLs) and prepare again")
    try:
        got = read_media(item.uri, media_root=media_root)
    except MediaError as e:
        raise DatasetError(f"{name}{item.kind} at token {span.offset} cannot be read again: {e}") from None
    if got.sha256 != item.sha256:
        raise MediaChangedError(f"{name}{item.uri} changed since the dataset was prepared: sha256 {got.sha256[:16]}..., "
                                f"recorded {item.sha256[:16]}... ({len(got.data):,} bytes, recorded "
                                f"{item.nbytes:,}); restore the file, or prepare the dataset again")
    return got.data


def decode_image(data: bytes, where: str = ""):
    """An image's pixels as a processor takes them: EXIF orientation applied, RGB."""
    Image = pillow()
    from PIL import ImageOps

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as im:
                return ImageOps.exif_transpose(im).convert("RGB")
    except Exception as e:  # a decoder's own errors: the header was checked at prepare, the pixels were not
        raise DatasetError(f"{where}: the image cannot be decoded ({type(e).__name__}: {e})") from None


@dataclass
class MediaLoader:
    """Pixels of spans under pinned ``settings`` (picklable: a worker process builds its own
    processor on first use). ``processor``: the model's own image processor, else one built
    from the settings. ``media_root``: where relative URIs are read from."""

    settings: dict
    media_root: str | None = None
    processor: object | None = None
    _built: object | None = field(default=None, repr=False, compare=False)

    def __getstate__(self) -> dict:
        return {"settings": self.settings, "media_root": self.media_root, "processor": self.processor, "_built": None}

    def _processor(self):
        if self.processor is not None:
            return self.processor
        if self._built is None:
            self._built = image_processor(self.settings)
        return self._built

    def images(self, spans: list[tuple[str, MediaSpan]]) -> dict[str, np.ndarray]:
        """``pixel_values`` and ``image_grid_thw`` of ``spans`` (``(where, span)``, in the order
        the model meets their tokens); each grid checked against the recorded one."""
        for where, span in spans:
            if span.item.kind != IMAGE:
                raise ConfigError(f"{where}: a {span.item.kind} at token {span.offset}: sftdata loads the pixels of "
                                  f"images only so far; leave video episodes out of this split")
        if not spans:
            return {}
        pictures = [decode_image(span_bytes(span, self.media_root, where), f"{where}: {span.item.uri}")
                    for where, span in spans]
        out = self._processor()(images=pictures, return_tensors="np")
        pixels = np.asarray(out["pixel_values"], dtype=np.float32)
        grids = np.asarray(out["image_grid_thw"], dtype=np.int64)
        for (where, span), grid in zip(spans, grids.tolist()):
            recorded = list(span.item.count.grid)
            if grid != recorded:
                w, h = span.item.size
                raise ResolutionDriftError(
                    f"{where}: the image processor makes a {w}x{h} image ({span.item.uri}) a grid of {tuple(grid)}, the "
                    f"dataset recorded {tuple(recorded)} ({span.item.count.tokens} image tokens): it resizes differently "
                    f"from the processor the dataset was prepared with. Use the pinned settings "
                    f"(image_processor(settings)), or prepare again with this processor")
        return {"pixel_values": pixels, "image_grid_thw": grids}
