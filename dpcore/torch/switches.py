"""torch's process-wide switches, set for a block and restored after it, safely across threads.

Several engines switch a global setting of torch for the duration of a computation: IEEE float32
instead of TF32 for the first-lot reference (:mod:`dpcore.torch.per_example.fast`), ATen's
native RNN kernel instead of oneDNN's (:func:`dpcore.torch.layers.native_rnn_kernel`), attention
without fused kernels for forward-mode products (:mod:`dpcore.torch.forward_mode`). Saving the
setting, changing it and restoring it is wrong when runs share a process (a thread pool, Dask's
threads): two overlapping blocks restore in the wrong order and leave the switch changed for
good. :func:`switched` counts the blocks that hold each switch: the first one saves the setting
and sets the value, the last one to leave restores the saved setting.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["switched"]

_LOCK = threading.Lock()
#: name -> (blocks holding it, the value they set, the setting before the first of them)
_HELD: dict[str, tuple[int, Any, Any]] = {}


@contextlib.contextmanager
def switched(
    name: str, get: Callable[[], Any], set_: Callable[[Any], Any], value: Any
) -> Iterator[None]:
    """Hold the switch ``name`` at ``value`` for the block; the last block to leave restores it.

    Args:
        name: the switch (one name per global setting).
        get: reads the setting.
        set_: writes it.
        value: the value the block needs.

    Raises:
        RuntimeError: another block holds ``name`` at a different value (two blocks that need
            opposite settings cannot overlap).

    Example:
        >>> state = {"on": True}
        >>> with switched("demo", lambda: state["on"], lambda v: state.update(on=v), False):
        ...     with switched("demo", lambda: state["on"], lambda v: state.update(on=v), False):
        ...         state["on"]
        ...     state["on"]
        False
        False
        >>> state["on"]
        True
    """
    with _LOCK:
        held, wanted, saved = _HELD.get(name, (0, value, None))
        if held and wanted != value:
            raise RuntimeError(f"{name} is held at {wanted!r} by another block, not {value!r}")
        if held == 0:
            saved = get()
            set_(value)
        _HELD[name] = (held + 1, value, saved)
    try:
        yield
    finally:
        with _LOCK:
            held, wanted, saved = _HELD[name]
            if held == 1:
                set_(saved)
                del _HELD[name]
            else:
                _HELD[name] = (held - 1, wanted, saved)
