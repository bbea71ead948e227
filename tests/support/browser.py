"""A real browser for the web view's tests: Debian's chromium, driven by Selenium through Debian's chromedriver.

Both paths are given to Selenium (the Service's executable, the binary), so selenium-manager never runs and
nothing is downloaded. Without them the tests skip, naming the install command; with MREG_REQUIRE_BROWSER=1
(set by .ci/run where it installs them) they fail instead.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

INSTALL = "apt-get install -y --no-install-recommends chromium chromium-driver"
REQUIRE_ENV = "MREG_REQUIRE_BROWSER"
CHROMIUM = ("/usr/bin/chromium", "/usr/bin/chromium-browser")
CHROMEDRIVER = ("/usr/bin/chromedriver",)


def _first(paths: tuple[str, ...], name: str) -> str | None:
    return next((p for p in paths if os.access(p, os.X_OK)), None) or shutil.which(name)


def unavailable(why: str) -> None:
    """Skip (or, where CI requires the browser, fail) naming the install command."""
    message = f"{why}: install it with `{INSTALL}` (and `pip install selenium`, the test extra)"
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(message)
    pytest.skip(message)


def chromium(profile: Path) -> Any:
    """A headless chromium session logging the browser console (`driver.get_log("browser")`)."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        unavailable("selenium is not installed")
    binary, driver = _first(CHROMIUM, "chromium"), _first(CHROMEDRIVER, "chromedriver")
    if binary is None or driver is None:
        unavailable("chromium or chromedriver is missing")
    options = webdriver.ChromeOptions()
    options.binary_location = str(binary)
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1280,1000", f"--user-data-dir={profile}", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--allow-file-access-from-files"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(executable_path=str(driver)), options=options)
