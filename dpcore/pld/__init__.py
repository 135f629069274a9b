"""Privacy loss distributions (PLDs) on a grid: tight numerical composition with certified bounds.

A dominating pair (P, Q) of a mechanism is summarised by the P-distribution of its privacy loss
L = log(dP/dQ). Composition adds independent losses, so composed PLDs are convolutions, computed
here with the FFT (Koskela, Jälkö, Honkela 2020; Gopi, Lee, Wutschitz 2021). Discretisation is done
in two directions:

* pessimistic -- every atom is *split* between neighbouring grid losses preserving both its P- and
  Q-mass (a refinement of the pair, so the discrete pair dominates the true one: the "connect the
  dots" construction of Doroshenko, Ghazi, Kamath, Kumar, Manurangsi 2022);
* optimistic -- atoms are *merged* onto grid losses (a garbling, so the discrete pair is dominated
  by the true one), with P-mass removed or Q-mass added where needed to land exactly on the grid.

Both directions are closed under composition, so their hockey-stick divergences bracket the true
delta(epsilon) of any composition. A step that may follow either of two pairs (sampling without
replacement under replace-one) is dominated by the pair whose delta(epsilon) is the larger of
theirs (:func:`~dpcore.pld.loss_pmf.max_profile`, again pessimistic).
"""
