"""sftdata: turn chat and tool-calling conversations into training-ready SFT datasets.

Kept import-light: ``import sftdata.loader`` needs numpy alone.
"""

__version__ = "0.1.0"
