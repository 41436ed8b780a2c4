"""The test suite. A package (not a namespace folder) so that ``tests.helpers`` is always this
folder's, even where an installed distribution brings a top-level ``tests`` package of its own;
pytest imports the test modules themselves by path (``--import-mode=importlib``), so test
modules in different folders may share a name."""
