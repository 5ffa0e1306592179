"""The settings for software images and image sync (provisioning.images, provisioning.sync).

Kept apart from `core.config` like the directory's, the network's and the storage's; `Settings` inherits
these fields, so they are set like any other (`image_import_dirs = ["/srv/tarballs"]` in the config file,
GPUFLEET_IMAGE_IMPORT_DIRS in the environment).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings


class ImageSettings(BaseSettings):
    images_dir: Path | None = Field(None, description="where the head keeps software images; None: data_dir/images")
    image_mirror: str = Field("http://deb.debian.org/debian", description="Debian mirror debootstrap uses by default")
    image_ubuntu_mirror: str = Field(
        "http://archive.ubuntu.com/ubuntu", description="mirror debootstrap uses for Ubuntu releases by default"
    )
    image_command_timeout_s: float = Field(
        3600.0, gt=0, le=86400, description="how long debootstrap, tar, cp or apt may run on an image"
    )
    image_allowed_mirrors: list[str] = Field(
        default_factory=lambda: [
            "http://deb.debian.org/debian",
            "https://deb.debian.org/debian",
            "http://archive.ubuntu.com/ubuntu",
            "https://archive.ubuntu.com/ubuntu",
            "http://ports.ubuntu.com/ubuntu-ports",
            "https://ports.ubuntu.com/ubuntu-ports",
        ],
        description="package mirrors an image create may name (their maintainer scripts run as root on the head)",
    )
    image_import_dirs: list[Path] = Field(
        default_factory=list,
        description="directories on the head an image create may import a tarball from; empty: tarballs are refused",
    )
    image_sync_limit: int = Field(8, ge=1, le=1000, description="nodes an image sync writes to at once")
    image_sync_timeout_s: float = Field(3600.0, gt=0, le=86400, description="how long one node's rsync may run")
    image_sync_local_root: Path | None = Field(
        None, description="the directory local sync targets must lie under; None: local targets are refused"
    )
    image_drift_timeout_s: float = Field(
        120.0, gt=0, le=600, description="how long a drift report's rsync may run (it runs in the request)"
    )
    image_sync_excludes: list[str] = Field(
        default_factory=list, description="rsync patterns no image sync touches, beyond the built-in ones"
    )
    image_sync_ssh_key: Path | None = Field(None, description="private key ssh uses for image sync; None: ssh's own")
    image_sync_ssh_port: int = Field(22, ge=1, le=65535, description="port of the nodes' sshd for image sync")
    image_sync_ssh_options: list[str] = Field(
        default_factory=lambda: ["BatchMode=yes", "StrictHostKeyChecking=accept-new"],
        description="ssh -o options for image sync (KEY=VALUE)",
    )
