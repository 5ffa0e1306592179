"""Software images (directory trees on the head) and their content revisions."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, ForeignKey, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from gpufleet.core.db import Base, UTCDateTime

# An image's state: only a `ready` image is synced, cloned or changed. `creating` and `changing`
# mark the one task working on it (two changes at once would record one revision for both).
IMAGE_STATES = ("creating", "ready", "changing")


class Image(Base):
    __tablename__ = "images"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    path: Mapped[str] = mapped_column(String(1024))  # under the images_dir setting
    # "debootstrap bookworm http://deb.debian.org/debian", "tarball /srv/x.tar", "clone of y"
    source: Mapped[str] = mapped_column(String(1024))
    state: Mapped[str] = mapped_column(String(16), default="creating")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    created_by: Mapped[str] = mapped_column(String(128))
    revision: Mapped[int] = mapped_column(Integer, default=0)  # 0 until the tree exists
    digest: Mapped[str | None] = mapped_column(String(64), default=None)  # of the current revision
    task_id: Mapped[int | None] = mapped_column(Integer, default=None)  # the task creating or changing it


class ImageRevision(Base):
    """One change of an image's content: what changed it, who, when, and the tree's digest after."""

    __tablename__ = "image_revisions"
    __table_args__ = (UniqueConstraint("image_id", "number"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    image_id: Mapped[int] = mapped_column(ForeignKey("images.id", ondelete="CASCADE"))
    number: Mapped[int] = mapped_column(Integer)
    digest: Mapped[str] = mapped_column(String(64))
    change: Mapped[str] = mapped_column(String(2048))  # "created by debootstrap ...", "installed curl jq"
    actor: Mapped[str] = mapped_column(String(128))
    at: Mapped[datetime] = mapped_column(UTCDateTime())
    files: Mapped[int] = mapped_column(Integer)  # entries in the tree (files, directories, links)
    bytes: Mapped[int] = mapped_column(BigInteger)  # sum of the regular files' sizes
    task_id: Mapped[int | None] = mapped_column(Integer, default=None)
