"""Batch samplers side by side: Poisson, shuffled fixed-size batches, balls in bins.

At the DP-SGD settings of Abadi et al. 2016 (MNIST, three noise levels) and Bu et al. 2021
(MNIST, Fig. 4), one table of epsilons: Poisson subsampling (what the papers analyse), a certified
*lower* bound for shuffled batches (what most code runs), and a certified upper bound for balls
in bins (random allocation, which keeps fixed passes over the data and has a valid analysis).
"""
