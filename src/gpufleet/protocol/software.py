"""What an agent reports about the software on its node: packages, drivers, libraries, firmware.

Sent on joining and again whenever `digest` changes. Limits on every field keep a malformed or hostile
payload from growing the database, as in protocol.inventory: the head rejects anything outside them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

MAX_PACKAGES = 20_000
MAX_NOTES = 64
MAX_SOFTWARE_BYTES = 8 * 1024 * 1024  # the head's limit on one report's body (20,000 long entries fit)

Ecosystem = Annotated[str, StringConstraints(min_length=1, max_length=64)]
Name = Annotated[str, StringConstraints(min_length=1, max_length=256)]
Version = Annotated[str, StringConstraints(min_length=1, max_length=256)]
ShortText = Annotated[str, StringConstraints(max_length=256)]
Location = Annotated[str, StringConstraints(max_length=1024)]
Digest = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]


class SoftwarePackage(BaseModel):
    """One installed package, driver, library or firmware (assets.records.Installed on the wire)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ecosystem: Ecosystem  # Debian, Ubuntu, Rocky Linux, PyPI, NVIDIA, firmware, Linux, container-image
    name: Name
    version: Version
    # The source package advisories may name instead: Debian/Ubuntu's (glibc for libc6), the source RPM's.
    source_name: Name | None = None
    source_version: Version | None = None
    arch: ShortText | None = None
    location: Location | None = None  # a Python environment, a GPU, an HCA, an image id


def package_digest(packages: Iterable[SoftwarePackage]) -> str:
    """sha256 of the packages in a canonical order: equal for equal sets, whatever order they came in."""
    rows = ([p.ecosystem, p.name, p.version, p.source_name, p.source_version, p.arch, p.location] for p in packages)
    # Sorted as JSON text: rows holding None cannot be sorted as tuples, and the text is what is hashed.
    canonical = sorted(json.dumps(row, ensure_ascii=True, separators=(",", ":")) for row in rows)
    return hashlib.sha256("\n".join(canonical).encode()).hexdigest()


class SoftwareInventory(BaseModel):
    """Everything the agent found installed, and what it could not look at (`notes`).

    `truncated` says the node has more than MAX_PACKAGES and some were left out (distribution and
    Python packages first, never the driver or firmware).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["software"] = "software"
    distro_ecosystem: Ecosystem | None = None  # "Ubuntu"; None where /etc/os-release names none gpufleet knows
    distro_release: ShortText | None = None  # "24.04", "9"
    kernel: ShortText | None = None  # uname -r
    packages: list[SoftwarePackage] = Field(default_factory=list, max_length=MAX_PACKAGES)
    digest: Digest
    truncated: bool = False
    notes: list[ShortText] = Field(default_factory=list, max_length=MAX_NOTES)
