"""Tests of the privacy side of the Bu, Dong, Long, Su (2020) reproduction.

Golden numbers: Bu et al., "Deep Learning with Gaussian Differential Privacy", Harvard Data
Science Review 2020 (arXiv 1911.11607): MNIST, sigma 1.3, lot 256 of 60,000, 15 epochs gives
mu = 0.23 and eps_CLT = 0.83 at delta = 1e-5 (Sec. 5.1 / Table 1), moments accountant 1.19
(Table 1 / Fig. 5); MovieLens-1M, lot 10,000 of 800,167, 20 epochs: mu 1.94, eps_CLT 10.61,
eps_MA 15.39 at delta = 1e-6 (Table 4).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pytest

from dpcore.accountants.gdp_clt import clt_mu_squared
from dpcore.errors import InvalidParameterError
from dpcore.events import dpsgd_event
from reproductions.bu2019_gdp import privacy
from reproductions.bu2019_gdp.settings import SETTINGS, by_name, longest
from reproductions.harness import Output


def test_mnist_golden_mu_and_clt_epsilon() -> None:
    """Sec. 5.1 / Table 1: sigma 1.3, 15 epochs -> mu 0.23, eps_CLT 0.83, eps_MA 1.19."""
    setting = by_name("mnist_sigma1.3_e15")
    result = privacy.account(
        setting.sampling_probability, setting.noise_multiplier, setting.steps, 1e-5, 0.005
    )
    assert round(result["mu_clt"], 2) == 0.23
    assert round(result["eps_clt"], 2) == 0.83
    assert round(result["eps_moments_paper"], 2) == 1.19
    # The certified interval is ordered and excludes the CLT value (0.835 < 0.86).
    assert result["pld_lower"] <= result["pld_upper"]
    assert result["clt_understates"] is True


def test_movielens_golden_table4() -> None:
    """Table 4 (delta = 1e-6): mu 1.94, eps_CLT 10.61, eps_MA 15.39 (paper's orders, +-0.5 %)."""
    setting = by_name("movielens_sigma0.6_e20")
    event = dpsgd_event(
        sampling_probability=setting.sampling_probability,
        noise_multiplier=setting.noise_multiplier,
        steps=setting.steps,
    )
    mu = math.sqrt(
        clt_mu_squared(
            sampling_probability=setting.sampling_probability,
            noise_multiplier=setting.noise_multiplier,
            steps=setting.steps,
        )
    )
    assert round(mu, 2) == 1.94
    assert privacy.paper_moments_epsilon(event, 1e-6) == pytest.approx(15.39, rel=5e-3)


def test_every_printed_mu_is_reproduced() -> None:
    """Each paper mu (Table 1, Fig. 4, Table 4) follows from the setting to +-0.005."""
    checked = 0
    for setting in SETTINGS:
        if setting.paper_mu_clt is None:
            continue
        mu = math.sqrt(
            clt_mu_squared(
                sampling_probability=setting.sampling_probability,
                noise_multiplier=setting.noise_multiplier,
                steps=setting.steps,
            )
        )
        assert abs(mu - setting.paper_mu_clt) <= 0.0051, setting.name
        checked += 1
    assert checked >= 8


def test_flag_logic() -> None:
    assert privacy.clt_understates(0.83, 0.86)
    assert not privacy.clt_understates(0.86, 0.86)
    assert not privacy.clt_understates(31.1, 28.0)
    assert not privacy.clt_understates(1.0, None)  # no finite lower bound: nothing certified


def test_settings_are_valid() -> None:
    names = [setting.name for setting in SETTINGS]
    assert len(names) == len(set(names))
    assert {setting.dataset for setting in SETTINGS} == set(privacy.DATASETS)
    for setting in SETTINGS:
        assert 0 < setting.sampling_probability <= 1
        assert 0 < setting.local_sampling_probability <= 1
        assert setting.noise_multiplier > 0
        assert setting.steps >= setting.epochs
        assert setting.sources, setting.name
    assert by_name("movielens_sigma0.6_e20").local_n == 80_000
    assert longest("mnist").name == "mnist_sigma0.5_e100"


@pytest.mark.parametrize(
    ("change", "parameter"),
    [
        ({"noise_multiplier": -1.0}, "noise_multiplier"),
        ({"noise_multiplier": 0.0}, "noise_multiplier"),
        ({"lot_size": 70_000}, "lot_size"),
        ({"epochs": 0}, "epochs"),
        ({"optimizer": "rmsprop"}, "optimizer"),
        ({"delta": 1.0}, "delta"),
        ({"our_n": 100}, "our_lot_size"),
        ({"assumed": ("not_a_field",)}, "assumed"),
    ],
)
def test_bad_setting_raises(change: dict[str, Any], parameter: str) -> None:
    with pytest.raises(InvalidParameterError) as error:
        dataclasses.replace(SETTINGS[0], **change)
    assert error.value.parameter == parameter


def test_unknown_name_raises() -> None:
    with pytest.raises(InvalidParameterError):
        by_name("cifar10")
    with pytest.raises(InvalidParameterError):
        longest("cifar10")
    with pytest.raises(InvalidParameterError):
        privacy.account(0.0, 1.0, 10, 1e-5, 0.005)


def _row(name: str, understates: bool, ours: bool) -> dict[str, object]:
    row: dict[str, object] = {
        "name": name,
        "q": 256 / 60_000,
        "steps": 3516,
        "delta": 1e-5,
        "paper_mu_clt": 0.23,
        "paper_eps_clt": 0.83,
        "paper_eps_moments": None,
        "mu_clt": 0.2273,
        "eps_clt": 0.8345,
        "eps_moments_paper": 1.1923,
        "eps_moments": 1.1923,
        "eps_rdp": None,
        "pld_lower": 0.8631,
        "pld_upper": 0.8652,
        "clt_understates": understates,
        "assumed": "epochs" if ours else "",
        "our_n": 80_000,
        "our_lot_size": 1_000,
    }
    for key in privacy._ACCOUNT_KEYS:
        row[f"ours_{key}"] = (row[key] if key != "clt_understates" else True) if ours else None
    return row


def _data() -> dict[str, object]:
    return {
        "config": {"profile": "quick"},
        "commit": "0123456789abcdef",
        "wall_time_s": 12.3,
        "rows": [_row("a_setting", True, False), _row("b_setting", False, True)],
        "curves": [
            {
                "setting": "a_setting",
                "dataset": "mnist",
                "mu_clt": 0.5,
                "alpha": [0.0, 1e-3, 0.5, 1.0],
                "clt": [1.0, 0.99, 0.3, 0.0],
                "tight": [1.0, 0.995, 0.35, 0.0],
                "rdp_implied": [1.0, 0.98, 0.2, 0.0],
            }
        ],
    }


def test_table_from_saved_results() -> None:
    table = privacy.readme_table(_data())
    lines = table.splitlines()
    main = [line for line in lines if line.startswith("| a_setting") or line.startswith("| b_")]
    assert len(main) == 3  # two rows in the paper-n table, one in the our-data table
    header = next(line for line in lines if line.startswith("| setting | q |"))
    assert main[0].count("|") == header.count("|")
    assert "0.23 (0.23)" in main[0] and "0.83 (0.83)" in main[0]
    assert "1.19 (-)" in main[0]  # no printed MA value
    assert "| inf |" in main[0]  # None epsilon shown as infinite
    assert "[0.86, 0.87]" in main[0]
    assert "**yes**" in main[0] and main[1].endswith("| no | epochs |")
    assert main[2].startswith("| b_setting | 80000 | 1000 |") and "**yes**" in main[2]
    assert "commit `0123456789ab`" in table


def test_plot_and_readme_from_saved_results(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    start, end = privacy.TABLE_START, privacy.TABLE_END
    readme.write_text(f"head\n{start}\nold\n{end}\ntail\n<!-- training-table:start -->\n")
    output = Output.under(tmp_path)
    output.path(f"{privacy.STEM}.json").write_text(json.dumps(_data()))
    privacy.plot(output=output, readme=readme)
    assert output.path("bu2019_privacy_tradeoff.png").stat().st_size > 1000
    text = readme.read_text()
    assert "old" not in text and "| a_setting |" in text
    assert text.startswith("head\n") and text.endswith("tail\n<!-- training-table:start -->\n")


def test_settings_and_curves_fanned_out_give_the_in_process_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each setting's row and each dataset's curves at once on a thread pool give the results
    computed one after another; run again on the same store, nothing is accounted again."""
    from concurrent.futures import ThreadPoolExecutor

    catalogue = tuple(by_name(name) for name in ("imdb_sigma0.56_e8", "adult_sigma0.55_e17"))
    config = privacy.PrivacyConfig(alphas=20)
    here, threads = Output.under(tmp_path / "here"), Output.under(tmp_path / "threads")
    privacy.compute(config=config, catalogue=catalogue, output=here)
    assert not here.runs.exists()
    with ThreadPoolExecutor(2) as pool:
        privacy.compute(config=config, catalogue=catalogue, output=threads, executor=pool)
    ours, theirs = (out.load_results(privacy.STEM) for out in (here, threads))
    assert ours["rows"] == theirs["rows"] and [row["name"] for row in ours["rows"]] == [
        s.name for s in catalogue
    ]
    assert ours["curves"] == theirs["curves"] and len(ours["curves"]) == 2
    assert theirs["runs_spread"] == "fanned out on ThreadPoolExecutor"
    assert len(list(threads.store(privacy.STEM).iterdir())) == 4  # 2 rows, 2 datasets' curves

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a stored run was accounted again")

    monkeypatch.setattr(privacy, "setting_row", refuse)
    monkeypatch.setattr(privacy, "_curves", refuse)
    with ThreadPoolExecutor(2) as pool:
        privacy.compute(config=config, catalogue=catalogue, output=threads, executor=pool)
    again = threads.load_results(privacy.STEM)
    assert again["rows"] == theirs["rows"] and again["curves"] == theirs["curves"]
