"""Experiment settings of Bu, Dong, Long, Su, "Deep Learning with Gaussian Differential Privacy".

arXiv 1911.11607; Harvard Data Science Review 2(3), 2020 (PMC7695347). One :class:`Setting` per
run the paper reports, with every number's source in :attr:`Setting.sources`. Sources:

- **Fig. 4** (caption, PMC7695347 figure F4): MNIST, p = 256/60000, eta = 0.15, R = 1.5; sigma =
  1.3 (moments accountant) and sigma~ = 1.06 (CLT) both give (1.34, 1e-5)-DP at epoch 20
  (mu_CLT = 0.35); sigma = 0.7 and sigma~ = 0.638 both give (8.68, 1e-5)-DP at epoch 70
  (mu_CLT = 1.78).
- **Table 1 / Fig. 5** (MNIST accuracy-privacy rows and their trade-off panels): accuracy, mu and
  the moments-accountant epsilon per noise level, as printed in the panel titles and legends
  (also in the authors' companion script ``mnist_plot.py`` of
  github.com/woodyx218/Deep-Learning-with-GDP-Tensorflow): sigma 1.3 / 15 epochs: 95.0 %,
  mu 0.23, eps_MA 1.19; sigma 1.1 / 60: 96.6 %, 0.57, 3.01; sigma 0.7 / 45: 97.0 %, 1.13, 7.10;
  sigma 0.6: 97.6 %, 2.00, 13.27; sigma 0.55: 97.8 %, 2.76, 18.72; sigma 0.5: 98.0 %, 4.78,
  32.40. The epochs of the last three are *derived* (back-solved from mu, see ``assumed``).
  eps_CLT = 0.83 at sigma 1.3 / 15 epochs is Sec. 5.1's headline number (the authors' README
  prints 0.8345).
- **Table 4** (PMC7695347 table T4): MovieLens-1M, NoisyAdam, 20 epochs, RMSE 0.915, mu_CLT
  1.94, eps_CLT 10.61, eps_MA 15.39 at delta = 1e-6; non-private RMSE 0.893.
- **Sec. 5** dataset sizes and architectures: MNIST 60,000; IMDb 25,000 (10,000 words, length
  256); Adult 29,305 training rows (LIBSVM a9a features, 123 columns); MovieLens-1M 800,167
  training ratings (80 % of 1,000,209).

Not verified from the paper text: Tables 2 and 3 (IMDb and Adult). Their lot sizes, noise,
learning rates and clipping norms come from the authors' companion scripts (``imdb_tutorial.py``,
``adult_tutorial.py``, also shipped in TensorFlow Privacy's ``tutorials/``), and the epochs from
those scripts' rule "stop once mu > 2" (we take the last epoch with mu <= 2). They are flagged
in :attr:`Setting.assumed`, carry no paper accuracy and must not be presented as the paper's.
The MovieLens noise multiplier 0.6 is back-solved from Table 4's mu = 1.94 (the companion
script's default, 0.55, gives mu = 2.56 at 20 epochs, so it is not what Table 4 used).

Substitute sizes (``our_n``, ``our_lot_size``): the data we train on. MovieLens-100K replaces
ML-1M (80,000 training ratings after an 80/20 split; lot 1,000 keeps q = 0.0125 and 80 steps per
epoch); Adult uses the UCI split's 32,561 training rows (lot 256, so q differs a little).
"""

from __future__ import annotations

import dataclasses
import math

from dpcore.errors import InvalidParameterError

__all__ = ["SETTINGS", "Setting", "by_name", "longest"]

_PAPER = "Bu et al. 2020"
_FIG4 = f"{_PAPER}, Fig. 4 caption"
_TAB1 = f"{_PAPER}, Table 1 / Fig. 5 (MNIST rows)"
_TAB4 = f"{_PAPER}, Table 4 (MovieLens-1M)"
_SEC5 = f"{_PAPER}, Sec. 5"
_CODE = "authors' companion script (not verified in the paper text)"

MNIST_MODEL = (
    "CNN: conv 16@8x8 stride 2 -> maxpool 2 -> conv 32@4x4 stride 2 -> maxpool 2 -> "
    "dense 32 -> 10 (TF Privacy's MNIST CNN)"
)
IMDB_MODEL = "embedding 10,000x16 -> global average pooling -> dense 16 ReLU -> 2"
ADULT_MODEL = "123 features -> dense 16 ReLU -> 2"
MOVIELENS_MODEL = (
    "neural collaborative filtering: GMF (5-dim embeddings, product) + MLP (10-dim embeddings, "
    "concatenated) -> dense 5-way softmax; prediction = expected rating"
)


@dataclasses.dataclass(frozen=True)
class Setting:
    """One reported DP training run of the paper (Poisson lots, T = ceil(epochs * n / lot)).

    ``paper_*`` are the numbers the paper prints (None where it prints none for this run);
    ``metric`` is "accuracy" or "rmse". ``assumed`` names the fields that are not printed in
    the paper (derived or taken from the authors' code); ``sources`` maps each field group to
    its citation.
    """

    name: str
    dataset: str
    n: int
    lot_size: int
    noise_multiplier: float
    epochs: int
    learning_rate: float
    max_grad_norm: float
    optimizer: str
    model: str
    delta: float
    metric: str = "accuracy"
    paper_metric: float | None = None
    paper_mu_clt: float | None = None
    paper_eps_clt: float | None = None
    paper_eps_moments: float | None = None
    our_n: int | None = None
    our_lot_size: int | None = None
    assumed: tuple[str, ...] = ()
    sources: tuple[tuple[str, str], ...] = ()
    note: str = ""

    def __post_init__(self) -> None:
        if self.n < 1:
            raise InvalidParameterError("n", ">= 1", self.n)
        if not 1 <= self.lot_size <= self.n:
            raise InvalidParameterError("lot_size", f"in [1, n = {self.n}]", self.lot_size)
        if not (self.noise_multiplier > 0 and math.isfinite(self.noise_multiplier)):
            raise InvalidParameterError("noise_multiplier", "> 0 and finite", self.noise_multiplier)
        if self.epochs < 1:
            raise InvalidParameterError("epochs", ">= 1", self.epochs)
        if not 0 < self.delta < 1:
            raise InvalidParameterError("delta", "in (0, 1)", self.delta)
        if self.optimizer not in ("sgd", "adam"):
            raise InvalidParameterError("optimizer", "'sgd' or 'adam'", self.optimizer)
        if self.metric not in ("accuracy", "rmse"):
            raise InvalidParameterError("metric", "'accuracy' or 'rmse'", self.metric)
        if self.our_n is not None and not 1 <= self.local_lot_size <= self.our_n:
            raise InvalidParameterError(
                "our_lot_size", f"in [1, our_n = {self.our_n}]", self.our_lot_size
            )
        fields = {field.name for field in dataclasses.fields(self)}
        unknown = [name for name in self.assumed if name not in fields]
        if unknown:
            raise InvalidParameterError("assumed", "to name fields of Setting", unknown)

    @property
    def sampling_probability(self) -> float:
        """q = lot / n, the Poisson rate (Sec. 5: p = 256/60000 for MNIST)."""
        return self.lot_size / self.n

    @property
    def steps(self) -> int:
        """T = ceil(epochs * n / lot); the paper's accountants use epochs * n / lot (unrounded)."""
        return math.ceil(self.epochs * self.n / self.lot_size - 1e-9)

    @property
    def local_lot_size(self) -> int:
        """Lot size on our substitute data (the paper's unless ``our_lot_size`` is set)."""
        return self.our_lot_size if self.our_lot_size is not None else self.lot_size

    @property
    def local_n(self) -> int:
        """Training-set size of our data (the paper's unless ``our_n`` is set)."""
        return self.our_n if self.our_n is not None else self.n

    @property
    def local_sampling_probability(self) -> float:
        """q on our data."""
        return self.local_lot_size / self.local_n

    @property
    def local_steps(self) -> int:
        """T on our data for the same number of epochs."""
        return math.ceil(self.epochs * self.local_n / self.local_lot_size - 1e-9)


def _mnist(
    sigma: float,
    epochs: int,
    *,
    accuracy: float | None = None,
    mu: float | None = None,
    eps_clt: float | None = None,
    eps_ma: float | None = None,
    source: str,
    assumed: tuple[str, ...] = (),
    note: str = "",
) -> Setting:
    return Setting(
        name=f"mnist_sigma{sigma:g}_e{epochs}",
        dataset="mnist",
        n=60_000,
        lot_size=256,
        noise_multiplier=sigma,
        epochs=epochs,
        learning_rate=0.15,
        max_grad_norm=1.5,
        optimizer="sgd",
        model=MNIST_MODEL,
        delta=1e-5,
        paper_metric=accuracy,
        paper_mu_clt=mu,
        paper_eps_clt=eps_clt,
        paper_eps_moments=eps_ma,
        assumed=assumed,
        sources=(
            ("n, lot_size, learning_rate, max_grad_norm, delta", _FIG4),
            ("noise_multiplier, epochs, paper values", source),
            ("model", f"{_SEC5}.1 (TF Privacy MNIST CNN)"),
        ),
        note=note,
    )


_DERIVED_EPOCHS = "epochs back-solved from the printed mu (mu = q sqrt(T (e^{1/sigma^2} - 1)))"

SETTINGS: tuple[Setting, ...] = (
    _mnist(1.3, 15, accuracy=0.950, mu=0.23, eps_clt=0.83, eps_ma=1.19, source=_TAB1),
    _mnist(1.1, 60, accuracy=0.966, mu=0.57, eps_ma=3.01, source=_TAB1),
    _mnist(0.7, 45, accuracy=0.970, mu=1.13, eps_ma=7.10, source=_TAB1),
    _mnist(
        0.6,
        62,
        accuracy=0.976,
        mu=2.00,
        eps_ma=13.27,
        source=_TAB1,
        assumed=("epochs",),
        note=_DERIVED_EPOCHS,
    ),
    _mnist(
        0.55,
        68,
        accuracy=0.978,
        mu=2.76,
        eps_ma=18.72,
        source=_TAB1,
        assumed=("epochs",),
        note=_DERIVED_EPOCHS,
    ),
    _mnist(
        0.5,
        100,
        accuracy=0.980,
        mu=4.78,
        eps_ma=32.40,
        source=_TAB1,
        assumed=("epochs",),
        note=_DERIVED_EPOCHS,
    ),
    _mnist(1.3, 20, eps_ma=1.34, source=_FIG4, note="Fig. 4 top, moments-accountant run"),
    _mnist(1.06, 20, mu=0.35, eps_clt=1.34, source=_FIG4, note="Fig. 4 top, CLT-matched run"),
    _mnist(0.7, 70, eps_ma=8.68, source=_FIG4, note="Fig. 4 bottom, moments-accountant run"),
    _mnist(0.638, 70, mu=1.78, eps_clt=8.68, source=_FIG4, note="Fig. 4 bottom, CLT-matched run"),
    Setting(
        name="imdb_sigma0.56_e8",
        dataset="imdb",
        n=25_000,
        lot_size=512,
        noise_multiplier=0.56,
        epochs=8,
        learning_rate=0.02,
        max_grad_norm=1.0,
        optimizer="adam",
        model=IMDB_MODEL,
        delta=1e-5,
        assumed=("lot_size", "noise_multiplier", "epochs", "learning_rate", "max_grad_norm"),
        sources=(
            ("n, model, delta", f"{_SEC5}.2"),
            (
                "lot_size, noise_multiplier, learning_rate, max_grad_norm",
                f"{_CODE} imdb_tutorial.py",
            ),
            ("epochs", f"{_CODE}: last epoch with mu <= 2"),
        ),
        note="Table 2 not verified: no paper accuracy or epsilon is given for this row",
    ),
    Setting(
        name="adult_sigma0.55_e17",
        dataset="adult",
        n=29_305,
        lot_size=256,
        noise_multiplier=0.55,
        epochs=17,
        learning_rate=0.15,
        max_grad_norm=1.0,
        optimizer="sgd",
        model=ADULT_MODEL,
        delta=1e-5,
        our_n=32_561,
        assumed=("lot_size", "noise_multiplier", "epochs", "learning_rate", "max_grad_norm"),
        sources=(
            ("n, model, delta", f"{_SEC5}.3"),
            (
                "lot_size, noise_multiplier, learning_rate, max_grad_norm",
                f"{_CODE} adult_tutorial.py",
            ),
            ("epochs", f"{_CODE}: last epoch with mu <= 2"),
            ("our_n", "UCI Adult training split (dpcore.data.load_adult)"),
        ),
        note="Table 3 not verified: no paper accuracy or epsilon is given for this row",
    ),
    Setting(
        name="movielens_sigma0.6_e20",
        dataset="movielens",
        n=800_167,
        lot_size=10_000,
        noise_multiplier=0.6,
        epochs=20,
        learning_rate=0.01,
        max_grad_norm=5.0,
        optimizer="adam",
        model=MOVIELENS_MODEL,
        delta=1e-6,
        metric="rmse",
        paper_metric=0.915,
        paper_mu_clt=1.94,
        paper_eps_clt=10.61,
        paper_eps_moments=15.39,
        our_n=80_000,
        our_lot_size=1_000,
        assumed=("noise_multiplier", "learning_rate", "max_grad_norm"),
        sources=(
            ("n, lot_size, model", f"{_SEC5}.4"),
            ("epochs, delta, paper values", _TAB4),
            ("noise_multiplier", f"back-solved from {_TAB4}'s mu = 1.94"),
            ("learning_rate, max_grad_norm", f"{_CODE} movielens_tutorial.py"),
            ("our_n, our_lot_size", "MovieLens-100K substitute, 80/20 split, q kept at 0.0125"),
        ),
        note="ML-1M is not available here; we train on MovieLens-100K (non-private RMSE 0.893)",
    ),
)


def by_name(name: str) -> Setting:
    """The setting called ``name``; raises InvalidParameterError for an unknown name."""
    for setting in SETTINGS:
        if setting.name == name:
            return setting
    raise InvalidParameterError("name", f"one of {[s.name for s in SETTINGS]}", name)


def longest(dataset: str) -> Setting:
    """The setting of ``dataset`` with the most steps (the one drawn in the trade-off figure)."""
    candidates = [s for s in SETTINGS if s.dataset == dataset]
    if not candidates:
        raise InvalidParameterError("dataset", "mnist, imdb, adult or movielens", dataset)
    return max(candidates, key=lambda s: s.steps)
