"""Drives the `dschat serve` chat page (GET /) in the system's headless Chromium.

    .venv/bin/python tests/serve/browser_test.py      # exit status 0 = pass

Uses /usr/bin/chromium and /usr/bin/chromedriver (never selenium-manager: there is no network), and
ServedModels from serve_fixture.py (the tiny OPT served as "tiny" and "tiny-b"). Screenshots go to
ARTIFACTS (serve_chat.png, serve_side_by_side.png).

Covers: the model lists, a visibly streaming reply (window.dschatStreamEvents and per-frame lengths),
the history sent on a second turn, Clear, two models side by side (each with its own history), the API
key (401 shown, then the key typed, saved, used), a server error shown in the column, Stop (the server
counts the cancel in /health), and a page that loads nothing from elsewhere.
"""
import os
import pathlib
import re
import sys
import time
import unittest
import urllib.request

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from serve_fixture import ARTIFACTS, ServedModels  # noqa: E402

os.environ.setdefault("SE_OFFLINE", "true")  # should selenium-manager ever run, it must not download
from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.options import Options  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
WAIT_S = 60

# Installs, before a send, a per-frame sampler of the newest assistant message's text length, so the
# test sees what was on screen while the reply streamed (not just the final text).
SAMPLER_JS = """
window.sampledLengths = [];
(function sample() {
  const all = document.querySelectorAll('.message.assistant');
  const last = all[all.length - 1];
  if (last && last.dataset.pending !== 'old') {
    const n = last.textContent.length;
    const s = window.sampledLengths;
    if (s.length === 0 || s[s.length - 1] !== n) s.push(n);
    if (last.dataset.done === 'true') return;
  }
  requestAnimationFrame(sample);
})();
document.querySelectorAll('.message.assistant').forEach(e => e.dataset.pending = 'old');
"""


def make_driver():
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]
    if missing:
        raise AssertionError(f"the browser test needs the system Chromium and chromedriver; missing: {missing} "
                             "(apt-get install chromium chromium-driver)")
    options = Options()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,900"):
        options.add_argument(arg)
    return webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))


class ChatPageTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        cls.driver = make_driver()
        cls.server = ServedModels()
        cls.server.__enter__()

    @classmethod
    def tearDownClass(cls):
        cls.driver.quit()
        status = cls.server.stop()
        if status != 0:
            raise AssertionError(f"dschat serve exited {status} on SIGTERM; log:\n{cls.server.log()}")

    # -- helpers ---------------------------------------------------------------------------------

    def wait(self, condition, what, timeout=WAIT_S):
        try:
            return WebDriverWait(self.driver, timeout, poll_frequency=0.05).until(lambda d: condition())
        except Exception as error:
            status = self.driver.find_element(By.ID, "status").text
            raise AssertionError(f"timed out after {timeout} s waiting for {what} (status line: {status!r}); "
                                 f"server log:\n{self.server_log()}") from error

    def server_log(self):
        return self.server.log()[-3000:]

    def open_page(self, url):
        self.driver.get(url)
        self.driver.execute_script("localStorage.clear()")  # no API key left from an earlier test
        self.driver.get(url)

    def option_values(self, select_id):
        return [o.get_attribute("value") for o in self.driver.find_elements(By.CSS_SELECTOR, f"#{select_id} option")]

    def wait_for_models(self):
        self.wait(lambda: self.option_values("model") == ["tiny", "tiny-b"], "the model list")

    def set_input(self, element_id, value):
        element = self.driver.find_element(By.ID, element_id)
        element.clear()
        element.send_keys(str(value))

    def messages(self, kind):
        return self.driver.find_elements(By.CSS_SELECTOR, f".message.{kind}")

    def send(self, text, max_tokens=None):
        if max_tokens is not None:
            self.set_input("max-tokens", max_tokens)
        self.driver.find_element(By.ID, "prompt").send_keys(text)
        self.driver.find_element(By.ID, "send").click()

    def wait_for_replies(self, count):
        """Waits until `count` assistant messages are finished; returns them."""
        def finished():
            errors = self.messages("error")
            if errors:
                raise AssertionError(f"the page shows an error: {errors[-1].text!r}; log:\n{self.server_log()}")
            done = [m for m in self.messages("assistant") if m.get_attribute("data-done") == "true"]
            return done if len(done) >= count else None
        replies = self.wait(finished, f"{count} finished assistant replies")
        for reply in replies:
            self.assertTrue(reply.text.strip(), "an assistant reply is empty")
            self.assertIn(reply.get_attribute("data-finish-reason"), ("stop", "length"))
        return replies

    def wait_for_replies_any_reason(self, count):
        def finished():
            done = [m for m in self.messages("assistant") if m.get_attribute("data-done") == "true"]
            return done if len(done) >= count else None
        return self.wait(finished, f"{count} ended assistant replies")

    def requests_sent(self):
        return self.driver.execute_script("return window.dschatRequests")

    # -- tests -----------------------------------------------------------------------------------

    def test_a_chat_streams_keeps_history_and_clears(self):
        driver = self.driver
        self.open_page(self.server.url)
        self.wait_for_models()
        self.assertEqual(self.option_values("compare-model"), ["", "tiny", "tiny-b"])
        self.assertEqual(driver.find_element(By.CSS_SELECTOR, "#compare-model option").text, "none")
        self.wait(lambda: driver.find_element(By.ID, "status").text == "ready", "status 'ready'")

        # 1. One long reply: it must arrive as many deltas, visibly growing.
        driver.execute_script(SAMPLER_JS)
        started = time.monotonic()
        self.send("Tell me a story.", max_tokens=200)
        (reply,) = self.wait_for_replies(1)
        elapsed = time.monotonic() - started
        events = driver.execute_script("return window.dschatStreamEvents")
        lengths = driver.execute_script("return window.sampledLengths")
        print(f"\nstreamed reply: {len(reply.text)} chars in {elapsed:.2f} s, {events} delta events, "
              f"on-screen lengths sampled per frame: {lengths[:12]}{' …' if len(lengths) > 12 else ''}")
        self.assertGreater(events, 1, "the reply did not stream: it arrived in a single delta")
        intermediate = [n for n in lengths if 0 < n < lengths[-1]]
        self.assertGreaterEqual(len(intermediate), 2, f"no partial reply was ever on screen: {lengths}")
        self.assertEqual(lengths[-1], len(driver.execute_script("return arguments[0].textContent", reply)))
        self.assertEqual(driver.find_element(By.ID, "status").text, "ready")
        driver.find_element(By.ID, "clear").click()
        self.assertEqual(driver.find_elements(By.CSS_SELECTOR, ".message"), [])

        # 2. Two turns: the second request carries the first turn (user + the shown assistant reply).
        self.send("Hello there!", max_tokens=24)
        (first,) = self.wait_for_replies(1)
        self.send("And then?\n", max_tokens=24)  # Enter in the prompt sends too
        self.wait_for_replies(2)
        self.assertEqual([m.text for m in self.messages("user")], ["Hello there!", "And then?"])
        last_request = self.requests_sent()[-1]
        self.assertEqual(last_request["model"], "tiny")
        self.assertEqual(last_request["stream"], True)
        self.assertEqual(last_request["max_tokens"], 24)
        self.assertAlmostEqual(last_request["temperature"], 0.7)
        self.assertEqual([m["role"] for m in last_request["messages"]], ["user", "assistant", "user"])
        self.assertEqual(last_request["messages"][0]["content"], "Hello there!")
        self.assertEqual(last_request["messages"][1]["content"],
                         driver.execute_script("return arguments[0].textContent", first))
        self.assertEqual(self.messages("assistant")[0].get_attribute("data-model"), "tiny")

        # Nothing was fetched from anywhere but the server.
        foreign = driver.execute_script(
            "return performance.getEntriesByType('resource').map(e => e.name)"
            ".filter(n => !n.startsWith(location.origin))")
        self.assertEqual(foreign, [])

        shot = ARTIFACTS / "serve_chat.png"
        driver.save_screenshot(str(shot))
        print(f"screenshot: {shot}")

        driver.find_element(By.ID, "clear").click()
        self.assertEqual(driver.find_elements(By.CSS_SELECTOR, ".message"), [])

    def test_b_side_by_side(self):
        driver = self.driver
        self.open_page(self.server.url)
        self.wait_for_models()
        Select(driver.find_element(By.ID, "compare-model")).select_by_value("tiny-b")
        columns = driver.find_elements(By.CSS_SELECTOR, "#conversation .column")
        self.assertEqual(len(columns), 2)

        self.send("Which model are you?", max_tokens=32)
        replies = self.wait_for_replies(2)
        self.assertEqual(sorted(r.get_attribute("data-model") for r in replies), ["tiny", "tiny-b"])
        for column in columns:  # each column shows its own user message and its own reply
            self.assertEqual(len(column.find_elements(By.CSS_SELECTOR, ".message.user")), 1)
            self.assertEqual(len(column.find_elements(By.CSS_SELECTOR, ".message.assistant")), 1)
        own_reply = {r.get_attribute("data-model"): driver.execute_script("return arguments[0].textContent", r)
                     for r in replies}

        # A second turn: each model is sent its own history (its own earlier reply).
        self.send("Go on.", max_tokens=16)
        self.wait_for_replies(4)
        second_turn = self.requests_sent()[-2:]
        self.assertEqual(sorted(r["model"] for r in second_turn), ["tiny", "tiny-b"])
        for request in second_turn:
            self.assertEqual([m["role"] for m in request["messages"]], ["user", "assistant", "user"])
            self.assertEqual(request["messages"][1]["content"], own_reply[request["model"]])

        shot = ARTIFACTS / "serve_side_by_side.png"
        driver.save_screenshot(str(shot))
        print(f"\nscreenshot: {shot}")

    def test_c_api_key(self):
        driver = self.driver
        with ServedModels(extra_args=["--api-key", "secret-key"]) as server:
            self.open_page(server.url)
            error = self.wait(lambda: (self.messages("error") or [None])[0], "an error message without the key")
            self.assertIn("401", error.text)
            self.assertIn("key", error.text.lower())
            self.assertEqual(self.option_values("model"), [])

            self.set_input("api-key", "secret-key")
            driver.find_element(By.ID, "api-key").send_keys(Keys.ENTER)  # commits the field (change event)
            self.wait_for_models()
            self.assertEqual(self.messages("error"), [], "the stale 401 message is still shown")
            self.assertEqual(driver.execute_script("return localStorage.getItem('dschat.apiKey')"), "secret-key")
            self.send("Hi!", max_tokens=16)
            self.wait_for_replies(1)

            # The key survives a reload (localStorage), and a wrong key shows the server's 401 again.
            driver.get(server.url)
            self.wait_for_models()
            self.set_input("api-key", "wrong")
            driver.find_element(By.ID, "api-key").send_keys(Keys.ENTER)
            self.wait(lambda: self.messages("error"), "a 401 message for a wrong key")
            self.assertEqual(server.stop(), 0)

    def test_d_server_error_shown(self):
        driver = self.driver
        self.open_page(self.server.url)
        self.wait_for_models()
        self.send("Hello?", max_tokens=-1)  # out of range: 400 invalid_request_error
        error = self.wait(lambda: (self.messages("error") or [None])[0], "the 400 error message")
        self.assertTrue(error.text.startswith("HTTP 400: "), error.text)
        self.assertEqual(self.messages("assistant"), [])  # the empty reply element is dropped
        self.assertIn("error", driver.find_element(By.ID, "status").get_attribute("class"))
        # The failed turn is not part of the history: the next request starts clean.
        self.send("Hello again.", max_tokens=8)
        self.wait(lambda: [m for m in self.messages("assistant") if m.get_attribute("data-done") == "true"],
                  "a reply after the error")
        self.assertEqual([m["role"] for m in self.requests_sent()[-1]["messages"]], ["user"])

    def test_e_stop(self):
        driver = self.driver
        self.open_page(self.server.url)
        self.wait_for_models()
        before = self.server.get_json("/health")
        self.send("A long answer, please.", max_tokens=200)
        driver.find_element(By.ID, "stop").click()  # may land after a fast reply already finished
        (reply,) = self.wait_for_replies_any_reason(1)
        reason = reply.get_attribute("data-finish-reason")
        self.assertIn(reason, ("abort", "stop", "length"))
        self.wait(lambda: driver.find_element(By.ID, "send").is_enabled(), "the send button back")

        def ended(health):  # requests the server has finished with, either way
            return health.get("cancelled_total", 0) + health.get("completed_total", 0)

        # The server accounts for the request exactly once: cancelled when it noticed the client
        # leave mid-generation, completed when it had generated and written the whole answer before
        # the stop reached it (a loaded machine's browser can still be rendering the streamed
        # chunks then, so the page shows "stopped" either way). serve_load's disconnect test
        # checks the cancellation itself, with clients that leave for sure.
        self.wait(lambda: ended(self.server.get_json("/health")) >= ended(before) + 1, "the request accounted for",
                  timeout=15)
        cancelled = self.server.get_json("/health").get("cancelled_total", 0) - before.get("cancelled_total", 0)
        if reason == "abort":
            self.assertEqual(driver.find_element(By.ID, "status").text, "stopped")
        else:
            self.assertEqual(cancelled, 0, "a reply that ended normally was counted as cancelled")
        print(f"\nstop: the reply ended with finish reason {reason!r} after {len(reply.text)} chars; "
              f"the server {'cancelled' if cancelled else 'had completed'} it")

    def test_f_page_is_self_contained(self):
        with urllib.request.urlopen(self.server.url + "/", timeout=30) as response:
            self.assertEqual(response.status, 200)
            self.assertTrue(response.headers["Content-Type"].startswith("text/html"), response.headers["Content-Type"])
            page = response.read().decode("utf-8")
        for element_id in ("model", "compare-model", "prompt", "send", "clear", "stop", "max-tokens",
                           "temperature", "api-key", "status"):
            self.assertIn(f'id="{element_id}"', page)
        external = re.findall(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//[^"'\s>]*""", page, re.I)
        external += re.findall(r"""(?:url\(|@import)\s*["']?\s*(?:https?:)?//[^"')\s]*""", page, re.I)
        self.assertEqual(external, [], "the page pulls external resources")


if __name__ == "__main__":
    started = time.monotonic()
    result = unittest.main(exit=False, verbosity=2).result
    print(f"browser test: {time.monotonic() - started:.1f} s; artifacts in {ARTIFACTS}")
    sys.exit(0 if result.wasSuccessful() else 1)
