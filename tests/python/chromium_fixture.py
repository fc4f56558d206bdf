"""Headless Chromium through chromedriver (Debian's chromium, chromium-driver and
python3-selenium), for the tests that look at dlrun's pages: test_metrics_page.py, and
job_view_browser.py inside a simulated host for test_job_view.py."""

import os

from selenium import webdriver
from selenium.webdriver.chrome.service import Service

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-default-apps",
    "--disable-extensions",
)


def start_chromium(work_dir, height):
    """(driver, service): Chromium in a 1366 x `height` window with a fresh profile under
    `work_dir`, chromedriver's log in work_dir/driver.log."""
    options = webdriver.ChromeOptions()
    for flag in (*FLAGS, f"--window-size=1366,{height}"):
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={os.path.join(work_dir, 'profile')}")
    options.binary_location = "/usr/bin/chromium"
    service = Service("/usr/bin/chromedriver", log_path=os.path.join(work_dir, "driver.log"))
    return webdriver.Chrome(service=service, options=options), service
