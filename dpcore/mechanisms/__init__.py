"""Closed forms for single mechanisms (no composition, no accounting state)."""
