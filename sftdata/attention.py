"""``from sftdata.attention import block_causal_mask, cu_seqlens``: the documented import
path of the block-diagonal attention helpers, which live in ``sftdata.packing.attention``."""

from .packing.attention import PAD_SEQ_ID, block_causal_mask, cu_seqlens

__all__ = ["PAD_SEQ_ID", "block_causal_mask", "cu_seqlens"]
