"""Shipping an audited implementation to other processes: refused early when it cannot travel.

The audits fan their training runs and seeds out through :func:`dpcore.runs.run_many`; an
executor named by a string other than ``"local"`` (``"processes:N"``, ``"dask"``, ``"ray"``,
``"slurm"``) pickles the implementation into each worker. An adapter holding an open process,
file or lock cannot be pickled: that is said before any run starts, naming the parameter,
instead of as a failed run after the pool is up. An executor object given by the caller is
taken as it is (a thread pool needs no pickling).
"""

from __future__ import annotations

import pickle
from typing import Any

from dpcore.errors import InvalidParameterError

__all__ = ["check_shippable"]


def check_shippable(implementation: object, executor: Any) -> None:
    """Raise unless ``implementation`` can be sent to the processes ``executor`` names.

    Raises:
        InvalidParameterError: ``executor`` names processes or an engine and ``implementation``
            does not pickle (define its class at module level; drop open handles in
            ``__getstate__``).

    Example:
        >>> check_shippable(lambda task, observer: None, None)
        >>> check_shippable(lambda task, observer: None, "processes:2")
        Traceback (most recent call last):
        ...
        dpcore.errors.InvalidParameterError: Expected implementation an object that pickles \
(a module-level class) for executor 'processes:2', got <function <lambda> at ...>.
    """
    if not isinstance(executor, str) or executor == "local":
        return
    try:
        pickle.dumps(implementation)
    except Exception:  # pickling raises many types (PicklingError, TypeError, AttributeError)
        raise InvalidParameterError(
            "implementation",
            f"an object that pickles (a module-level class) for executor {executor!r}",
            implementation,
        ) from None
