"""What a dataset holds, as data (``sftdata inspect`` draws it):

* ``overview(path, block_size=None)``: counts, lengths, trained shares, truncation cost,
  sources, options and rejects; packed datasets: rows, segments, fill (``overview``);
* ``views(path, split, episodes=/rows=/record=/sample=)``: episodes as decoded pieces,
  trained or not (``episodes``), or packed rows with their segments, positions and
  padding (``rows``), each with one line per token on request.
"""

from .episodes import EpisodeToken, EpisodeView, Piece, episode_view, find_record, pieces_of, sample_ids, spans_of
from .overview import (
    PERCENTILES,
    Histogram,
    Overview,
    PackedInfo,
    SplitOverview,
    TruncationCost,
    length_histogram,
    overview,
    share_histogram,
)
from .rows import RowToken, RowView, SegmentView, row_view, rows_of_record, select_rows
from .views import views

__all__ = [
    "PERCENTILES", "EpisodeToken", "EpisodeView", "Histogram", "Overview", "PackedInfo", "Piece", "RowToken",
    "RowView", "SegmentView", "SplitOverview", "TruncationCost", "episode_view", "find_record", "length_histogram",
    "overview", "pieces_of", "row_view", "rows_of_record", "sample_ids", "select_rows", "share_histogram",
    "spans_of", "views",
]
