"""The built docs site in a real headless Chromium: titles, navigation, a figure, no errors.

The site is built into a temporary folder (tutorials executed, as in ``tests/test_docs.py``),
served over HTTP on a free local port, and opened with Selenium in headless Chromium: the home
page, one tutorial and the figures page. Each must have its title and the site navigation; the
figure must be decoded by the browser (non-zero natural size); and the browser's console must
hold no SEVERE entry (a failed request, a script error).

Marked ``browser``: ``nox -s tests`` runs it where Chromium and chromedriver are installed or
can be installed from the distribution's packages (the session tries ``apt-get`` as root), and
otherwise leaves it out with a warning; ``nox -s docs_browser`` runs it alone and saves
screenshots under ``site/``. Run by pytest without Chromium, chromedriver or Selenium, the test
fails, saying how to install them.
"""

from __future__ import annotations

import functools
import http.server
import importlib.util
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: Where screenshots go when set (``nox -s docs_browser`` sets ``site``); else the test's tmp dir.
SCREENSHOTS_ENV = "DPCORE_DOCS_SCREENSHOTS"
BROWSERS = ("chromium", "chromium-browser", "google-chrome")
INSTALL = (
    "install them with `apt-get install -y chromium chromium-driver` (Debian/Ubuntu) and "
    "`pip install selenium`, or run `nox -s docs_browser`, which installs Selenium"
)
#: (path under the site, words its title must contain, file name of its screenshot)
PAGES = (
    ("", "dpcore", "screenshot-index.png"),
    ("tutorials/accounting/", "Accounting side by side", "screenshot-tutorial.png"),
    ("results/figures/", "Figures", "screenshot-figures.png"),
)

pytestmark = pytest.mark.browser


def _browser_tools() -> tuple[str, str]:
    """The Chromium binary and chromedriver; fails the test naming what is missing."""
    browser = next((path for name in BROWSERS if (path := shutil.which(name))), None)
    driver = shutil.which("chromedriver")
    missing = [name for name, path in (("chromium", browser), ("chromedriver", driver)) if not path]
    if importlib.util.find_spec("selenium") is None:
        missing.append("selenium")
    if missing:
        pytest.fail(f"The browser check needs {', '.join(missing)}: {INSTALL}.")
    assert browser is not None and driver is not None
    return browser, driver


@pytest.fixture(scope="module")
def site(docs_site: Path) -> Path:
    return docs_site  # built once per test session (conftest.py), shared with test_docs.py


@pytest.fixture(scope="module")
def address(site: Path) -> Iterator[str]:
    """The site served over HTTP on 127.0.0.1 at a free port, for the module's tests."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # the base class names it format
            pass

    handler = functools.partial(Quiet, directory=str(site))
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{server.server_address[1]}/"
        finally:
            server.shutdown()
            thread.join(timeout=10)


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    browser, driver_path = _browser_tools()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(argument)
    options.add_argument("--window-size=1280,900")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(executable_path=driver_path))
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def _screenshots(tmp_path: Path) -> Path:
    folder = Path(os.environ.get(SCREENSHOTS_ENV) or tmp_path)
    folder = folder if folder.is_absolute() else ROOT / folder
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.mark.parametrize(("path", "title", "screenshot"), PAGES)
def test_page_renders_with_navigation_and_no_console_errors(
    chromium: Any, address: str, tmp_path: Path, path: str, title: str, screenshot: str
) -> None:
    from selenium.webdriver.common.by import By

    chromium.get_log("browser")  # drop entries of earlier pages
    chromium.get(address + path)
    assert title in chromium.title, chromium.title
    primary = chromium.find_element(By.CSS_SELECTOR, "nav.md-nav--primary")
    assert primary.is_displayed()  # the sidebar, at this window's width
    links = primary.find_elements(By.CSS_SELECTOR, "a.md-nav__link")
    labels = {link.get_attribute("textContent").strip() for link in links}
    assert {"Limits and sharp edges", "Accounting side by side", "Figures"} <= labels, labels
    if path.startswith("tutorials/"):
        outputs = chromium.find_elements(By.CSS_SELECTOR, "article .result")
        assert outputs and all(o.text.strip() for o in outputs if o.is_displayed())
    if path.startswith("results/figures"):
        images = chromium.find_elements(By.CSS_SELECTOR, "article img")
        assert images
        for image in images:
            decoded = chromium.execute_script(
                "return arguments[0].complete && arguments[0].naturalWidth", image
            )
            assert decoded, image.get_attribute("src")
    chromium.save_screenshot(str(_screenshots(tmp_path) / screenshot))
    severe = [entry for entry in chromium.get_log("browser") if entry["level"] == "SEVERE"]
    assert not severe, severe
