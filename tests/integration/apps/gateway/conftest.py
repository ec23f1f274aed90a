"""The gateway tests' headless browser (the console tests): Debian's `chromium` and
`chromium-driver`, which `make test` installs. A browser that cannot start fails the test:
it is never skipped."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator

import pytest
from selenium import webdriver
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.remote.webdriver import WebDriver

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"


@pytest.fixture
def browser() -> Iterator[WebDriver]:
    profile = tempfile.mkdtemp(prefix="ss-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--window-size=1400,1000",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(arg)
    try:
        driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    except WebDriverException as e:
        shutil.rmtree(profile, ignore_errors=True)
        pytest.fail(
            f"headless Chromium did not start ({CHROMIUM}, {CHROMEDRIVER}): {e.msg}; "
            "`make test` installs Debian's chromium and chromium-driver",
            pytrace=False,
        )
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
