"""Repository-level pytest configuration."""

# ``python -m dpcore`` runs the CLI when imported; doctest collection must not import it.
collect_ignore = ["dpcore/__main__.py"]
