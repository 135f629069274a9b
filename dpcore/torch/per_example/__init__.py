"""Per-example clipping engines: each returns the sum of clipped per-example gradients of a lot.

- :class:`~dpcore.torch.per_example.fast.FastEngine`: exact norms without materialising
  per-example gradients (ghost norms + book-keeping) for common layers;
- :class:`~dpcore.torch.per_example.vmap.VmapEngine`: exact, any module vmap can run, via
  ``torch.func``;
- :class:`~dpcore.torch.per_example.loop.LoopEngine`: exact, any differentiable module, by
  autograd on one example at a time;
- :class:`~dpcore.torch.per_example.jl.JLEngine`: norms estimated by random projections.
"""
