"""The web view in a real browser (Debian's chromium through Selenium, one session for the module): the links from
the models page to a model, a version and a comparison; an HTML payload shown as text with no script run; the
"as of" form against `mreg history --at`; the static site from file:// and from `python -m http.server`; a damaged
model marked. A screenshot of each page is saved under pytest's tmp dir (paths printed)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.browser import chromium
from support.cli import ok, run
from support.web_store import PAYLOAD, WebStore

from registry.web.server import UIServer


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One headless chromium for the module."""
    driver = chromium(tmp_path_factory.mktemp("chromium-profile"))
    driver.set_page_load_timeout(20)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the screenshots go."""
    return tmp_path_factory.mktemp("screenshots")


def snap(browser: Any, shots: Path, name: str) -> None:
    """Save a screenshot of the page shown, and say where."""
    path = shots / f"{name}.png"
    assert browser.save_screenshot(str(path)) and path.stat().st_size > 1000
    print(f"screenshot: {path}")


def by(browser: Any, css: str) -> Any:
    from selenium.webdriver.common.by import By

    return browser.find_element(By.CSS_SELECTOR, css)


def all_by(browser: Any, css: str) -> list[Any]:
    from selenium.webdriver.common.by import By

    return list(browser.find_elements(By.CSS_SELECTOR, css))


def quiet_console(browser: Any) -> None:
    """No script ran and nothing was blocked or failed: the console holds no error, warning or CSP report."""
    entries = [e for e in browser.get_log("browser") if "favicon.ico" not in e["message"]  # the browser's own ask
               and (e["level"] in ("SEVERE", "WARNING") or "Content Security Policy" in e["message"]
                    or "alert" in e["message"])]
    assert entries == [], entries


@pytest.mark.slow
def test_browse_the_live_view(browser: Any, shots: Path, live: UIServer, web_store: WebStore) -> None:
    browser.get(live.url)
    assert browser.title == "Models · mreg"
    rows = {r.get_attribute("data-model"): r for r in all_by(browser, "#models tr[data-model]")}
    assert list(rows) == ["alpha", "beta", "broken", "gamma"]
    assert "production → 2" in rows["alpha"].text and "staging → 3" in rows["alpha"].text
    assert "damaged: aliases" in rows["broken"].text and "damaged: history" in rows["broken"].text
    assert rows["gamma"].get_attribute("class") != "damaged"
    snap(browser, shots, "models")
    quiet_console(browser)

    rows["alpha"].find_element("css selector", "a.model").click()
    assert browser.title == "alpha · mreg"
    versions = {r.get_attribute("data-version"): r.text for r in all_by(browser, "#versions tr[data-version]")}
    assert list(versions) == ["1", "2", "3"] and "production" in versions["2"] and "passed" in versions["2"]
    assert "smoke hf: passed" in versions["2"] and "smoke hf: failed" in versions["3"]
    assert "untrusted release-bot" in versions["2"]  # signed, but no trust policy names the key
    reasons = [td.text for td in all_by(browser, "#history td.reason")]
    assert PAYLOAD in reasons and all_by(browser, "img") == [] and all_by(browser, "svg.timeline circle")
    snap(browser, shots, "model")
    quiet_console(browser)

    second = web_store.history[1]["by"]["at"]
    field = by(browser, "#at")
    field.send_keys(second)
    field.submit()
    shown = {r.get_attribute("data-alias"): r.find_element("css selector", ".version").text
             for r in all_by(browser, "#asof tr[data-alias]")}
    cli = ok(run("history", "alpha", "--at", second, "--store", web_store.store, "--json"))
    assert shown == {a: str(e["version"]) for a, e in cli["aliases"].items()} == {"production": "2"}
    snap(browser, shots, "model-as-of")

    by(browser, '#versions tr[data-version="3"] a').click()
    assert browser.title == "alpha@3 · mreg"
    assert by(browser, "#commit").text and "staging" in by(browser, "h1").text
    assert len(all_by(browser, "#artifact-hf table.files tr")) > 5 and by(browser, "#host").text
    assert int(by(browser, "#serving td.sequences").text) > 0
    snap(browser, shots, "version")
    by(browser, "#memory-form input[name=memory]").clear()
    by(browser, "#memory-form input[name=memory]").send_keys("0.5")
    by(browser, "#memory-form").submit()
    assert "memory=0.5" in browser.current_url and by(browser, "#serving")

    browser.get(live.url + "models/alpha/versions/2/")
    assert "release-bot" in by(browser, "#signatures").text and "smoke" in by(browser, "#checks").text
    browser.get(live.url + "models/alpha/")
    by(browser, "#compare-form").submit()  # the form's defaults: the two newest versions
    assert browser.current_url.endswith("/models/alpha/compare/2-3/index.html")
    assert "1 added" in by(browser, "#file-counts").text
    assert "NOTICE.md" in by(browser, "#files tr.added").text
    snap(browser, shots, "compare")
    quiet_console(browser)

    browser.get(live.url + "models/broken/")
    assert "damaged" in by(browser, '#versions tr[data-version="2"]').get_attribute("class")
    assert "does not parse" in by(browser, '#versions tr[data-version="2"]').text
    assert len(all_by(browser, ".problem")) >= 2
    snap(browser, shots, "damaged")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_static_site_from_file_and_http_server(browser: Any, shots: Path, web_store: WebStore,
                                               tmp_path: Path) -> None:
    out = tmp_path / "site"
    ok(run("site", "build", out, "--store", web_store.store, "--json"))
    browser.get(out.as_uri() + "/index.html")
    assert browser.title == "Models · mreg"
    by(browser, 'tr[data-model="alpha"] a.model').click()
    assert browser.current_url == (out / "models/alpha/index.html").as_uri()
    assert PAYLOAD in [td.text for td in all_by(browser, "#history td.reason")] and all_by(browser, "img") == []
    by(browser, '#versions tr[data-version="3"] td:last-child a').click()
    assert browser.current_url.endswith("/models/alpha/compare/2-3/index.html")
    snap(browser, shots, "static-compare")
    quiet_console(browser)

    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "-d", str(out)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.05)
        browser.get(f"http://127.0.0.1:{port}/")
        by(browser, 'tr[data-model="beta"] a.model').click()
        by(browser, '#versions tr[data-version="4"] a').click()
        assert browser.title == "beta@4 · mreg" and "production" in by(browser, "h1").text
        snap(browser, shots, "static-version")
        browser.get(f"http://127.0.0.1:{port}/models/broken/versions/2/index.html")
        assert "does not parse" in by(browser, "#error").text
        quiet_console(browser)
    finally:
        server.terminate()
        server.wait(10)
