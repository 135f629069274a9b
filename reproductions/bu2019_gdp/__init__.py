"""Bu, Dong, Long, Su 2019, "Deep Learning with Gaussian Differential Privacy".

arXiv 1911.11607.
"""
