"""The adapters of dpcore and Opacus run through the audits (TF Privacy needs its own environment,
made by ``nox -s audit``; its rows are in ``audits/results/implementations.json``)."""

from __future__ import annotations

import pytest

from audits.implementations import table
from audits.implementations.distributed_worker import NOISE_AVERAGED
from audits.implementations.dpcore_distributed import DpcoreDistributed
from audits.implementations.dpcore_torch import DpcoreTorch
from audits.implementations.opacus_adapter import Opacus
from audits.implementations.plain_torch import PLANTED_BUGS, PlainTorchDpSgd
from dpcore.auditing import AuditSettings, audit_implementation

PER_STEP = AuditSettings(steps=30, runs=2)
ONE_RUN = AuditSettings(target_epsilon=2.0, steps=60, sampler_steps=300)
SAMPLER_FLAG = "sampling does not match the claimed analysis"


def _rows(implementation: object) -> dict[str, dict[str, object]]:
    rows = audit_implementation(implementation, per_step=PER_STEP, one_run=ONE_RUN)  # type: ignore[arg-type]
    return {str(row["audit"]): row for row in rows}


@pytest.mark.parametrize(
    ("implementation", "shuffled"),
    [
        (DpcoreTorch(), False),
        (DpcoreTorch("shuffle"), True),
        (Opacus(True), False),
        (Opacus(False), True),
    ],
    ids=["dpcore-poisson", "dpcore-shuffle", "opacus-poisson", "opacus-shuffle"],
)
def test_adapter_runs_every_audit(implementation: object, shuffled: bool) -> None:
    rows = _rows(implementation)
    assert rows["sampler"]["verdict"] == (SAMPLER_FLAG if shuffled else "consistent")
    for audit in ("whitebox_per_step", "noise_calibration", "one_run"):
        assert rows[audit]["verdict"] == "consistent", rows[audit]
    claimed = rows["one_run"]["claimed_epsilon"]
    certified = rows["one_run"]["certified_epsilon"]
    assert isinstance(claimed, float) and isinstance(certified, float)
    assert claimed == pytest.approx(certified, rel=0.05)  # their accountant, our certified


def test_committed_table_has_every_implementation_and_audit() -> None:
    libraries = table.load("implementations")
    assert all(row["implementation"].startswith(table.LIBRARIES) for row in libraries)
    rows = libraries + table.load("implementations_planted")
    keys = {
        "implementation",
        "audit",
        "claimed_epsilon",
        "certified_epsilon",
        "epsilon_lower",
        "confidence",
        "verdict",
        "seeds",
    }
    assert all(keys <= set(row) for row in rows)
    assert {row["implementation"] for row in rows} == {i.name for i, _ in table.implementations()}
    names = {row["implementation"] for row in libraries}
    assert sum(n.startswith("opacus") for n in names) == 2
    assert any(n.startswith("tf_privacy") for n in names)
    assert any(n.startswith("dpcore torch distributed") for n in names)
    correct = {i.name for i, _ in table.implementations() if not table.is_planted(i)}
    correct.add(PlainTorchDpSgd().name)
    for row in rows:
        if row["implementation"] in correct and row["audit"] != "sampler":
            assert row["verdict"] == "consistent" or row["verdict"].startswith("not applicable")


def test_readme_tables_are_rendered_from_the_committed_results() -> None:
    readme = table.README.read_text()
    assert table.markdown(table.load("implementations")) in readme
    assert table.markdown(table.load("implementations_planted")) in readme


def test_committed_table_flags_every_planted_bug() -> None:
    rows = table.load("implementations_planted")
    planted = [PlainTorchDpSgd(bug).name for bug in PLANTED_BUGS]
    planted.append(DpcoreDistributed(bug=NOISE_AVERAGED).name)
    for name in planted:
        verdicts = {row["audit"]: row["verdict"] for row in rows if row["implementation"] == name}
        assert len(verdicts) == 4 and any(v != "consistent" for v in verdicts.values()), name
