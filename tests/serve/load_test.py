#!/usr/bin/env python3
"""Load and fault test of `dschat serve` (about a minute on 2 cores):

    .venv/bin/python tests/serve/load_test.py        # exit 0 = pass

One server (the bundled tiny OPT as "tiny" and "tiny-b", --max-queue 8 --max-body-bytes 65536, so
that a full queue and an oversized body are reachable), four checks in order:
  a. load: 64 concurrent streaming clients, a warm-up round then two rounds of 8 s: every response
     is a complete 200 stream ending in [DONE] or a 429 rate_limit_exceeded error object, the 429s
     match /health's rejected_total, /health answers every 250 ms poll within 2 s, RSS stays flat;
  b. disconnects: 16 clients close their streams (max_tokens 240) after 2 content chunks: /health's
     cancelled_total rises by 16, running returns to 0, and a normal request still works;
  c. malformed and oversized bodies: the 400/404/413 error objects of the contract, the server
     answering /health throughout and alive at the end;
  d. SIGTERM: the server exits 0 within 30 s.
The client code is benchmarks/serve_load.py's. On a failure the server log's tail is printed.
"""
import asyncio
import json
import os
import pathlib
import sys
import threading
import time
import unittest

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1] / "benchmarks"))

import serve_load  # noqa: E402
from serve_fixture import ServedModels  # noqa: E402

MIB = 1024 * 1024
MAX_QUEUE = 8
MAX_BODY = 65536
LOAD_CLIENTS = 64
ROUND_S = 8.0
WARMUP_S = 3.0
DISCONNECT_CLIENTS = 16
# 500 does not fit: the tiny OPT's context is min(--max-out-tokens 512, max_position_embeddings 256)
# = 256 tokens, and prompt + max_tokens over it is a 400 context_length_exceeded. "Hi" in the chat
# template is about 7 tokens.
DISCONNECT_MAX_TOKENS = 240
WATCHDOG_S = 300  # the whole script, whatever hangs

SERVER = None


def setUpModule():
    global SERVER
    SERVER = ServedModels(extra_args=["--max-queue", str(MAX_QUEUE), "--max-body-bytes", str(MAX_BODY)])
    SERVER.__enter__()


def tearDownModule():
    if SERVER is not None and SERVER.process.poll() is None:
        SERVER.stop()


def health():
    return serve_load.get_json(SERVER.url, "/health", timeout=5)


def log_tail(chars=4000):
    try:
        return SERVER.log()[-chars:]
    except OSError as error:
        return f"(no log: {error})"


class ServeLoadTest(unittest.TestCase):
    def run(self, result=None):
        failures_before = len(result.failures) + len(result.errors) if result else 0
        out = super().run(result)
        if result and len(result.failures) + len(result.errors) > failures_before:
            print(f"\n--- server log tail after {self.id()} ---\n{log_tail()}\n---", file=sys.stderr)
        return out

    def assert_alive(self):
        self.assertIsNone(SERVER.process.poll(), "the server process has exited")

    # -- a ---------------------------------------------------------------------------------------
    def check_round(self, name, run, rejected_delta):
        summary = run.summary()
        print(f"{name}: {json.dumps(summary)}", file=sys.stderr)
        bad = [r for r in run.results
               if not (r.ok or (r.status == 429 and isinstance(r.error, dict)
                                and r.error.get("type") == "rate_limit_exceeded"))]
        self.assertEqual(bad, [], f"{name}: {len(bad)} responses neither a complete 200 stream nor a 429 "
                                  f"rate_limit_exceeded error object; first: {bad[:1]}")
        self.assertGreater(sum(r.ok for r in run.results), 0, f"{name}: no complete 200 stream")
        rejected_seen = sum(r.status == 429 for r in run.results)
        self.assertEqual(rejected_delta, rejected_seen,
                         f"{name}: /health rejected_total rose by {rejected_delta}, the clients saw {rejected_seen} 429s")
        self.assertEqual(run.health_failures, [], f"{name}: /health polls failed")
        self.assertGreater(len(run.health_latencies), ROUND_S * 2, f"{name}: too few /health polls")
        self.assertLess(max(run.health_latencies), 2.0, f"{name}: a /health poll took over 2 s")
        return rejected_seen

    def test_a_load(self):
        payload = serve_load.chat_payload("tiny", max_tokens=32, temperature=0.7)
        pid = SERVER.process.pid
        serve_load.run_load(SERVER.url, payload, LOAD_CLIENTS, WARMUP_S, pid=pid, request_timeout_s=30)
        time.sleep(0.5)
        rss_warm = SERVER.rss_bytes()
        rejected = 0
        rss_after = []
        for name in ("round 1", "round 2"):
            before = health()["rejected_total"]
            run = serve_load.run_load(SERVER.url, payload, LOAD_CLIENTS, ROUND_S, pid=pid, request_timeout_s=30)
            time.sleep(0.5)
            rejected += self.check_round(name, run, health()["rejected_total"] - before)
            rss_after.append(SERVER.rss_bytes())
            self.assert_alive()
        print(f"RSS after warm-up {rss_warm / MIB:.1f} MiB, round 1 {rss_after[0] / MIB:.1f} MiB, "
              f"round 2 {rss_after[1] / MIB:.1f} MiB", file=sys.stderr)
        self.assertGreater(rejected, 0, f"no 429 with {LOAD_CLIENTS} clients and --max-queue {MAX_QUEUE}")
        self.assertLess(rss_after[0] - rss_warm, 200 * MIB, "RSS grew over 200 MiB from the warm-up to round 1")
        self.assertLess(rss_after[1] - rss_after[0], 50 * MIB, "RSS grew over 50 MiB from round 1 to round 2")

    # -- b ---------------------------------------------------------------------------------------
    def test_b_disconnects(self):
        before = health()
        payload = serve_load.chat_payload("tiny", prompt="Hi", max_tokens=DISCONNECT_MAX_TOKENS, temperature=1.0,
                                          include_usage=False)

        async def one():
            # 16 at once overflow --max-queue 8 while the first batch runs (batches do not grow while
            # they run): a client answered 429 retries until it is admitted.
            for _ in range(100):
                result = await serve_load.stream_chat(SERVER.url, payload, close_after_chunks=2, timeout=30)
                if result.status != 429:
                    return result
                await asyncio.sleep(0.1)
            return result

        async def go():
            return await asyncio.gather(*(one() for _ in range(DISCONNECT_CLIENTS)))

        results = asyncio.run(go())
        statuses = [r.status for r in results]
        self.assertEqual(statuses, [200] * DISCONNECT_CLIENTS,
                         f"disconnect requests: statuses {statuses}; errors {[r.error for r in results if r.error]}")
        closed = sum(r.closed_early for r in results)
        finished = [(r.content_chunks, r.finish_reason) for r in results if not r.closed_early]
        self.assertEqual(closed, DISCONNECT_CLIENTS,
                         f"only {closed} streams lasted 2 content chunks; the others ended: {finished}")
        deadline = time.monotonic() + 10
        now = health()
        while now["cancelled_total"] - before["cancelled_total"] < closed and time.monotonic() < deadline:
            time.sleep(0.2)
            now = health()
        self.assertEqual(now["cancelled_total"] - before["cancelled_total"], closed,
                         f"cancelled_total rose by {now['cancelled_total'] - before['cancelled_total']} within 10 s "
                         f"after {closed} clients went away; /health {now}")
        deadline = time.monotonic() + 5
        while now["running"] != 0 and time.monotonic() < deadline:
            time.sleep(0.2)
            now = health()
        self.assertEqual(now["running"], 0, f"running did not return to 0 within 5 s: {now}")
        generated = now["generated_tokens_total"] - before["generated_tokens_total"]
        print(f"disconnects: {closed} clients closed after 2 content chunks; cancelled_total "
              f"+{now['cancelled_total'] - before['cancelled_total']}, rejected_total "
              f"+{now['rejected_total'] - before['rejected_total']} (retried), generated_tokens_total +{generated}",
              file=sys.stderr)
        self.assertLess(generated, DISCONNECT_CLIENTS * DISCONNECT_MAX_TOKENS // 2,
                        f"{generated} tokens generated for {closed} cancelled streams of max_tokens "
                        f"{DISCONNECT_MAX_TOKENS}: the generations were not cut short")
        status, _, body = serve_load.http_call(SERVER.url, "POST", "/v1/chat/completions", {
            "model": "tiny", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8}, timeout=30)
        self.assertEqual(status, 200, f"a normal request after the disconnects: {status} {body[:300]!r}")
        answer = json.loads(body)
        self.assertEqual(answer["object"], "chat.completion")
        self.assertIn(answer["choices"][0]["finish_reason"], ("stop", "length"))
        self.assert_alive()

    # -- c ---------------------------------------------------------------------------------------
    def expect_error(self, body, status, param=..., code=..., type_="invalid_request_error", raw=False, label=None):
        label = label or (body[:80] if raw else json.dumps(body)[:120])
        data = body if raw else json.dumps(body).encode()
        try:
            got, headers, response = serve_load.http_call(SERVER.url, "POST", "/v1/chat/completions", data,
                                                          headers={"Content-Type": "application/json"}, timeout=30)
        except OSError as error:
            self.fail(f"{label}: no response ({type(error).__name__}: {error}); expected {status}")
        self.assertEqual(got, status, f"{label}: status {got}, expected {status}; body {response[:300]!r}")
        try:
            error = json.loads(response)["error"]
        except (ValueError, KeyError, TypeError):
            self.fail(f"{label}: no OpenAI error object in {response[:300]!r}")
        self.assertIsInstance(error.get("message"), str, f"{label}: {error}")
        self.assertEqual(error.get("type"), type_, f"{label}: {error}")
        if param is not ...:
            self.assertEqual(error.get("param"), param, f"{label}: {error}")
        if code is not ...:
            self.assertEqual(error.get("code"), code, f"{label}: {error}")
        # the server keeps answering /health between the bad requests
        self.assertEqual(health()["status"], "ok")

    def test_c_malformed(self):
        def chat(**overrides):
            body = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
            body.update(overrides)
            return {k: v for k, v in body.items() if v is not None}

        with self.subTest("invalid JSON"):
            self.expect_error(b'{"model": "tiny", "messages": [', 400, raw=True)
        with self.subTest("not an object"):
            self.expect_error(b'[1, 2, 3]', 400, raw=True)
            self.expect_error(b'"hello"', 400, raw=True)
        with self.subTest("empty body"):
            self.expect_error(b'', 400, raw=True, label="empty body")
        with self.subTest("missing model"):
            self.expect_error(chat(model=None), 400, param="model")
        with self.subTest("missing messages"):
            self.expect_error(chat(messages=None), 400, param="messages")
        with self.subTest("unknown model"):
            self.expect_error(chat(model="no-such-model"), 404, param="model", code="model_not_found")
        for key, value in (("max_tokens", -1), ("temperature", 5), ("top_p", 0), ("n", 0),
                           ("stop", ["a", "b", "c", "d", "e"])):
            with self.subTest(key):
                self.expect_error(chat(**{key: value}), 400, param=key)
        with self.subTest("oversized body"):
            big = chat(messages=[{"role": "user", "content": "x" * (MAX_BODY + 1000)}])
            self.expect_error(big, 413, code="request_too_large", label=f"a {MAX_BODY + 1000}-byte message")
        with self.subTest("prompt longer than the context"):
            long = chat(messages=[{"role": "user", "content": "hello " * 1000}])  # ~1000 tokens, ~6 KB
            self.expect_error(long, 400, param="messages", code="context_length_exceeded",
                              label="a 1000-token prompt")
        with self.subTest("still serving"):
            status, _, body = serve_load.http_call(SERVER.url, "POST", "/v1/chat/completions", chat(), timeout=30)
            self.assertEqual(status, 200, body[:300])
        self.assert_alive()

    # -- d ---------------------------------------------------------------------------------------
    def test_d_sigterm(self):
        self.assert_alive()
        t0 = time.monotonic()
        status = SERVER.stop(timeout_s=30)
        print(f"SIGTERM: exit status {status} after {time.monotonic() - t0:.2f} s", file=sys.stderr)
        self.assertEqual(status, 0, "exit status after SIGTERM")


def watchdog():
    print(f"\nload_test: still running after {WATCHDOG_S} s; server log tail:\n{log_tail() if SERVER else ''}",
          file=sys.stderr, flush=True)
    if SERVER is not None and SERVER.process and SERVER.process.poll() is None:
        SERVER.process.kill()
    os._exit(2)


if __name__ == "__main__":
    timer = threading.Timer(WATCHDOG_S, watchdog)
    timer.daemon = True
    timer.start()
    t_start = time.monotonic()
    program = unittest.main(exit=False, verbosity=2)
    print(f"load_test: {time.monotonic() - t_start:.1f} s", file=sys.stderr)
    sys.exit(0 if program.result.wasSuccessful() else 1)
