"""Regenerate the dashboard screenshots in docs/images/ from a real head with 1,000 simulated nodes.

Starts `gpufleet server` (SQLite in a fresh temp dir, an admin token from GPUFLEET_BOOTSTRAP_TOKEN) and
`gpufleet sim --nodes N` against it, waits until every node is up, creates a web user through the API,
injects three faults through `POST /api/v1/nodes/{name}/faults` (an Xid 79 on GPU 2 of one node, an
overheating GPU 5 on another, a third node crashing) so that the pages show red, and waits `--warmup`
seconds so that the fleet charts (one-minute roll-ups, written once a minute) have a few points. Then
Debian's Chromium (through Playwright, with the browser tests' flags) logs in through the login form
and takes full-page screenshots at 1440x900 of the overview, the node table, the GPU map and the
faulty node's page. Last, it writes a burn-in of every node and two maintenance campaigns straight into
the head's database (scripts/lifecycle_demo.py: illustrative figures, three nodes failing, one slow) and
takes the Burn-in page (one step's values across the fleet) and a stopped campaign's page:

    .venv/bin/python scripts/dashboard_screenshots.py                     # about 6 minutes
    .venv/bin/python scripts/dashboard_screenshots.py --nodes 64 --warmup 150 --out build/shots
    .venv/bin/python scripts/dashboard_screenshots.py --pages nodes,gpu-map    # only these two

Needs Chromium (`bash scripts/services/chromium.sh install`; GPUFLEET_CHROMIUM names another binary)
and the dashboard's front-end files (`make assets`). Everything it starts (the head, the simulator,
the browser) is stopped on exit, on Ctrl-C and on SIGTERM. Exit status 0 when every screenshot was
taken, 1 when something failed on the way (the head's and the simulator's log tails are printed),
2 when something it needs is missing. A page that does not answer 200 is skipped (exit status 1) and
the file already in docs/images is left as it was; for a 5xx the head's log tail is printed.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO, TYPE_CHECKING, Any

import httpx
from chromium_flags import CHROMIUM, CHROMIUM_ARGS  # scripts/, this file's directory
from lifecycle_demo import seed as seed_lifecycle

if TYPE_CHECKING:
    from playwright.sync_api import Page, Request

ROOT = Path(__file__).resolve().parents[1]
GPUFLEET = [sys.executable, "-m", "gpufleet.entry"]
VIEWPORT = {"width": 1440, "height": 900}
# (where in the fleet, as a share of it; the fault): sim007, sim042 and sim318 of 1,000. Spread out, so
# that the overview's red is not all in one corner.
FAULTS: tuple[tuple[float, dict[str, Any]], ...] = (
    (0.007, {"kind": "xid79", "gpu": 2}),
    (0.042, {"kind": "thermal", "gpu": 5}),
    (0.318, {"kind": "node-crash"}),
)


class Missing(Exception):
    """Something the script needs is not installed."""


class Failed(Exception):
    """The head, the simulator or the browser did not do what was expected."""


@dataclass
class Shot:
    name: str  # the file: docs/images/<name>.png
    path: str  # the dashboard URL path
    waits_for_charts: bool = False
    # Needs the burn-in results and campaigns of lifecycle_demo, written before the first such shot (after
    # the others: the demo holds three nodes out of service, which the overview would show).
    lifecycle: bool = False


@dataclass
class Started:
    """Every process this script started, stopped in reverse order by `stop`."""

    procs: list[tuple[str, subprocess.Popen[bytes], Path]] = field(default_factory=list)
    logs: list[IO[bytes]] = field(default_factory=list)

    def start(self, label: str, argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
        out = log.open("ab")
        self.logs.append(out)
        # A session of its own: a Ctrl-C reaches this script alone, which then stops the head after the
        # simulator, instead of both dying at once with a screenful of tracebacks.
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append((label, proc, log))
        return proc

    def check_alive(self) -> None:
        for label, proc, log in self.procs:
            if proc.poll() is not None:
                raise Failed(f"the {label} exited with status {proc.returncode}:\n{tail(log)}")

    def stop(self) -> None:
        for _label, proc, _log in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for _label, proc, _log in reversed(self.procs):
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for out in self.logs:
            out.close()

    def log_tails(self) -> str:
        return "\n".join(f"--- {label} ({log.name}) ---\n{tail(log)}" for label, _proc, log in self.procs)


def tail(log: Path, lines: int = 25) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def node_names(count: int, prefix: str = "sim") -> list[str]:
    """The simulator's names (gpufleet.sim.runner.node_names, without importing the simulator)."""
    width = max(3, len(str(count)))
    return [f"{prefix}{i:0{width}d}" for i in range(1, count + 1)]


def wait_until(what: str, ready: Callable[[], bool], timeout: float, started: Started, every: float = 1.0) -> float:
    """Poll `ready` until true; seconds taken. Raises Failed on timeout or when a started process exits."""
    begun = time.monotonic()
    while time.monotonic() - begun < timeout:
        started.check_alive()
        with contextlib.suppress(httpx.HTTPError):
            if ready():
                return time.monotonic() - begun
        time.sleep(every)
    raise Failed(f"{what}: not within {timeout:.0f} s")


def preflight() -> None:
    """Chromium, Playwright and the front-end files, or a message saying how to get them. Raises Missing."""
    if not CHROMIUM.is_file():
        raise Missing(f"no Chromium at {CHROMIUM}: install it with `bash scripts/services/chromium.sh install`")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        raise Missing("Playwright for Python is not installed: `.venv/bin/pip install -e '.[dev]'`") from None
    from gpufleet.api.templates import missing_vendor_files

    missing = missing_vendor_files()
    if missing:
        raise Missing(f"the dashboard's front-end files are missing ({', '.join(missing)}): run `make assets`")


def environment(tmp: Path, token: str) -> dict[str, str]:
    """This environment without gpufleet's own settings (never the developer's login or database)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_")}
    env["GPUFLEET_CLIENT_CONFIG"] = str(tmp / "client.toml")
    env["GPUFLEET_LOG_LEVEL"] = "WARNING"
    env["GPUFLEET_BOOTSTRAP_TOKEN"] = token
    return env


def log_in(page: Page, url: str, user: str, password: str) -> None:
    from playwright.sync_api import expect

    page.goto(url + "/login")
    page.get_by_label("User name").fill(user)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Log in").click()
    expect(page).to_have_url(url + "/")


def take(page: Page, url: str, shot: Shot, out: Path, max_height: int) -> str:
    """Load the page, let it settle, save the screenshot; a line for the report."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    response = page.goto(url + shot.path)
    if response is None or response.status != 200:
        status = response.status if response is not None else "no response"
        return f"{shot.name}: SKIPPED, {shot.path} answered {status}"
    with contextlib.suppress(PlaywrightTimeout):  # htmx polls every 5 s: idle between polls, usually
        page.wait_for_load_state("networkidle", timeout=10_000)
    if shot.waits_for_charts:
        # charts.js replaces each [data-chart] element's content with a uPlot chart, or with a message.
        try:
            page.wait_for_function(
                "() => [...document.querySelectorAll('[data-chart]')]"
                ".every(e => e.querySelector('.uplot, .chart-message'))",
                timeout=15_000,
            )
        except PlaywrightTimeout:
            print(f"  {shot.name}: the charts did not finish drawing in 15 s; taking it anyway")
    page.wait_for_timeout(500)  # fonts, the last layout pass
    height = int(page.evaluate("document.documentElement.scrollHeight"))
    path = out / f"{shot.name}.png"
    clip = None
    if height > max_height:
        clip = {"x": 0, "y": 0, "width": VIEWPORT["width"], "height": max_height}
    page.screenshot(path=str(path), full_page=True, clip=clip)  # type: ignore[arg-type]
    messages = page.locator(".chart-message").all_inner_texts()
    note = f"; chart messages: {messages}" if messages else ""
    cut = f", cut at {max_height} px" if clip else ""
    return f"{shot.name}: {path} (page {height} px high{cut}, {path.stat().st_size / 1024:,.0f} KiB){note}"


def slow(request: Request, note: Callable[[str], None], limit_ms: float = 2000.0) -> None:
    """Note a request that took longer than `limit_ms` (a live refresh slower than its 5 s period is
    aborted by the next one: hx-sync="this:replace")."""
    took = request.timing.get("responseEnd", -1.0)
    if took > limit_ms:
        note(f"slow: {request.method} {request.url} took {took / 1000:.1f} s")


@contextlib.contextmanager
def stopped_on_signals() -> Iterator[None]:
    """SIGTERM and SIGHUP end the script like Ctrl-C does, so that the `finally` clauses run."""

    def interrupt(signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    previous = {s: signal.signal(s, interrupt) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


@dataclass
class Cluster:
    url: str
    api: httpx.Client  # the admin token's
    names: list[str]
    password: str  # the web user's
    database_url: str  # the head's SQLite database


def start_cluster(args: argparse.Namespace, tmp: Path, started: Started) -> Cluster:
    """The head, the web user and every simulated node up. Raises Failed."""
    token = "gfa_screenshots_" + secrets.token_hex(16)
    env = environment(tmp, token)
    url = f"http://127.0.0.1:{free_port() if args.port == 0 else args.port}"
    print(f"starting the head at {url} (data in {tmp})")
    head = [*GPUFLEET, "server", "--data-dir", str(tmp / "head"), "--listen", url.removeprefix("http://")]
    started.start("head", head, env, tmp / "head.log")

    def healthy() -> bool:
        return httpx.get(url + "/healthz", timeout=2).status_code == 200

    wait_until("the head answering /healthz", healthy, 60, started, 0.2)
    api = httpx.Client(base_url=url + "/api/v1", headers={"Authorization": f"Bearer {token}"}, timeout=30)
    database_url = f"sqlite:///{tmp / 'head' / 'gpufleet.db'}"
    cluster = Cluster(url, api, node_names(args.nodes), secrets.token_urlsafe(16), database_url)
    made = api.post("/users", json={"username": args.user, "role": args.role, "password": cluster.password})
    if made.status_code != 201:
        raise Failed(f"could not create the web user {args.user}: {made.status_code} {made.text}")
    join = api.post("/tokens/join", json={"expires_in_s": 3600, "uses": args.nodes})
    if join.status_code != 201:
        raise Failed(f"could not create a join token: {join.status_code} {join.text}")

    print(f"starting {args.nodes} simulated nodes")
    sim = [*GPUFLEET, "sim", "--server", url, "--join-token", join.json()["token"], "--nodes", str(args.nodes)]
    started.start("simulator", [*sim, "--state-dir", str(tmp / "sim")], env, tmp / "sim.log")

    def all_up() -> bool:
        up = sum(1 for n in api.get("/nodes").json() if n["state"] == "up")
        print(f"\r  {up}/{args.nodes} nodes up", end="", flush=True)
        return bool(up == args.nodes)

    took = wait_until("every node up", all_up, max(120.0, args.nodes * 0.2), started, 2.0)
    print(f"\n  all up in {took:.0f} s")
    return cluster


def break_and_wait(args: argparse.Namespace, cluster: Cluster, started: Started) -> list[str]:
    """Inject `FAULTS`, wait `--warmup` seconds, say what the head made of them. Returns the faulty nodes."""
    api, faulty = cluster.api, list[str]()
    for share, fault in FAULTS:
        index = max(0, round(share * len(cluster.names)) - 1)
        while cluster.names[index % len(cluster.names)] in faulty and len(faulty) < len(cluster.names):
            index += 1  # a small fleet: one fault a node
        name = cluster.names[index % len(cluster.names)]
        answer = api.post(f"/nodes/{name}/faults", json=fault)
        if answer.status_code != 200 or not answer.json().get("ok"):
            raise Failed(f"fault {fault} on {name}: {answer.status_code} {answer.text}")
        faulty.append(name)
        print(f"  {name}: {answer.json()['message']}")
    print(f"warming up for {args.warmup} s (the fleet charts need a few one-minute roll-ups)")
    end = time.monotonic() + args.warmup
    while time.monotonic() < end:
        started.check_alive()
        time.sleep(min(10.0, max(0.0, end - time.monotonic())))
        print(f"\r  {max(0.0, end - time.monotonic()):4.0f} s left", end="", flush=True)
    print()
    chart = api.get("/fleet/metrics", params={"metric": "gpu_util", "since": "1h"}).json()
    print(f"  the fleet utilization chart has {len(chart['t'])} point(s)")
    names = ",".join(dict.fromkeys(faulty))
    for verdict in api.get("/health", params={"names": names}).json():
        print(f"  {verdict['node']}: {verdict['state']}, {verdict['health']}: {'; '.join(verdict['reasons'])}")
    return faulty


def all_shots(node: str) -> list[Shot]:
    """Every screenshot: docs/images/<name>.png of the page at <path>."""
    return [
        Shot("overview", "/", waits_for_charts=True),
        Shot("nodes", "/nodes?sort=health"),
        # By temperature: simulated GPUs idle at 0 % until jobs run on them, but their temperatures vary.
        Shot("gpu-map", "/gpus?color=temp"),
        Shot("node-detail", f"/nodes/{node}", waits_for_charts=True),
        Shot("burn-in", "/burn-in?step=gemm", lifecycle=True),
        Shot("maintenance", "/maintenance/image-r3", lifecycle=True),
    ]


def write_lifecycle(cluster: Cluster) -> None:
    """lifecycle_demo's burn-in of every node and its campaigns, into the running head's database (SQLite
    in WAL mode: the head reads on while this writes)."""
    from gpufleet.core.db import make_engine, make_session_factory, transaction

    engine = make_engine(cluster.database_url)
    try:
        with transaction(make_session_factory(engine)) as session:
            seeded = seed_lifecycle(session, cluster.names)
    finally:
        engine.dispose()
    print(f"  burn-in written for {len(seeded.runs)} nodes; held: {', '.join(seeded.held)}; slow: {seeded.slow}")


def screenshots(args: argparse.Namespace, cluster: Cluster, faulty: list[str], head_log: Path) -> list[str]:
    """Log Chromium in through the form and take every screenshot. Returns the report's lines."""
    from playwright.sync_api import sync_playwright

    shots = [s for s in all_shots(faulty[0]) if s.name in args.pages]
    args.out.mkdir(parents=True, exist_ok=True)
    report: list[str] = []
    console: list[str] = []
    print(f"taking screenshots as {args.user} ({args.role})")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(viewport=VIEWPORT)  # type: ignore[arg-type]
            context.set_default_timeout(30_000)
            page = context.new_page()
            shot_started = [time.monotonic()]

            def note(text: str) -> None:
                console.append(f"{text} (at {page.url}, {time.monotonic() - shot_started[0]:.1f} s in)")

            page.on("console", lambda m: note(f"{m.type}: {m.text}") if m.type == "error" else None)
            page.on("pageerror", lambda exc: note(f"page error: {exc}"))
            page.on("requestfailed", lambda r: note(f"request failed: {r.method} {r.url}: {r.failure}"))
            page.on("requestfinished", lambda r: slow(r, note))
            log_in(page, cluster.url, args.user, cluster.password)
            seeded = False
            for shot in shots:
                if shot.lifecycle and not seeded:
                    write_lifecycle(cluster)
                    seeded = True
                console.clear()
                shot_started[0] = time.monotonic()
                line = take(page, cluster.url, shot, args.out, args.max_height)
                if "answered 5" in line:  # the head failed: its traceback says why
                    line += "".join(f"\n      | {text}" for text in tail(head_log, 15).splitlines())
                if console:
                    line += "".join(f"\n      {n}" for n in console)
                report.append(line)
                print(f"  {line}")
        finally:
            browser.close()
    return report


def run(args: argparse.Namespace, tmp: Path, started: Started) -> list[str]:
    cluster = start_cluster(args, tmp, started)
    try:
        faulty = break_and_wait(args, cluster, started)
        return screenshots(args, cluster, faulty, tmp / "head.log")
    finally:
        cluster.api.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000, help="simulated nodes (8 H200 GPUs each)")
    parser.add_argument("--warmup", type=int, default=240, help="seconds between the faults and the screenshots")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "images", help="where the PNGs go")
    parser.add_argument("--user", default="alice", help="the web user the browser logs in as")
    parser.add_argument("--role", default="admin", help="that user's role (admin sees every page)")
    parser.add_argument("--port", type=int, default=0, help="the head's port on 127.0.0.1 (0: a free one)")
    parser.add_argument("--max-height", type=int, default=3000, help="cut a full-page screenshot taller than this (px)")
    names = [s.name for s in all_shots("NODE")]
    parser.add_argument(
        "--pages",
        default=",".join(names),
        help=f"which screenshots to take, comma-separated (default: {','.join(names)})",
    )
    args = parser.parse_args()
    args.pages = [p.strip() for p in args.pages.split(",") if p.strip()]
    unknown = sorted(set(args.pages) - set(names))
    if unknown or not args.pages:
        parser.error(f"--pages takes some of {', '.join(names)}, not {', '.join(unknown) or 'nothing'}")
    if args.nodes < 1:
        parser.error("--nodes must be at least 1")
    if args.nodes < 8 and any(s.lifecycle for s in all_shots("NODE") if s.name in args.pages):
        parser.error("the burn-in and maintenance screenshots need --nodes 8 or more")
    try:
        preflight()
    except Missing as exc:
        print(f"dashboard_screenshots: {exc}", file=sys.stderr)
        return 2
    started = Started()
    with stopped_on_signals(), tempfile.TemporaryDirectory(prefix="gpufleet-screenshots-") as tmp:
        try:
            report = run(args, Path(tmp), started)
        except KeyboardInterrupt:
            print("\ninterrupted: stopping the simulator and the head", file=sys.stderr)
            return 130
        except (Failed, httpx.HTTPError) as exc:
            print(f"\ndashboard_screenshots: {exc}\n{started.log_tails()}", file=sys.stderr)
            return 1
        finally:
            started.stop()
    print("done:")
    for line in report:
        print(f"  {line}")
    return 1 if any("SKIPPED" in line for line in report) else 0


if __name__ == "__main__":
    sys.exit(main())
