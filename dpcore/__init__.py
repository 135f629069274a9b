"""dpcore: differentially private deep learning that can be checked.

Events describe what ran (:mod:`dpcore.events`); accountants turn them into privacy guarantees
(:mod:`dpcore.accountants`); tradeoff functions give the f-DP view (:mod:`dpcore.tradeoff`).
"""

__version__ = "0.1.0"
