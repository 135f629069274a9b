"""Abadi et al. 2016, "Deep Learning with Differential Privacy" (arXiv 1607.00133)."""
