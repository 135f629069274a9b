"""Constants shared by the reproductions of Bu, Gopi, Kulkarni, Lee, Shen, Tantipongpipat 2021.

"Fast and Memory Efficient Differentially Private-SGD via JL Projections" (arXiv 2102.03013,
NeurIPS 2021). Numbers taken from the paper cite their place; numbers we could not check against
the paper's text are marked *assumption* here and in the README.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from dpcore.runs.markers import write_between_markers
from reproductions.harness.device import DEVICE_VARIABLE as DEVICE_VARIABLE
from reproductions.harness.device import default_device as default_device

if TYPE_CHECKING:
    # Not imported at run time: the TF Privacy baseline imports this module without torch.
    from reproductions.harness.output import Output

README = Path(__file__).with_name("README.md")

#: IMDb training reviews (§5: 25,000 training samples).
IMDB_TRAIN_SIZE = 25_000
#: MNIST training images (§5: 60,000 training samples).
MNIST_TRAIN_SIZE = 60_000
#: Expected lot size of the IMDb runs (Poisson rate 256 / 25,000).
IMDB_LOT = 256
#: Target delta of every epsilon reported.
DELTA = 1e-5
#: Noise multiplier of the IMDb runs. *Assumption*: we could not read the paper's value; 1.0
#: makes vanilla DP-SGD reach epsilon = 2.62 (tight PLD, certified upper end) after
#: :data:`IMDB_EPOCHS` epochs at q = 256 / 25,000 and delta = 1e-5.
NOISE_MULTIPLIER = 1.0
#: Clipping norm C. *Assumption* (the usual TF Privacy tutorial value).
MAX_GRAD_NORM = 1.0
#: Epochs of the IMDb runs and the last epoch of Figure 3. *Assumption*.
IMDB_EPOCHS = 20
#: JL dimensions of Figure 3 (epsilon vs epochs).
FIGURE3_JL_DIMENSIONS = (1, 3, 5, 10, 20, 30)
#: JL dimensions of Table 2 (seconds per epoch).
TABLE2_JL_DIMENSIONS = (1, 5, 10, 30)
#: Hardware of every timing in the paper (§5: one Tesla P100 16GB GPU).
PAPER_HARDWARE = "one Tesla P100 16 GB GPU (TensorFlow)"

#: Seconds per IMDb epoch in the paper's Table 2 (P100). Not checked against the paper's text
#: here (*assumption* until verified); ``tf_privacy_vanilla`` is TF Privacy's DP-Adam.
PAPER_SECONDS_PER_EPOCH: dict[str, float] = {
    "nonprivate": 12.0,
    "tf_privacy_vanilla": 19_317.0,
    "jl_1": 41.0,
    "jl_5": 128.0,
    "jl_10": 243.0,
    "jl_30": 675.0,
}


def lots_per_epoch(dataset_size: int = IMDB_TRAIN_SIZE, lot: int = IMDB_LOT) -> float:
    """Expected lots in one pass over the data, ``n / L`` (97.66 for IMDb): 1 / q."""
    return dataset_size / lot


def steps_for_epochs(
    epochs: float, dataset_size: int = IMDB_TRAIN_SIZE, lot: int = IMDB_LOT
) -> int:
    """Noisy steps in ``epochs`` epochs, ``round(epochs n / L)`` (1,953 for 20 IMDb epochs)."""
    return round(epochs * lots_per_epoch(dataset_size, lot))


def replace_between(path: Path, name: str, body: str) -> bool:
    """Replace the text between ``<!-- name:start -->`` and ``<!-- name:end -->`` in ``path``."""
    return write_between_markers(path, f"<!-- {name}:start -->", f"<!-- {name}:end -->", body)


def device_stem(stem: str, device: str) -> str:
    """Results stem of a run on ``device``: CPU and GPU runs are kept side by side.

    Example:
        >>> device_stem("bu2021_jl_speed", "cpu"), device_stem("bu2021_jl_speed", "cuda")
        ('bu2021_jl_speed', 'bu2021_jl_speed_cuda')
    """
    return stem if device == "cpu" else f"{stem}_{device}"


def device_marker(marker: str, device: str) -> str:
    """README marker of the table of a run on ``device`` (``speed-table``, ``speed-table-cuda``)."""
    return marker if device == "cpu" else f"{marker}-{device}"


def saved_devices(stem: str, output: Output) -> list[str]:
    """The devices (of ``cpu``, ``cuda``) whose results of ``stem`` ``output`` holds."""
    return [d for d in ("cpu", "cuda") if output.has_results(device_stem(stem, d))]
