#!/usr/bin/env python3
"""Load benchmark for `dschat serve`: N concurrent clients, each in a loop sending a streaming
/v1/chat/completions request and reading its SSE to `data: [DONE]`, for a fixed time.

    .venv/bin/python benchmarks/serve_load.py                       # starts the tiny bundled model,
                                                                    # runs 64 clients, then 1 client
    .venv/bin/python benchmarks/serve_load.py --url http://127.0.0.1:8000 --clients 64 --seconds 30
    .venv/bin/python benchmarks/serve_load.py --model opt=DIR --server-arg=--max-batch-rows=16 --json out.json

Per request: latency (request sent to [DONE]), time to first token (first non-empty content delta),
completion tokens (usage from stream_options.include_usage; the count of content deltas if absent),
and the outcome (200 complete, or the HTTP status / connection error). Beside the clients: a
/health poller every 250 ms (its latency and failures) and the server's RSS every second (/proc when
this script started the server, else /health's rss_bytes). The client is one asyncio process with
raw sockets (HTTP/1.1, one connection per request); its CPU use is reported (client_cpu_frac: a
value near 1.0 means the client, not the server, may be the bottleneck), and listen_overflows, the
SYNs this network namespace dropped during the run because a listen queue was full (each costs its
client a ~1 s SYN retransmission: it shows up in latency, TTFT and /health latency), and
cpu_steal_frac, the share of the machine's CPU time the hypervisor took during the run (/proc/stat
steal; on a shared VM, runs with a large share are not comparable).

The load runner here (run_load, HealthPoller) and the client in serve_client.py (stream_chat,
http_call) are reused by tests/serve/load_test.py.
"""
import argparse
import asyncio
import datetime
import json
import os
import pathlib
import sys
import threading
import time
from dataclasses import dataclass

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from serve_client import DEFAULT_PROMPT, StreamResult, chat_payload, get_json, http_call, stream_chat  # noqa: E402,F401

SOURCE_DIR = pathlib.Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------------------------
# Side measurements: /health every 250 ms, the server's RSS every second

def proc_rss_bytes(pid):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def listen_overflows():
    """TcpExt ListenOverflows of this network namespace (SYNs dropped because a listen queue was
    full; the client then waits ~1 s for its SYN's retransmission), or None where unreadable."""
    try:
        lines = pathlib.Path("/proc/net/netstat").read_text().splitlines()
    except OSError:
        return None
    for names, values in zip(lines[::2], lines[1::2]):
        if names.startswith("TcpExt:"):
            table = dict(zip(names.split()[1:], values.split()[1:]))
            return int(table["ListenOverflows"]) if "ListenOverflows" in table else None
    return None


def cpu_times():
    """The machine's /proc/stat cpu line: (steal jiffies, all jiffies), or None."""
    try:
        values = [int(v) for v in pathlib.Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    except (OSError, ValueError):
        return None
    return values[7], sum(values)


def proc_cpu_s(pid):
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


class HealthPoller:
    """A thread: GET /health every `interval_s` (latency, failures, the last answer) and the
    server's RSS every `rss_interval_s` (/proc/pid when pid is known, else /health's rss_bytes)."""

    def __init__(self, base, pid=None, interval_s=0.25, rss_interval_s=1.0, timeout_s=5.0):
        self.base, self.pid, self.interval_s, self.rss_interval_s, self.timeout_s = \
            base, pid, interval_s, rss_interval_s, timeout_s
        self.latencies, self.failures, self.rss, self.last = [], [], [], None
        self.max_queued = self.max_running = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=self.timeout_s + 2)
        return False

    def _loop(self):
        next_rss = time.monotonic()
        while not self._stop.is_set():
            t0 = time.monotonic()
            try:
                status, _, body = http_call(self.base, "GET", "/health", timeout=self.timeout_s)
                elapsed = time.monotonic() - t0
                self.latencies.append(elapsed)
                health = json.loads(body) if status == 200 else None
                if status != 200 or not isinstance(health, dict) or health.get("status") != "ok":
                    self.failures.append(f"t={t0:.2f} status {status}: {body[:200]!r}")
                else:
                    self.last = health
                    self.max_queued = max(self.max_queued, health.get("queued", 0))
                    self.max_running = max(self.max_running, health.get("running", 0))
            except Exception as error:  # noqa: BLE001 (every failure is a finding)
                self.latencies.append(time.monotonic() - t0)
                self.failures.append(f"t={t0:.2f} {type(error).__name__}: {error}")
            now = time.monotonic()
            if now >= next_rss:
                next_rss = now + self.rss_interval_s
                try:
                    value = proc_rss_bytes(self.pid) if self.pid else (self.last or {}).get("rss_bytes")
                    if value:
                        self.rss.append(value)
                except (OSError, RuntimeError):
                    pass
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - t0)))


# ----------------------------------------------------------------------------------------------
# A timed run

def percentile(values, q):
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100.0
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass
class RunResult:
    clients: int
    seconds: float
    wall_s: float
    results: list                   # StreamResult, every request sent
    health_latencies: list
    health_failures: list
    rss: list
    client_cpu_s: float
    server_cpu_s: float = None
    max_queued: int = 0
    max_running: int = 0
    listen_overflows: int = None
    cpu_steal_frac: float = None

    def counts(self):
        out = {}
        for result in self.results:
            out[result.kind] = out.get(result.kind, 0) + 1
        return out

    def summary(self):
        good = [r for r in self.results if r.ok]
        mib = 1024.0 * 1024.0
        return {
            "clients": self.clients, "seconds": self.seconds, "wall_s": round(self.wall_s, 3),
            "requests": len(self.results), "completed": len(good),
            "requests_per_s": round(len(good) / self.wall_s, 3),
            "completion_tokens": sum(r.completion_tokens for r in good),
            "tokens_per_s": round(sum(r.completion_tokens for r in good) / self.wall_s, 2),
            "latency_p50_s": _round(percentile([r.latency_s for r in good], 50)),
            "latency_p99_s": _round(percentile([r.latency_s for r in good], 99)),
            "ttft_p50_s": _round(percentile([r.ttft_s for r in good if r.ttft_s is not None], 50)),
            "ttft_p99_s": _round(percentile([r.ttft_s for r in good if r.ttft_s is not None], 99)),
            "errors": {k: v for k, v in self.counts().items() if k != "200"},
            "rss_first_mib": _round(self.rss[0] / mib, 1) if self.rss else None,
            "rss_max_mib": _round(max(self.rss) / mib, 1) if self.rss else None,
            "rss_last_mib": _round(self.rss[-1] / mib, 1) if self.rss else None,
            "health_polls": len(self.health_latencies),
            "health_max_latency_s": _round(max(self.health_latencies) if self.health_latencies else None),
            "health_failures": self.health_failures[:10],
            "max_queued": self.max_queued, "max_running": self.max_running,
            "listen_overflows": self.listen_overflows,
            "cpu_steal_frac": self.cpu_steal_frac,
            "client_cpu_frac": round(self.client_cpu_s / self.wall_s, 3),
            "server_cpu_frac": None if self.server_cpu_s is None else round(self.server_cpu_s / self.wall_s, 3),
            "problems": sorted({p for r in self.results for p in r.problems})[:10],
        }


def _round(value, digits=4):
    return None if value is None else round(value, digits)


async def run_load_async(base, payload, clients, seconds, pid=None, backoff_s=0.1, request_timeout_s=120.0):
    """`clients` concurrent loops of streaming requests for `seconds` (requests already sent
    finish); after a 429 or a connection failure a loop waits backoff_s before its next request."""
    results = []
    deadline = time.monotonic() + seconds

    async def client():
        while time.monotonic() < deadline:
            result = await stream_chat(base, payload, timeout=request_timeout_s)
            results.append(result)
            if result.status != 200:
                await asyncio.sleep(backoff_s)

    with HealthPoller(base, pid=pid) as poller:
        overflows0, times0 = listen_overflows(), cpu_times()
        cpu0, server_cpu0, t0 = time.process_time(), proc_cpu_s(pid) if pid else None, time.monotonic()
        await asyncio.gather(*(client() for _ in range(clients)))
        wall = time.monotonic() - t0
        cpu = time.process_time() - cpu0
        server_cpu = proc_cpu_s(pid) - server_cpu0 if pid else None
        time.sleep(0.3)  # one more /health poll and RSS sample after the load
        overflows1, times1 = listen_overflows(), cpu_times()
    steal = None
    if times0 and times1 and times1[1] > times0[1]:
        steal = round((times1[0] - times0[0]) / (times1[1] - times0[1]), 3)
    return RunResult(clients=clients, seconds=seconds, wall_s=wall, results=results,
                     health_latencies=poller.latencies, health_failures=poller.failures, rss=poller.rss,
                     client_cpu_s=cpu, server_cpu_s=server_cpu, max_queued=poller.max_queued,
                     max_running=poller.max_running,
                     listen_overflows=None if overflows0 is None or overflows1 is None else overflows1 - overflows0,
                     cpu_steal_frac=steal)


def run_load(base, payload, clients, seconds, pid=None, backoff_s=0.1, request_timeout_s=120.0):
    return asyncio.run(run_load_async(base, payload, clients, seconds, pid, backoff_s, request_timeout_s))


# ----------------------------------------------------------------------------------------------
# Report

TABLE_HEAD = ("| clients | requests/s | tokens/s | latency p50 | latency p99 | TTFT p50 | errors "
              "| RSS first / max / last | /health max latency | client CPU | CPU steal |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|")


def table_row(summary):
    def ms(value):
        return "—" if value is None else f"{value * 1000:.0f} ms"
    errors = ", ".join(f"{k}: {v}" for k, v in sorted(summary["errors"].items())) or "0"
    rss = " / ".join("—" if summary[k] is None else f"{summary[k]:.0f}"
                     for k in ("rss_first_mib", "rss_max_mib", "rss_last_mib")) + " MiB"
    return (f"| {summary['clients']} | {summary['requests_per_s']:.2f} | {summary['tokens_per_s']:.1f} "
            f"| {ms(summary['latency_p50_s'])} | {ms(summary['latency_p99_s'])} | {ms(summary['ttft_p50_s'])} "
            f"| {errors} | {rss} | {ms(summary['health_max_latency_s'])} | {summary['client_cpu_frac']:.2f} "
            f"| {'—' if summary['cpu_steal_frac'] is None else format(summary['cpu_steal_frac'], '.0%')} |")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="a running server (else one is started through tests/serve/serve_fixture.py)")
    parser.add_argument("--model", action="append",
                        help="NAME=DIR or DIR for the started server (repeatable; default: the bundled tiny OPT)")
    parser.add_argument("--server-arg", action="append", default=[],
                        help="an extra argument for the started server, e.g. --server-arg=--max-queue=8")
    parser.add_argument("--model-name", help="the model id to request (default: the first of /v1/models)")
    parser.add_argument("--clients", type=int, nargs="+", default=[64, 1], help="one run per value (default 64 1)")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--warmup-seconds", type=float, default=2.0, help="before each run, not measured")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--prompt", default=DEFAULT_PROMPT)
    parser.add_argument("--api-key", default=os.environ.get("DSCHAT_API_KEY"))
    parser.add_argument("--backoff-ms", type=float, default=100.0, help="a client's wait after a 429 or failure")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)

    server, base, pid = None, args.url, None
    if not base:
        sys.path.insert(0, str(SOURCE_DIR / "tests" / "serve"))
        from serve_fixture import ServedModels
        extra = list(args.server_arg) + (["--api-key", args.api_key] if args.api_key else [])
        server = ServedModels(models=args.model, extra_args=extra).__enter__()
        base, pid = server.url, server.process.pid
        print(f"started: {' '.join(server.command())} -> {base}", file=sys.stderr)
    try:
        headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else None
        model = args.model_name
        if not model:
            _, _, body = http_call(base, "GET", "/v1/models", headers=headers)
            model = json.loads(body)["data"][0]["id"]
        payload = chat_payload(model, args.prompt, args.max_tokens, args.temperature)
        runs = []
        for clients in args.clients:
            if args.warmup_seconds > 0:
                run_load(base, payload, clients, args.warmup_seconds, pid, args.backoff_ms / 1000)
            run = run_load(base, payload, clients, args.seconds, pid, args.backoff_ms / 1000)
            summary = run.summary()
            runs.append(summary)
            print(json.dumps(summary), file=sys.stderr)
            if summary["client_cpu_frac"] > 0.85:
                print(f"note: the client used {summary['client_cpu_frac']:.0%} of a core: it may be the bottleneck",
                      file=sys.stderr)
        print(TABLE_HEAD)
        for summary in runs:
            print(table_row(summary))
        if args.json:
            record = {"date": datetime.date.today().isoformat(), "url": base, "model": model,
                      "server_command": server.command() if server else None, "cpu_count": os.cpu_count(),
                      "payload": payload, "seconds": args.seconds, "warmup_seconds": args.warmup_seconds,
                      "runs": runs}
            pathlib.Path(args.json).write_text(json.dumps(record, indent=2) + "\n")
    finally:
        if server is not None:
            status = server.stop()
            if status != 0:
                print(f"server exited {status}; log tail:\n{server.log()[-3000:]}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
