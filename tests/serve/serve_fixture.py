"""Starts `dschat serve` on a free loopback port for the serve tests, and stops it.

    with ServedModels(extra_args=["--api-key", "k"]) as server:
        server.url          # "http://127.0.0.1:PORT"
        server.process      # the Popen (its stderr goes to server.log_path)

The bundled tiny OPT (assets/tiny-opt, GPT-2 tokenizer) is served twice, as "tiny" and "tiny-b",
unless `models` says otherwise; `tokenizer` is the --tokenizer directory (the GPT-2 one). The binary comes from $DSCHAT_CLI_PATH (ctest sets it) or
build/dschat.
"""
import json
import os
import pathlib
import signal
import subprocess
import tempfile
import time
import urllib.request

SOURCE_DIR = pathlib.Path(__file__).resolve().parents[2]
CLI = os.environ.get("DSCHAT_CLI_PATH", str(SOURCE_DIR / "build" / "dschat"))
TINY_MODEL = SOURCE_DIR / "assets" / "tiny-opt"
TOKENIZER = SOURCE_DIR / "assets" / "gpt2-bpe"
ARTIFACTS = pathlib.Path(os.environ.get("DSCHAT_TEST_ARTIFACTS", SOURCE_DIR / "build" / "test-artifacts"))
READY_PREFIX = "dschat serve: listening on "


class ServedModels:
    def __init__(self, models=None, extra_args=(), env=None, start_timeout_s=120, tokenizer=TOKENIZER):
        self.models = models or [f"tiny={TINY_MODEL}", f"tiny-b={TINY_MODEL}"]
        self.tokenizer = tokenizer
        self.extra_args = list(extra_args)
        self.env = env
        self.start_timeout_s = start_timeout_s
        self.url = None
        self.process = None
        self._log = tempfile.NamedTemporaryFile(prefix="dschat-serve-", suffix=".log", delete=False)
        self.log_path = self._log.name

    def command(self):
        cmd = [CLI, "serve", "--port", "0", "--tokenizer", str(self.tokenizer), "--device", "cpu"]
        for model in self.models:
            cmd += ["--model", model]
        return cmd + self.extra_args

    def __enter__(self):
        env = dict(os.environ, **(self.env or {}))
        self.process = subprocess.Popen(self.command(), stdout=subprocess.PIPE, stderr=self._log, text=True, env=env)
        deadline = time.monotonic() + self.start_timeout_s
        line = self.process.stdout.readline()  # blocks until the server says where it listens
        if not line.startswith(READY_PREFIX) or time.monotonic() > deadline:
            self.process.kill()
            raise RuntimeError(f"dschat serve did not start (first line {line!r}); log:\n{self.log()}")
        self.url = line[len(READY_PREFIX):].strip()
        return self

    def __exit__(self, *exc):
        self.stop()
        return False

    def stop(self, timeout_s=30):
        """SIGTERM, then wait; returns the exit status (the server exits 0 on SIGTERM)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
                raise RuntimeError(f"dschat serve did not stop within {timeout_s} s of SIGTERM")
        self.process.stdout.close()
        self._log.close()
        return self.process.returncode

    def log(self):
        return pathlib.Path(self.log_path).read_text(errors="replace")

    def get_json(self, path, headers=None):
        request = urllib.request.Request(self.url + path, headers=headers or {})
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())

    def rss_bytes(self):
        """The server's resident memory, from /proc (Linux)."""
        for line in pathlib.Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS in /proc status")
