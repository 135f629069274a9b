"""The torch device a reproduction trains on: ``$DPCORE_DEVICE``, else CUDA when torch sees a GPU.

Imports torch only when asked (the TF Privacy environment imports the reproductions' constants
without torch).
"""

from __future__ import annotations

import os

from dpcore.errors import InvalidParameterError

#: Environment variable that picks the torch device of the reproductions' training runs.
DEVICE_VARIABLE = "DPCORE_DEVICE"


def default_device() -> str:
    """``$DPCORE_DEVICE`` if set (``cpu`` or ``cuda``), else ``cuda`` when torch sees a GPU.

    Raises:
        InvalidParameterError: ``$DPCORE_DEVICE`` is neither ``cpu`` nor ``cuda``.
    """
    chosen = os.environ.get(DEVICE_VARIABLE, "").strip().lower()
    if chosen:
        if chosen not in ("cpu", "cuda"):
            raise InvalidParameterError(DEVICE_VARIABLE, "'cpu' or 'cuda'", chosen)
        return chosen
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
