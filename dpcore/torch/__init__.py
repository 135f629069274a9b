"""DP training in PyTorch: samplers, per-example clipping engines, DP optimizers and a ledger.

Requires the ``torch`` extra (``pip install dpcore[torch]``). The parts are separate:

- :mod:`dpcore.torch.samplers` draws lots (Poisson by default);
- :mod:`dpcore.torch.per_example` turns a lot into the sum of clipped per-example gradients
  (exact fast path, exact ``torch.func`` path, or JL-estimated norms);
- :mod:`dpcore.torch.optimizers` adds Gaussian noise and steps a wrapped torch optimizer;
- :mod:`dpcore.torch.ledger` records one privacy event per step, readable by any accountant;
- :mod:`dpcore.torch.training` ties them together with checkpoints and a progress bar;
- :mod:`dpcore.torch.loaders` draws Poisson lots from any map-style ``Dataset`` through a
  ``DataLoader``, in micro-batches (virtual lots), and :mod:`dpcore.torch.private`
  (``make_private``) keeps the user's own training loop;
- :mod:`dpcore.torch.batches`: lots of tensors, tuples or dicts.
"""
