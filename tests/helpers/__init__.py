"""What several test modules share, imported as ``from tests.helpers.NAME import ...``:
builders of inputs and datasets, the ways to damage them, and waiting on child processes.
No tests here, and no test module imports another: what two of them need lives here, and
their shared fixtures in a conftest.py (tests/project/test_structure.py checks both)."""
