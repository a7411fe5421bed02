"""Where alerts (and, for Prometheus, the metrics) go: the console, `alerts.jsonl` in the run directory,
a webhook and a Prometheus `/metrics` endpoint. None of them may stall training: file lines are small
appends, the webhook posts from its own thread, Prometheus serves from its own thread."""
from __future__ import annotations

import errno
import math
import queue
import socket
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from turbotrain.errors import UserError
from turbotrain.log import is_rank0, say
from turbotrain.rundir import strict_json


def console(alert: dict) -> None:
    """One line per alert; rank 0 through `say`, other ranks (their own GPU, their own hang) on stdout."""
    first = alert["message"].split("\n", 1)[0]
    line = f"alert {alert['rule']} at step {alert['step']}: {first}"
    if is_rank0():
        say(line)
    else:
        print(f"[turbotrain] rank {alert['rank']}: {line}", flush=True)


class JsonlFile:
    """Appends one JSON object per line; opened at the first line (a run without alerts has no file). Every
    rank appends its own alerts: O_APPEND keeps lines whole."""

    def __init__(self, path: Path):
        self.path, self.f, self.lock = path, None, threading.Lock()

    def write(self, obj: dict) -> None:
        from turbotrain.rundir import open_run_file

        with self.lock:  # the watchdog and webhook threads write too
            try:
                if self.f is None:
                    self.f = open_run_file(self.path, "a")
                self.f.write(strict_json(obj) + "\n")
                self.f.flush()
            except (OSError, UserError) as e:  # a full disk must not kill the run over an alert line
                print(f"[turbotrain] cannot write {self.path}: {e}", file=sys.stderr, flush=True)

    def close(self) -> None:
        with self.lock:
            if self.f is not None:
                try:  # a line the full disk refused stays buffered; it was said when written, not again here
                    self.f.close()
                except OSError:
                    pass
                self.f = None


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """urllib turns a POST answered by 301/302/303 into a GET without the body, which the new address answers 200:
    the alert would count as delivered though nobody received it. A redirect is an HTTPError instead."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


_OPENER = urllib.request.build_opener(_NoRedirect)


class Webhook:
    """POSTs each alert's JSON to `url` from a background thread, `retries` tries with a backoff and a
    `timeout_s` each. An alert that never gets a 2xx answer goes to `undelivered` (alerts_undelivered.jsonl)."""

    def __init__(self, url: str, timeout_s: float, retries: int, undelivered: JsonlFile):
        self.url, self.timeout_s, self.retries, self.undelivered = url, timeout_s, retries, undelivered
        self.q: queue.Queue = queue.Queue()
        self.sent = self.failed = 0
        self._busy: dict | None = None
        self._done = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="turbotrain-webhook", daemon=True)
        self._thread.start()

    def send(self, alert: dict) -> None:
        self.q.put(alert)  # never blocks: an unbounded queue of small dicts

    def _run(self) -> None:
        while (alert := self.q.get()) is not None:
            self._busy = alert
            error = self._post(alert)
            with self._done:
                if self._busy is not None:  # not already given up by close()
                    self._settle(alert, error)
                self._busy = None
                self._done.notify_all()

    def _post(self, alert: dict) -> str | None:
        body, error = strict_json(alert).encode(), None
        for attempt in range(self.retries):
            try:  # whatever one POST raises (http.client's own errors too) is that alert's failure, not the thread's
                req = urllib.request.Request(self.url, data=body, headers={"Content-Type": "application/json"})
                with _OPENER.open(req, timeout=self.timeout_s) as r:
                    if 200 <= r.status < 300:
                        return None
                    error = f"HTTP {r.status}"
            except urllib.error.HTTPError as e:
                error = f"HTTP {e.code} {e.reason}"
                if 300 <= e.code < 400:
                    to = urllib.parse.urljoin(self.url, e.headers.get("Location", ""))
                    error += f", redirected to {to}: set monitor.webhook_url to that URL (a POST that follows a " \
                             "redirect loses its body)"
            except Exception as e:
                error = str(getattr(e, "reason", e)) or type(e).__name__
            if attempt + 1 < self.retries:
                time.sleep(min(0.2 * 2 ** attempt, 2.0))
        return error

    def _settle(self, alert: dict, error: str | None) -> None:
        if error is None:
            self.sent += 1
            return
        self.failed += 1
        self.undelivered.write({**alert, "error": error, "url": self.url})
        if self.failed == 1:
            say(f"monitor: webhook {self.url} did not take an alert ({error}); undelivered alerts go to "
                f"alerts_undelivered.jsonl")

    def close(self, wait_s: float) -> None:
        """Wait up to `wait_s` for the queue to drain; what is left is recorded as undelivered."""
        deadline = time.monotonic() + wait_s
        with self._done:
            while (self._busy is not None or not self.q.empty()) and time.monotonic() < deadline:
                self._done.wait(0.05)
            left = [self._busy] if self._busy is not None else []
            self._busy = None
            while not self.q.empty():
                left.append(self.q.get_nowait())
        for alert in left:
            self._settle(alert, "not delivered before the run ended")
        self.q.put(None)
        self.undelivered.close()


def _serve_error(e: OSError | UnicodeError, addr: str, port: int) -> UserError:
    # an address the host cannot resolve or bind (gaierror, EADDRNOTAVAIL) is the address's fault, as is a name
    # that is no host name at all (an empty or 64+ character label: the idna codec's UnicodeError); a port in use
    # or privileged, the port's
    bad_addr = isinstance(e, (socket.gaierror, UnicodeError)) or getattr(e, "errno", None) == errno.EADDRNOTAVAIL
    fix = ("set monitor.prometheus_addr to an address of this host (\"0.0.0.0\": all of them, "
           "\"127.0.0.1\": this host only)" if bad_addr else "choose a free port (>= 1024 unless root)")
    return UserError(f"monitor.{'prometheus_addr' if bad_addr else 'prometheus_port'}: cannot serve /metrics "
                     f"on {addr}:{port} ({getattr(e, 'strerror', None) or e}); {fix}")


def _port_in_range(port: int) -> None:
    """A rank's port past 65535: monitor.prometheus_port itself is checked at the config load, but with
    monitor.prometheus_per_rank each rank adds its LOCAL_RANK, and bind() would raise an OverflowError."""
    if not 0 < port <= 65535:
        raise UserError(f"monitor.prometheus_port: this rank's /metrics port {port} (prometheus_port + LOCAL_RANK, "
                        f"monitor.prometheus_per_rank) is past 65535; set monitor.prometheus_port so that it plus "
                        f"the ranks per node stays within 1024-65535")


def check_port(port: int, addr: str) -> None:
    """Bind addr:port and let it go again: a port in use or an address not of this host is refused before the
    run directory (or an earlier run in it) is touched; the server itself starts with the monitor."""
    _port_in_range(port)
    try:
        family, _, _, _, sockaddr = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM,
                                                       flags=socket.AI_PASSIVE)[0]
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the HTTP server's own socket
            s.bind(sockaddr)
    except (OSError, UnicodeError) as e:
        raise _serve_error(e, addr, port) from None


class Prometheus:
    """A `/metrics` endpoint (prometheus-client, its own registry and thread): the last log step's metrics as
    gauges `turbotrain_<key>` and the alerts as counters, labelled by rank."""

    GAUGES = ("step", "loss", "val_loss", "lr", "grad_norm", "samples_per_s", "tokens_per_s", "step_ms",
              "data_wait_pct", "mfu", "peak_mem_gib", "gpu_util_pct", "gpu_temp_c", "gpu_mem_used_gib",
              "gpu_mem_pct", "sync_ms", "rank_time_ratio")

    def __init__(self, port: int, addr: str, rank: int):
        try:
            import prometheus_client as pc
        except ImportError:
            raise UserError("monitor.prometheus_port is set but prometheus-client is not installed: "
                            "pip install 'turbotrain[monitor]' (or set monitor.prometheus_port=0)") from None
        _port_in_range(port)
        self.registry, self.rank = pc.CollectorRegistry(), str(rank)
        self.gauges = {k: pc.Gauge(f"turbotrain_{k}", f"{k} at the last log step", ["rank"], registry=self.registry)
                       for k in self.GAUGES}
        self.alerts = pc.Counter("turbotrain_alerts", "alerts fired (repeats within monitor.alert_repeat_s too)",
                                 ["rank", "rule"], registry=self.registry)
        try:
            self.server, self.thread = pc.start_http_server(port, addr=addr, registry=self.registry)
        except (OSError, UnicodeError) as e:
            raise _serve_error(e, addr, port) from None
        say(f"monitor: Prometheus metrics on http://{addr}:{port}/metrics")

    def update(self, row: dict) -> None:
        for k, g in self.gauges.items():
            v = row.get(k)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                g.labels(rank=self.rank).set(v)
            elif v is None and k in row:  # logged as null (non-finite): the gauge must not keep its old number
                g.labels(rank=self.rank).set(math.nan)

    def count(self, rule: str) -> None:
        self.alerts.labels(rank=self.rank, rule=rule).inc()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
