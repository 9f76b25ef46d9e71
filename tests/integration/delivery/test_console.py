"""The console in a real browser (Debian's Chromium, driven by Selenium): sign in, create a
subscription, see a dead-lettered group in the unhealthy table, unsideline it from the console
and see it delivered. With ``SETU_SCREENSHOTS=DIR`` it also saves the main pages there (the
README's pictures)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from selenium import webdriver
from selenium.common.exceptions import NoAlertPresentException, WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import Select

from tests.integration.delivery.conftest import Receiver, ThreadWorker, World, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def browser() -> Iterator[WebDriver]:
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not chromium or not driver:
        pytest.fail("chromium and chromedriver are needed: scripts/install installs them")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--window-size=1280,1000",
    ):
        options.add_argument(flag)
    session = webdriver.Chrome(service=Service(driver), options=options)
    try:
        yield session
    finally:
        session.quit()


def shot(browser: WebDriver, name: str) -> None:
    folder = os.environ.get("SETU_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        browser.save_screenshot(str(Path(folder) / f"{name}.png"))


def accept_confirmation(browser: WebDriver) -> bool:
    try:
        browser.switch_to.alert.accept()
        return True
    except NoAlertPresentException:
        return False


def text_of(browser: WebDriver, css: str) -> str:
    try:
        return str(browser.find_element(By.CSS_SELECTOR, css).text)
    except WebDriverException:
        return ""


def test_an_operator_finds_and_unsidelines_a_stuck_group_in_the_console(
    world: World,
    receiver: Receiver,
    start_worker: Callable[..., ThreadWorker],
    api: httpx.Client,
    browser: WebDriver,
) -> None:
    key = api.headers["Authorization"].removeprefix("Bearer ")
    world.topic("t")
    # Given an operator signed in to the console
    browser.get(f"{api.base_url}/console")
    wait_for("sign-in form", lambda: bool(text_of(browser, "#signin")))
    browser.find_element(By.ID, "api-key").send_keys(key)
    browser.find_element(By.CSS_SELECTOR, "#signin button").click()
    wait_for("projects page", lambda: world.project in text_of(browser, "main"))
    shot(browser, "projects")
    # When they create a subscription from the project's page
    browser.find_element(By.LINK_TEXT, world.project).click()
    wait_for("project page", lambda: bool(text_of(browser, "#new-subscription")))
    form = browser.find_element(By.ID, "new-subscription")
    form.find_element(By.NAME, "name").send_keys("s")
    Select(form.find_element(By.NAME, "topic")).select_by_value("t")
    form.find_element(By.NAME, "url").send_keys(receiver.url)
    delays = form.find_element(By.NAME, "delays")
    delays.clear()
    delays.send_keys("100")
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    wait_for("subscription page", lambda: "every group is healthy" in text_of(browser, "#groups"))
    lifecycle = [b.text for b in browser.find_elements(By.CSS_SELECTOR, "button.lifecycle")]
    assert lifecycle == ["pause", "resume", "start"]
    # And a message of a group the endpoint rejects is produced
    receiver.answer("g1", 422)
    [message] = world.publish("t", "g1", 1, body=lambda m: b'{"order": "%s"}' % m.encode())
    start_worker()
    # Then the group shows in the unhealthy table (the page refreshes by itself)
    wait_for("g1 unhealthy", lambda: "dead_lettered" in text_of(browser, "#groups"), 30)
    assert "g1" in text_of(browser, "#groups")
    shot(browser, "subscription")
    browser.find_element(By.ID, "message-id").send_keys(message)
    browser.find_element(By.XPATH, "//button[text()='Show its attempts']").click()
    wait_for("attempts shown", lambda: "422" in text_of(browser, "#lookup"))
    browser.find_element(By.XPATH, "//button[text()='Browse the DLQ']").click()
    wait_for("letter shown", lambda: f'"order": "{message}"' in text_of(browser, "#dlq"))
    shot(browser, "dead-letters")
    # When the endpoint is fixed and the operator unsidelines the group (and confirms)
    receiver.heal()
    browser.find_element(By.CSS_SELECTOR, "button.unsideline[data-group=g1]").click()
    wait_for("confirmation", lambda: accept_confirmation(browser))
    # Then it is delivered, and the table shows every group healthy again
    wait_for("delivered", lambda: receiver.delivered("g1") == [message])
    wait_for("healthy", lambda: "every group is healthy" in text_of(browser, "#groups"), 30)
