"""How gpufleet's tooling launches Debian's Chromium: the browser tests (tests/browser) and the
screenshot script (scripts/dashboard_screenshots.py) share this, so both run the same browser alike.

`CHROMIUM` is the binary (`GPUFLEET_CHROMIUM` names another); the flags keep Chromium headless and off
a network it cannot reach (no sync, component updates or background requests), and out of /dev/shm,
which is small in containers.
"""

from __future__ import annotations

import os
from pathlib import Path

CHROMIUM = Path(os.environ.get("GPUFLEET_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]
