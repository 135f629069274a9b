"""Empirical privacy audits: ``nox -s audit`` writes audits/results/<audit>.json and a report."""
