"""Developer and user entry points: ``nox -s tests``, ``nox -s reproduce`` and friends."""

from __future__ import annotations

import os
import shutil

import nox

nox.options.sessions = ["tests"]
nox.options.reuse_existing_virtualenvs = True
nox.needs_version = ">=2024.3.2"

PYPROJECT = nox.project.load_toml("pyproject.toml")


def _torch_constraints() -> list[str]:
    """``-c constraints/torch-cpu.txt`` unless a GPU build is wanted.

    ``DPCORE_TORCH=cpu|cuda|auto`` (default ``auto``: CUDA when ``nvidia-smi`` is on PATH).
    Without the pin, pip resolves ``torch`` to a multi-GB CUDA build even on CPU-only machines.
    """
    choice = os.environ.get("DPCORE_TORCH", "auto")
    if choice not in ("auto", "cpu", "cuda"):
        raise ValueError(f"Expected DPCORE_TORCH in {{auto, cpu, cuda}}, got {choice!r}.")
    if choice == "cuda" or (choice == "auto" and shutil.which("nvidia-smi")):
        return []
    return ["-c", "constraints/torch-cpu.txt"]


def _install(session: nox.Session, *groups: str, extras: str = "") -> None:
    deps: list[str] = []
    for group in groups:
        deps += nox.project.dependency_groups(PYPROJECT, group)
    constraints = _torch_constraints() if "torch" in extras else []
    session.install(*constraints, "-e", f".{extras}", *deps)


#: Extras of the test sessions: both frameworks (the TensorFlow tests compare with torch).
TEST_EXTRAS = "[torch,tf,plot,progress]"


#: The distribution packages of the docs' browser check (tests/test_docs_browser.py).
BROWSER_PACKAGES = ("chromium", "chromium-driver")


def _browser_ready(session: nox.Session) -> bool:
    """Whether headless Chromium and chromedriver are here, installing them from the
    distribution's packages when they are not and this is a Debian-like system run as root."""

    def present() -> bool:
        has_browser = any(shutil.which(name) for name in ("chromium", "chromium-browser"))
        return has_browser and shutil.which("chromedriver") is not None

    if present():
        return True
    if shutil.which("apt-get") and hasattr(os, "geteuid") and os.geteuid() == 0:
        install = ("apt-get", "install", "-y", "--no-install-recommends", *BROWSER_PACKAGES)
        env = {"DEBIAN_FRONTEND": "noninteractive"}
        session.run(*install, external=True, success_codes=[0, 100], env=env)
        if not present():  # stale package lists: read them again once
            session.run("apt-get", "update", external=True, success_codes=[0, 100], env=env)
            session.run(*install, external=True, success_codes=[0, 100], env=env)
    return present()


@nox.session
def tests(session: nox.Session) -> None:
    """Run the default test suite (doctests included, slow tests excluded).

    The docs' browser check runs too where Chromium is installed or installable (see
    :func:`_browser_ready`); elsewhere it is left out with a warning (``nox -s docs_browser``).
    """
    # the docs group too: tests/test_docs.py builds the documentation site
    _install(session, "test", "docs", extras=TEST_EXTRAS)
    excluded = "not slow and not cuda and not engines"
    if not _browser_ready(session):
        session.warn(
            "Chromium or chromedriver is missing and could not be installed: the docs' browser "
            f"check is left out (apt-get install -y {' '.join(BROWSER_PACKAGES)}, then run "
            "nox -s docs_browser)."
        )
        excluded += " and not browser"
    session.run(
        "pytest",
        "dpcore",
        "tests",
        "reproductions",
        "bench",
        "-m",
        excluded,
        "--durations=30",
        *session.posargs,
    )


@nox.session
def slow(session: nox.Session) -> None:
    """Run only the tests marked slow (wide property searches, MNIST training)."""
    _install(session, "test", extras=TEST_EXTRAS)
    session.run("pytest", "tests", "-m", "slow", *session.posargs)


@nox.session
def engines(session: nox.Session) -> None:
    """Run dpcore.runs through Ray and submitit's local executor (optional; CI does not need it)."""
    # not the whole test group: its peers (Opacus) would pull in torch, which these tests never use
    session.install("-e", ".[dask,ray,slurm]", "pytest>=8", "hypothesis>=6.100")
    session.run("pytest", "tests/runs", "-m", "engines", *session.posargs)


@nox.session
def gpu(session: nox.Session) -> None:
    """Run only the tests that need a CUDA GPU (they fail, not skip, without one)."""
    _install(session, "test", extras=TEST_EXTRAS)
    session.run("pytest", "tests", "-m", "cuda", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """Check formatting and style with ruff and types with mypy on the package."""
    _install(session, "lint", extras="[torch]")
    session.run("ruff", "format", "--check", ".")
    session.run("ruff", "check", ".")
    session.run("mypy")


@nox.session
def docs(session: nox.Session) -> None:
    """Build the documentation site into site/ (``mkdocs build --strict``: any warning fails).

    The API pages are read from the sources (griffe); the tutorials run their code at build time
    (a failing block fails the build), which needs torch and, for the Keras tutorial, TensorFlow.
    """
    _install(session, "docs", extras="[torch,tf]")
    session.run("mkdocs", "build", "--strict", *session.posargs, env={"NO_MKDOCS_2_WARNING": "1"})


@nox.session
def docs_browser(session: nox.Session) -> None:
    """Open the built site in headless Chromium (tests/test_docs_browser.py); screenshots in site/.

    Needs Chromium and chromedriver on the machine (``apt-get install -y chromium
    chromium-driver``); Selenium is installed here.
    """
    _install(session, "docs", extras="[torch,tf]")
    # hypothesis: the repository's conftest.py imports it
    session.install("selenium>=4.20", "pytest>=8", "hypothesis>=6.100")
    session.run(
        "pytest",
        "tests/test_docs_browser.py",
        "-m",
        "browser",
        *session.posargs,
        env={"NO_MKDOCS_2_WARNING": "1", "DPCORE_DOCS_SCREENSHOTS": "site"},
    )


#: The models benchmark's own environment (``python -m bench models``): timm needs torchvision,
#: and no torchvision release imports beside this project's pinned torch CPU build
#: (constraints/torch-cpu.txt), so this venv takes torch 2.14.1 and torchvision 0.29.1 as one
#: pair, timm, the bench group (transformers, peft, Opacus) and dpcore, without that pin. It is
#: about 5.9 GB (pip's torch is the CUDA build, which runs on CPU too); made on first use and
#: brought up to date on each run, like the audit session's TF Privacy worker.
BENCH_MODELS = ".nox/bench-models"
BENCH_MODELS_TORCH = ("torch==2.14.1", "torchvision==0.29.1", "timm")
#: Options of ``python -m bench`` that take a value (the rest of the arguments are names).
BENCH_VALUED = ("--device", "--executor")


def _bench_arguments(arguments: list[str]) -> tuple[list[str], list[str]]:
    """``(names, options)`` of ``python -m bench``'s arguments (an option keeps its value)."""
    names: list[str] = []
    options: list[str] = []
    taking = False
    for argument in arguments:
        if taking or argument.startswith("-"):
            options.append(argument)
            taking = not taking and argument in BENCH_VALUED
        else:
            names.append(argument)
    return names, options


def _bench_models_python(session: nox.Session) -> str:
    """The python of :data:`BENCH_MODELS`, made on first use, its packages brought up to date."""
    python = os.path.join(BENCH_MODELS, "bin", "python")
    if not os.path.exists(python):
        session.run("python", "-m", "venv", BENCH_MODELS)
    deps = nox.project.dependency_groups(PYPROJECT, "bench")
    install = ("-m", "pip", "install", "-q", *BENCH_MODELS_TORCH, *deps, "-e", ".[progress]")
    session.run(python, *install, external=True)
    return os.path.abspath(python)


@nox.session
def bench(session: nox.Session) -> None:
    """Time dpcore against peers; writes JSON under bench/results/ (``-- accounting`` for one).

    ``models`` (named, or in the default list: every benchmark) runs in its own environment,
    :data:`BENCH_MODELS` (about 5.9 GB: pip's CUDA build of torch 2.14.1, run on CPU), since
    timm needs torchvision and no torchvision release imports beside this session's pinned
    torch CPU build; the other benchmarks run in this session's environment.
    """
    _install(session, "bench", extras="[torch,tf,progress]")
    names, options = _bench_arguments(list(session.posargs))
    if names and "models" not in names:
        session.run("python", "-m", "bench", *session.posargs)
        return
    if not names:  # the default list (bench/__main__.py's default_names), models among them
        listed = session.run(
            "python",
            "-c",
            "from bench.__main__ import default_names; print(' '.join(default_names()))",
            silent=True,
        )
        names = [name for name in str(listed or "").split() if name != "models"] + ["models"]
    others = [name for name in names if name != "models"]
    if others:
        session.run("python", "-m", "bench", *others, *options)
    session.run(_bench_models_python(session), "-m", "bench", "models", *options, external=True)


#: TF Privacy's own environment for the implementation audits (TF 2.15; never beside torch).
TF_PRIVACY_WORKER = ".nox/tf-privacy-worker"


@nox.session(python="3.11")
def audit(session: nox.Session) -> None:
    """Run the empirical privacy audits; results and reports in audits/results/.

    ``-- --only implementations`` audits dpcore, Opacus and TF Privacy through their adapters; it
    needs TF Privacy's own environment, made here beside the session's.
    """
    _install(session, "audit", extras="[torch,plot,progress]")
    if "--only" not in session.posargs or "implementations" in session.posargs:
        worker = os.path.join(TF_PRIVACY_WORKER, "bin", "python")
        if not os.path.exists(worker):
            session.run("python", "-m", "venv", TF_PRIVACY_WORKER)
        session.run(
            worker,
            "-m",
            "pip",
            "install",
            "-q",
            "-c",
            "constraints/tf-privacy.txt",
            "tensorflow",
            "tensorflow-privacy",
            "-e",
            ".",
            external=True,
        )
        session.env["DPCORE_TF_PRIVACY_PYTHON"] = os.path.abspath(worker)
    session.run("python", "-m", "audits", *session.posargs)


@nox.session
def reproduce(session: nox.Session) -> None:
    """Regenerate every figure in figures/ (data beside each) from scratch."""
    _install(session, extras="[torch,plot,progress]")
    session.run("python", "-m", "reproductions", *session.posargs)


@nox.session(python="3.11")
def tfprivacy(session: nox.Session) -> None:
    """Time TF Privacy's vanilla DP-Adam on the IMDb model (own venv: TF 2.15 + TF Privacy 0.9)."""
    # dpcore without its torch extra: the IMDb loaders and provenance need only numpy and scipy.
    session.install(
        "-c", "constraints/tf-privacy.txt", "tensorflow", "tensorflow-privacy", "-e", ".[progress]"
    )
    session.run("python", "-m", "reproductions.bu2021_jl.tf_privacy_baseline", *session.posargs)


@nox.session
def dpcoretf(session: nox.Session) -> None:
    """Time dpcore's TensorFlow DP-Adam, exact and JL, on the IMDb model (Table 2; the tf extra).

    Writes figures/bu2021_jl_dpcore_tf.json (``-- --profile full`` for the paper's r and lots).
    """
    session.install("-e", ".[tf,progress]")
    session.run("python", "-m", "reproductions.bu2021_jl.dpcore_tf_timing", *session.posargs)
