"""An image's packages reach the CVE report: an image imported with a vulnerable glibc is listed with
the problem before any node runs it, its next revision with the fix drops it, and removing the image
forgets it."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker

from gpufleet.assets import report, store
from gpufleet.assets.evaluate import Evaluator
from gpufleet.core.clock import FakeClock
from gpufleet.core.db import transaction
from gpufleet.provisioning import images
from gpufleet.provisioning.images import ImageConfig
from tests.assets.test_evaluate import GLIBC, REQUESTS
from tests.provisioning.images_helpers import ACTOR, import_tarball, make_tree, sqlite_sessions, tarball

__all__ = ["sqlite_sessions"]

STATUS = """Package: libc6
Status: install ok installed
Architecture: amd64
Source: glibc
Version: {version}

Package: bash
Status: install ok installed
Architecture: amd64
Version: 5.2.15-2+b2
"""


def test_an_images_packages_are_in_the_report_until_a_revision_fixes_them(
    sqlite_sessions: sessionmaker[Session], clock: FakeClock, tmp_path: Path
) -> None:
    tree = make_tree(tmp_path / "tree")
    (tree / "etc" / "os-release").write_text('PRETTY_NAME="Debian GNU/Linux 12"\nID=debian\nVERSION_ID="12"\n')
    status = tree / "var" / "lib" / "dpkg" / "status"
    status.parent.mkdir(parents=True)
    status.write_text(STATUS.format(version="2.36-9+deb12u1"))
    config = ImageConfig(images_dir=tmp_path / "images", command_timeout_s=60, import_dirs=(tmp_path,))
    import_tarball(sqlite_sessions, clock, config, "bookworm-gpu", tarball(tree, tmp_path / "image.tar.gz"))
    evaluator = Evaluator()
    with transaction(sqlite_sessions) as s:
        store.import_advisories(s, clock, [GLIBC, REQUESTS])
        evaluator.evaluate(s, clock)
    with transaction(sqlite_sessions, readonly=True) as s:
        (problem,) = report.problems(s)
        assert (problem.problem, problem.nodes, problem.images) == ("CVE-2023-4911", [], ["bookworm-gpu"])
        assert [(p.package, p.installed, p.fixed) for p in problem.packages] == [
            ("libc6", ["2.36-9+deb12u1"], "2.36-9+deb12u3")
        ]

    # An admin upgrades glibc in the image's chroot: the rescan before a sync records the revision.
    image_status = config.path("bookworm-gpu") / "var" / "lib" / "dpkg" / "status"
    image_status.write_text(STATUS.format(version="2.36-9+deb12u3"))
    with transaction(sqlite_sessions) as s:
        revision = images.rescan(s, clock, images.get_image(s, "bookworm-gpu"), ACTOR)
        assert revision is not None
        assert revision.number == 2
        evaluator.evaluate(s, clock)
    with transaction(sqlite_sessions, readonly=True) as s:
        assert report.problems(s) == []

    image_status.write_text(STATUS.format(version="2.36-9+deb12u1"))  # and back: found again
    with transaction(sqlite_sessions) as s:
        images.rescan(s, clock, images.get_image(s, "bookworm-gpu"), ACTOR)
        evaluator.evaluate(s, clock)
    with transaction(sqlite_sessions, readonly=True) as s:
        assert [p.images for p in report.problems(s)] == [["bookworm-gpu"]]
    with transaction(sqlite_sessions) as s:
        images.remove_image(s, "bookworm-gpu", config)
        evaluator.evaluate(s, clock)
    with transaction(sqlite_sessions, readonly=True) as s:
        assert report.problems(s) == []
