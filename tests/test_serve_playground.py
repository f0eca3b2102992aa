"""The playground page at `/` in a real headless Chromium (selenium): it loads the rewards, a slider moves β, and a
generation streams into both panes with tokens shaded by their reward. Skips, saying why, without a browser.

``STEERKIT_SCREENSHOT=path.png`` saves a screenshot of the page after the generation (docs/playground.png is
taken this way on the real SmolLM2 server, see docs/serving.md)."""

from __future__ import annotations

import contextlib
import os
import shutil

import pytest

pytest.importorskip("fastapi")
webdriver = pytest.importorskip("selenium.webdriver",
                                reason='selenium is not installed: pip install "steerkit-rad[browser]"')

from serve_support import ServerThread, short_temp_dir, tiny_engine, tiny_parts  # noqa: E402

from steerkit.serving.app import ServerSettings, create_app  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
CHROMEDRIVER = shutil.which("chromedriver")

pytestmark = [
    pytest.mark.skipif(CHROMIUM is None or CHROMEDRIVER is None,
                       reason="no headless browser: apt-get install chromium chromium-driver (Debian's packages)"),
    pytest.mark.timeout(120),
    pytest.mark.slow,
]


@contextlib.contextmanager
def browser(width: int = 1400, height: int = 1000):
    """Headless Chromium for the block, quit after it. Its profile and temporary files (where it puts its
    sockets) are in a short temporary directory of its own, whatever ``$TMPDIR`` is."""
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    with short_temp_dir("skchrome") as scratch:
        options = Options()
        options.binary_location = CHROMIUM
        for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     f"--window-size={width},{height}", "--disable-extensions", "--no-first-run",
                     "--disable-background-networking", "--disable-component-update", "--disable-sync",
                     f"--user-data-dir={os.path.join(scratch, 'profile')}"):
            options.add_argument(flag)
        service = Service(CHROMEDRIVER, env={**os.environ, "TMPDIR": scratch})
        driver = webdriver.Chrome(service=service, options=options)
        try:
            yield driver
        finally:
            driver.quit()


def drive(url: str, *, prompt: str | None = None, betas: dict | None = None, max_tokens: int = 24,
          screenshot: str | None = None, timeout: float = 60, api_key: str | None = None):
    """Open the playground, set the prompt and sliders, generate, wait for both panes; returns what they show."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    with browser() as driver:
        driver.get(url + "/")
        wait = WebDriverWait(driver, timeout)
        if api_key is not None:  # the page finds out from the 401 of GET /v1/models and asks for the key
            wait.until(lambda d: d.find_element(By.ID, "key-box").is_displayed())
            box = driver.find_element(By.ID, "api-key")
            box.send_keys(api_key, Keys.ENTER)
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#rewards input[type=range]"))
        if prompt is not None:
            box = driver.find_element(By.ID, "prompt")
            box.clear()
            box.send_keys(prompt)
        tokens = driver.find_element(By.ID, "max-tokens")
        tokens.clear()
        tokens.send_keys(str(max_tokens))
        for slider in driver.find_elements(By.CSS_SELECTOR, "#rewards input[type=range]"):
            name = slider.get_attribute("data-reward")
            if betas is not None and name not in betas:
                continue
            target = (betas or {}).get(name, 60)
            slider.click()  # focus it, then move it with the keyboard as a user would
            current = int(slider.get_attribute("value"))
            key = Keys.ARROW_RIGHT if target > current else Keys.ARROW_LEFT
            slider.send_keys(*([key] * abs(target - current)))
        moved = {s.get_attribute("data-reward"): int(s.get_attribute("value"))
                 for s in driver.find_elements(By.CSS_SELECTOR, "#rewards input[type=range]")}
        labels = {name: driver.find_element(By.ID, f"beta-{name}-value").text for name in moved}
        driver.find_element(By.ID, "generate").click()
        wait.until(lambda d: all(d.find_element(By.ID, p).get_attribute("data-done") == "1"
                                 for p in ("unsteered", "steered")))
        result = {"moved": moved, "labels": labels}
        for pane in ("unsteered", "steered"):
            spans = driver.find_elements(By.CSS_SELECTOR, f"#{pane} .tok")
            result[pane] = {"text": "".join(s.get_attribute("textContent") for s in spans), "tokens": len(spans),
                            "shaded": sum(1 for s in spans if s.get_attribute("data-rho") is not None),
                            "status": driver.find_element(By.ID, f"{pane}-status").text,
                            "meta": driver.find_element(By.ID, f"{pane}-meta").text}
        result["shade"] = driver.find_element(By.ID, "shade").get_attribute("value")
        if screenshot:
            driver.execute_script("window.scrollTo(0, 0); document.activeElement.blur();")
            driver.save_screenshot(screenshot)
        return result


def test_the_playground_streams_both_panes_in_chromium(tmp_path):
    engine = tiny_engine(tiny_parts(), max_running=4, max_queue=8)
    with ServerThread(create_app(engine, settings=ServerSettings(timeout_s=60))) as server:
        shot = os.environ.get("STEERKIT_SCREENSHOT") or str(tmp_path / "playground.png")
        result = drive(server.url, prompt="The quick brown", betas={"tiny": 40}, max_tokens=12, screenshot=shot)
        server_url = server.url
        check(result, engine, server_url, shot)


def test_the_playground_asks_for_the_api_key_of_a_server_that_wants_one(tmp_path):
    """``steerkit serve --api-key``: the page gets a 401 from GET /v1/models, shows the key field, and with the key
    typed in streams both panes as without one (issue 24)."""
    engine = tiny_engine(tiny_parts(), max_running=4, max_queue=8)
    settings = ServerSettings(timeout_s=60, api_key="sk-playground")
    with ServerThread(create_app(engine, settings=settings)) as server:
        shot = str(tmp_path / "playground-key.png")
        result = drive(server.url, prompt="The quick brown", betas={"tiny": 40}, max_tokens=12, screenshot=shot,
                       api_key="sk-playground")
        check(result, engine, server.url, shot, api_key="sk-playground")


def api_text(url: str, body: dict, api_key: str | None = None) -> str:
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    return httpx.post(url + "/v1/completions", json=body, headers=headers, timeout=60).json()["choices"][0]["text"]


def check(result, engine, server_url, shot, api_key: str | None = None):
    assert result["moved"] == {"tiny": 40} and result["labels"] == {"tiny": "40"} and result["shade"] == "tiny"
    assert all(result[pane]["tokens"] >= 1 for pane in ("unsteered", "steered")), result
    assert result["steered"]["meta"] == "tiny=40" and result["unsteered"]["meta"] == "every β = 0"
    for pane in ("unsteered", "steered"):  # every token is shaded by its reward
        assert result[pane]["shaded"] == result[pane]["tokens"], result
        assert "finish:" in result[pane]["status"]
        assert "error" not in result[pane]["status"].lower(), result
    assert os.path.getsize(shot) > 10_000
    assert engine.stats()["running"] == 0
    # the unsteered pane (every β = 0) shows what an unsteered request (rewards: {}) generates
    plain = {"prompt": "The quick brown", "max_tokens": 12, "temperature": 1, "seed": 0, "k": engine.default_k}
    assert result["unsteered"]["text"] == api_text(server_url, {**plain, "rewards": {}}, api_key)
    assert result["steered"]["text"] == api_text(server_url, {**plain, "rewards": {"tiny": 40}}, api_key)
