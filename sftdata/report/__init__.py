"""What a dataset holds, as data (``sftdata inspect`` draws it):

* ``overview(path, block_size=None)``: counts, lengths, trained shares, truncation cost,
  sources, options and rejects; packed datasets: rows, segments, fill (``overview``);
* ``views(path, split, episodes=/rows=/record=/sample=)``: episodes as decoded pieces,
  trained or not, or packed rows with their segments, positions and padding
  (``views``), each with one line per token on request;
* ``dataset_report(path, ...)``: everything the HTML page shows (``collect``: the
  distributions behind its plots, input files, rejects, sampled episodes token by token),
  and ``write_report(path, output, compare=...)``: the page itself (``html``, ``plots``;
  plotly is the ``report`` extra), what ``sftdata report`` writes.
"""

from .collect import DatasetReport, SplitFigures, dataset_report
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
from .select import views
from .views import (
    EpisodeToken,
    EpisodeView,
    Piece,
    RowToken,
    RowView,
    SegmentView,
    episode_view,
    find_record,
    pieces_of,
    row_view,
    rows_of_record,
    sample_ids,
    select_rows,
    spans_of,
)
from .write import ReportSummary, write_report

__all__ = [
    "PERCENTILES", "DatasetReport", "EpisodeToken", "EpisodeView", "Histogram", "Overview", "PackedInfo", "Piece",
    "ReportSummary", "RowToken", "RowView", "SegmentView", "SplitFigures", "SplitOverview", "TruncationCost",
    "dataset_report", "episode_view", "find_record", "length_histogram", "overview", "pieces_of", "row_view",
    "rows_of_record", "sample_ids", "select_rows", "share_histogram", "spans_of", "views", "write_report",
]
