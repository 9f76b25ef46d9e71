"""The console in a real browser (Debian's Chromium, driven by Selenium) on the whole stack as
`setu dev up` runs it: sign in, create a subscription, produce a message that is dead-lettered,
see its group in the unhealthy table, unsideline it from the console and see it delivered,
then replay it from the console.
With ``SETU_SCREENSHOTS=DIR`` it also saves the main pages there (the README's pictures)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from selenium import webdriver
from selenium.common.exceptions import (
    NoAlertPresentException,
    StaleElementReferenceException,
    WebDriverException,
)
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import Select

from tests.integration.delivery.support import Receiver, wait_for
from tests.integration.on_dev_up.support import DevStack

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
    # The browser's console log, where it reports what a Content-Security-Policy refused
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
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


def shows(browser: WebDriver, css: str, text: str) -> bool:
    """Whether ``css`` holds ``text``; an error the page shows instead fails the test at once
    (with the API's message) rather than after the wait."""
    failed = text_of(browser, "main > p.bad")
    assert not failed, f"the console shows an error: {failed}"
    return text in text_of(browser, css)


def clicked(browser: WebDriver, by: str, selector: str) -> bool:
    """Clicks the element; False when the page's refresh replaced it between finding and
    clicking (the click did not happen: find it again)."""
    try:
        browser.find_element(by, selector).click()
        return True
    except StaleElementReferenceException:
        return False


def clicked_until(browser: WebDriver, button: str, css: str, text: str) -> bool:
    """Whether ``css`` shows ``text``; clicks ``button`` again when it does not yet."""
    if text in text_of(browser, css):
        return True
    clicked(browser, By.XPATH, f"//button[text()='{button}']")
    return False


# Server-side steps (Kafka topics, Spark ingest) on a loaded 2-core machine take a while.
SLOW_S = 120.0


def test_an_operator_finds_and_unsidelines_a_stuck_group_in_the_console(
    dev_stack: DevStack, receiver: Receiver, browser: WebDriver
) -> None:
    # Given the whole stack as `setu dev up` runs it, a project and a topic an admin made
    api, key = dev_stack.api, dev_stack.key
    client = httpx.Client(base_url=api, headers={"Authorization": f"Bearer {key}"}, timeout=30)
    assert client.post("/v1/projects", json={"name": "shop"}).status_code == 201
    topic = {"name": "orders", "grouped": True, "partitions": 2}
    assert client.post("/v1/projects/shop/topics", json=topic).status_code == 201
    # When an operator signs in to the console with the key dev up printed
    browser.get(f"{api}/console")
    wait_for("sign-in form", lambda: bool(text_of(browser, "#signin")))
    browser.find_element(By.ID, "api-key").send_keys(key)
    browser.find_element(By.CSS_SELECTOR, "#signin button").click()
    wait_for("projects page", lambda: "shop" in text_of(browser, "main"))
    shot(browser, "projects")
    # And creates a subscription from the project's page
    browser.find_element(By.LINK_TEXT, "shop").click()
    wait_for("project page", lambda: bool(text_of(browser, "#new-subscription")))
    form = browser.find_element(By.ID, "new-subscription")
    form.find_element(By.NAME, "name").send_keys("billing")
    Select(form.find_element(By.NAME, "topic")).select_by_value("orders")
    form.find_element(By.NAME, "url").send_keys(receiver.url)
    delays = form.find_element(By.NAME, "delays")
    delays.clear()
    delays.send_keys("100")
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    wait_for("subscription page", lambda: "every group is healthy" in text_of(browser, "#groups"))
    lifecycle = [b.text for b in browser.find_elements(By.CSS_SELECTOR, "button.lifecycle")]
    assert lifecycle == ["pause", "resume", "start"]
    # And a producer sends a message of a group the endpoint rejects (422: not retried)
    receiver.answer("customer-42", 422)
    produced = client.post(
        "/v1/projects/shop/topics/orders/produce",
        headers={"X-Message-Id": "m-1", "X-Group-Id": "customer-42"},
        content=b'{"order": 7}',
    )
    assert produced.status_code == 200, produced.text
    # Then the group shows in the unhealthy table (the page refreshes by itself)
    wait_for("unhealthy group", lambda: shows(browser, "#groups", "dead_lettered"), SLOW_S)
    assert "customer-42" in text_of(browser, "#groups")
    shot(browser, "subscription")
    # And the message's attempts and its dead letter can be looked at
    browser.find_element(By.ID, "message-id").send_keys("m-1")
    # (asked again until it shows: the worker writes attempts every 200 ms)
    wait_for(
        "attempts shown",
        lambda: clicked_until(browser, "Show its attempts", "#lookup", "422"),
        SLOW_S,
        every_s=1.0,
    )
    wait_for(
        "letter shown",
        lambda: clicked_until(browser, "Browse the DLQ", "#dlq", '"order": 7'),
        SLOW_S,
        every_s=1.0,
    )
    shot(browser, "dead-letters")
    # When the endpoint is fixed and the operator unsidelines the group (and confirms)
    receiver.heal()
    # (the groups table is redrawn every refresh: a button found just before one is gone)
    unsideline = "button.unsideline[data-group=customer-42]"
    wait_for("unsideline clicked", lambda: clicked(browser, By.CSS_SELECTOR, unsideline))
    wait_for("confirmation", lambda: accept_confirmation(browser))
    # Then it is delivered, and the table shows every group healthy again
    wait_for("delivered", lambda: receiver.delivered("customer-42") == ["m-1"], SLOW_S)
    wait_for("healthy", lambda: shows(browser, "#groups", "every group is healthy"), SLOW_S)
    # When the receiver loses what it acknowledged and the operator replays the group
    # from the console (the last hour, by default)
    browser.find_element(By.ID, "replay-groups").send_keys("customer-42")
    browser.find_element(By.CSS_SELECTOR, "#new-replay button[type=submit]").click()
    wait_for("confirmation", lambda: accept_confirmation(browser))
    # Then the message is delivered again under the replay's id, and the replay ends
    wait_for(
        "replayed",
        lambda: any(
            c.message_id == "m-1" and c.headers.get("x_replay_id") and c.status == 200
            for c in receiver.calls
        ),
        SLOW_S,
    )
    wait_for("replay done", lambda: shows(browser, "#replays", "done"), SLOW_S)
    assert "customer-42" in text_of(browser, "#replays")
    shot(browser, "replays")
    # And /docs renders Swagger UI in the browser from the API's own files
    browser.get(f"{api}/docs")
    wait_for(
        "operations listed",
        lambda: len(browser.find_elements(By.CSS_SELECTOR, ".opblock")) > 20,
        SLOW_S,
    )
    # And neither page did anything its Content-Security-Policy refuses (api/headers.py)
    refused = [
        e["message"] for e in browser.get_log("browser") if "Security Policy" in e["message"]
    ]
    assert refused == []
    client.close()
