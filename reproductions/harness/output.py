"""Where a reproduction writes: an :class:`Output` passed in, never a module global.

``Output()`` is the repository's ``figures/`` (results, CSV, figures) and
``reproductions/checkpoints/`` (the run store, git-ignored); tests pass ``Output(tmp_path)``.
Results files carry their config and provenance (git commit, versions) beside the rows.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dpcore.errors import InvalidParameterError
from dpcore.provenance import git_commit
from dpcore.runs.results import read_results, write_results
from reproductions.common import code_fingerprint

__all__ = ["ROOT", "Output", "run_commit"]

ROOT = Path(__file__).resolve().parents[2]


@functools.cache
def run_commit() -> str:
    """The checkout's commit (``-dirty`` if tracked files differed) when this process first saved
    results: later saves of the same run rewrite tracked files under figures/, which must not
    make their own records read as ``-dirty``."""
    return git_commit(ROOT)


@dataclasses.dataclass(frozen=True)
class Output:
    """The folders of one reproduction run: ``figures`` and the run store ``runs``.

    Example:
        >>> import tempfile
        >>> out = Output.under(Path(tempfile.mkdtemp()))
        >>> path = out.save_results("demo", config={"n": 1}, rows=[{"x": 1}])
        >>> out.load_results("demo")["rows"], path.name
        ([{'x': 1}], 'demo.json')
    """

    figures: Path = ROOT / "figures"
    runs: Path = ROOT / "reproductions" / "checkpoints"
    #: Read and continue the stored runs of this code fingerprint instead of the current code's
    #: (``--runs-code``): runs trained by an earlier commit whose training code the caller has
    #: checked to give the same results. The results then record both fingerprints.
    runs_code: str | None = None

    @classmethod
    def under(cls, folder: Path) -> Output:
        """``folder/figures`` and ``folder/runs`` (for tests and scratch runs)."""
        return cls(figures=folder / "figures", runs=folder / "runs")

    def code(self, *modules: str) -> str:
        """The fingerprint runs are stored under: :attr:`runs_code`, else that of ``modules``.

        Raises:
            InvalidParameterError: :attr:`runs_code` is not 16 hex digits.
        """
        if self.runs_code is None:
            return code_fingerprint(*modules)
        if len(self.runs_code) != 16 or any(c not in "0123456789abcdef" for c in self.runs_code):
            raise InvalidParameterError("runs_code", "16 lower-case hex digits", self.runs_code)
        return self.runs_code

    def provenance_of_runs(self, *modules: str) -> dict[str, str]:
        """What a results file records of the code: the runs' fingerprint and, when the runs
        were trained by other code (:attr:`runs_code`), the fingerprint of the code reporting."""
        current = code_fingerprint(*modules)
        if self.runs_code is None or self.runs_code == current:
            return {"code_fingerprint": current}
        return {"code_fingerprint": self.code(*modules), "reporting_code_fingerprint": current}

    def path(self, name: str) -> Path:
        """``figures/<name>`` (the folder is created)."""
        self.figures.mkdir(parents=True, exist_ok=True)
        return self.figures / name

    def store(self, stem: str) -> Path:
        """The run-store folder of one reproduction: ``runs/<stem>``."""
        return self.runs / stem

    def save_results(
        self,
        stem: str,
        *,
        config: Any,
        rows: Sequence[dict[str, Any]],
        extra: dict[str, Any] | None = None,
    ) -> Path:
        """Write ``<stem>.json`` (config, provenance, extra, rows) and ``<stem>.csv``
        (:func:`dpcore.runs.results.write_results`; the commit is :func:`run_commit`'s)."""
        return write_results(
            self.figures,
            stem,
            config=config,
            rows=rows,
            root=ROOT,
            extra={"commit": run_commit(), **(extra or {})},
        )

    def load_results(self, stem: str) -> dict[str, Any]:
        """Read what :meth:`save_results` wrote."""
        return read_results(self.figures, stem)

    def has_results(self, stem: str) -> bool:
        """Whether ``<stem>.json`` exists."""
        return (self.figures / f"{stem}.json").is_file()
