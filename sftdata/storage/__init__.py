"""Where a dataset's bytes are kept, safely: the commit protocol (``manifest``: the metadata
file a writer puts last, and the files it lists, which are all sftdata may ever remove),
file-system safety (``fsops``: nothing written through a link, owned folders), locks
(``lock``), what a killed run left (``leftovers``), and object storage (``objects``,
``object_cache``, ``object_commit``, ``object_upload``; ``location``: a path or a URL).
It knows no other file name of the format: ``sftdata.store`` does.
"""
