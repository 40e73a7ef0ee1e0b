"""Fixtures for the Python package's tests: ordo's C++ programs, started by the test on
loopback and stopped by PID. ORDO_BUILD is the build directory (tests/meson.build sets it)."""
import os
import pathlib
import signal
import subprocess

import pytest

BUILD = pathlib.Path(os.environ.get("ORDO_BUILD",
                                    pathlib.Path(__file__).resolve().parents[2] / "build"))


class Child:
    """A program that prints "listening on URL" lines first; killed by PID at the end."""

    def __init__(self, args, listens=1):
        self.proc = subprocess.Popen([str(a) for a in args], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        self.urls = []
        while len(self.urls) < listens:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"{args[0]} ended before listening (status "
                                   f"{self.proc.wait(timeout=10)})")
            if line.startswith("listening on "):
                self.urls.append(line.split()[-1])
        self.url = self.urls[0]

    @property
    def pid(self):
        return self.proc.pid

    def kill(self, sig=signal.SIGKILL):
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)
        self.proc.wait(timeout=30)

    def stop(self):
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()
        for f in (self.proc.stdin, self.proc.stdout):
            if f:
                f.close()


def cut_proxy(to):
    """ordo-cut-proxy to `to`: it resets each connection after 3-30 kB (many cuts in a run)."""
    return Child([BUILD / "tests" / "ordo-cut-proxy", "--to", to, 3000, 30000])


def stop_cut_proxy(proxy) -> int:
    """Stops a cut_proxy (its stdin closed) and returns how many connections it cut."""
    proxy.proc.stdin.close()
    out = proxy.proc.stdout.read()
    proxy.proc.stdout.close()
    proxy.proc.wait(timeout=30)
    return int(out.split()[-1])


def inc_server(*extra, listens=None):
    urls = [a for a in extra if "://" in str(a)]
    return Child([BUILD / "examples" / "ordo-inc-server", *extra],
                 listens=listens or max(1, len(urls)))


@pytest.fixture
def cpp_server(tmp_path):
    """ordo-inc-server (inc, add, total, sleep_ms, fail, echo, count_to, square_batch,
    count_batch) on tcp and unix."""
    s = inc_server("--listen", "tcp://127.0.0.1:0", "--listen", f"unix://{tmp_path}/s.sock")
    yield s
    s.stop()
