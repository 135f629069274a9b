"""Repository-level pytest configuration."""

import os
from pathlib import Path

import pytest
from hypothesis import settings

# ``python -m dpcore`` runs the CLI when imported; doctest collection must not import it.
collect_ignore = ["dpcore/__main__.py"]

# Property tests draw the same examples on every run, so CI results are reproducible; widen the
# search locally with HYPOTHESIS_PROFILE=explore (random examples, 5x more of them).
settings.register_profile("reproducible", derandomize=True, print_blob=True)
settings.register_profile("explore", derandomize=False, max_examples=500)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "reproducible"))


@pytest.fixture(scope="session")
def docs_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The documentation site, built once per test session (tutorials executed) for every test
    that reads it (``tests/test_docs.py``, ``tests/test_docs_browser.py``)."""
    from tests.test_docs import build_site

    return build_site(tmp_path_factory.mktemp("site"))
