"""Adapters: DP-SGD implementations (dpcore's, the peers', hand-written and planted-bug loops)
behind the :class:`dpcore.auditing.implementation.Implementation` contract."""
