"""Software images on small trees: tarball import and clone through the real tar and cp, a revision
per change with its history, package installs into a prepared chroot (apt faked here; the real one
is in test_images_debootstrap.py), refusals that change nothing, and the program runner."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.core.clock import FakeClock, to_datetime
from gpufleet.core.config import load_settings
from gpufleet.core.db import transaction
from gpufleet.core.errors import Conflict, InvalidInput, NotFound
from gpufleet.inventory import categories
from gpufleet.provisioning import images
from gpufleet.provisioning.image_models import Image
from gpufleet.provisioning.images import ImageConfig, Source, tree_digest
from gpufleet.provisioning.runner import CommandFailed, Completed, ProcessRunner, Step
from gpufleet.tasks import service as tasks
from tests.provisioning.images_helpers import ACTOR, import_tarball, make_tree, sqlite_sessions, tarball

__all__ = ["sqlite_sessions"]  # the fixture, imported for pytest


@pytest.fixture
def config(tmp_path: Path) -> ImageConfig:
    return ImageConfig(images_dir=tmp_path / "images", command_timeout_s=60, import_dirs=(tmp_path,))


@pytest.fixture
def tar(tmp_path: Path) -> Path:
    return tarball(make_tree(tmp_path / "tree"), tmp_path / "image.tar.gz")


def walk(root: Path) -> dict[str, tuple[int, bytes | str]]:
    """Every entry under root: its mode and its content (a link: its target)."""
    out: dict[str, tuple[int, bytes | str]] = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        rel = str(path.relative_to(root))
        if path.is_symlink():
            out[rel] = (st.st_mode, os.readlink(path))
        elif path.is_file():
            out[rel] = (st.st_mode, path.read_bytes())
        else:
            out[rel] = (st.st_mode, "")
    return out


def test_a_tarball_becomes_an_image_at_revision_one(
    sqlite_sessions: sessionmaker[Session], clock: FakeClock, config: ImageConfig, tar: Path, tmp_path: Path
) -> None:
    summary = import_tarball(sqlite_sessions, clock, config, "base", tar)
    assert summary.startswith("image base: revision 1,")
    path = config.path("base")
    assert walk(path) == walk(tmp_path / "tree")
    lib = path / "usr" / "lib" / "gpu"
    assert (lib / "libgpu.so.1").stat().st_ino == (lib / "libgpu-hard.so").stat().st_ino  # hard link kept
    assert oct((path / "etc" / "shadow").stat().st_mode & 0o777) == "0o640"
    assert not config.building("base").exists()
    with transaction(sqlite_sessions, readonly=True) as s:
        image = images.get_image(s, "base")
        (revision,) = images.history(s, image)
        assert (image.state, image.revision, image.source) == ("ready", 1, f"tarball {tar}")
        assert (revision.number, revision.actor) == (1, ACTOR)
        assert revision.change == f"created from tarball {tar}"
        walked = tree_digest(path)
        assert (revision.digest, revision.files, revision.bytes) == (walked.digest, walked.files, walked.bytes)
        assert revision.files == len(walk(path))


def test_a_clone_is_an_equal_copy_with_a_history_of_its_own(
    sqlite_sessions: sessionmaker[Session], clock: FakeClock, config: ImageConfig, tar: Path
) -> None:
    import_tarball(sqlite_sessions, clock, config, "gold", tar)
    config.exclude_file("gold").write_text("/opt/scratch/*\n")
    source = Source(clone_of="gold")
    with transaction(sqlite_sessions) as s:
        _, clone_path = images.begin_create(s, clock, config, "gold-copy", source, ACTOR)
    images.run_create(
        sqlite_sessions, clock, ProcessRunner(), config, name="gold-copy", source=source,
        clone_path=clone_path, actor=ACTOR, task_id=None,
    )  # fmt: skip
    assert walk(config.path("gold-copy")) == walk(config.path("gold"))
    assert config.exclude_file("gold-copy").read_text() == "/opt/scratch/*\n"
    (config.path("gold-copy") / "etc" / "motd").write_text("the copy only\n")
    with transaction(sqlite_sessions) as s:
        gold, copy = images.get_image(s, "gold"), images.get_image(s, "gold-copy")
        assert copy.digest == gold.digest  # cp -a keeps modes, owners and times: the same tree
        assert images.history(s, copy)[0].change == "created from clone of gold"
        assert images.rescan(s, clock, copy, ACTOR) is not None
        assert images.rescan(s, clock, gold, ACTOR) is None  # the original did not change


def test_every_change_on_disk_is_a_revision_with_its_history(
    sqlite_sessions: sessionmaker[Session], clock: FakeClock, config: ImageConfig, tar: Path
) -> None:
    import_tarball(sqlite_sessions, clock, config, "revs", tar)
    root = config.path("revs")

    def rescan() -> int | None:
        clock.advance(60)
        with transaction(sqlite_sessions) as s:
            found = images.rescan(s, clock, images.get_image(s, "revs"), "user:bob")
            return found.number if found else None

    assert rescan() is None  # nothing changed: no revision
    with (root / "etc" / "os-release").open("a") as fh:
        fh.write("VERSION_ID=2\n")
    assert rescan() == 2
    os.chmod(root / "etc" / "shadow", 0o600)  # only a mode
    assert rescan() == 3
    os.unlink(root / "usr" / "lib" / "gpu" / "libgpu.so")
    os.symlink("libgpu-hard.so", root / "usr" / "lib" / "gpu" / "libgpu.so")  # a link's target
    assert rescan() == 4
    assert rescan() is None
    with transaction(sqlite_sessions, readonly=True) as s:
        image = images.get_image(s, "revs")
        history = images.history(s, image)
        assert [r.number for r in history] == [4, 3, 2, 1]
        assert history[0].change == "changed on disk outside gpufleet"
        assert history[0].actor == "user:bob"
        assert len({r.digest for r in history}) == 4
        assert image.digest == history[0].digest == tree_digest(root).digest
        assert history[0].at > history[1].at


class FakeApt:
    """Stands in for chroot + apt: checks the chroot is prepared, then "installs" a file."""

    def __init__(self, root: Path, fail: bool = False) -> None:
        self.root = root
        self.fail = fail
        self.steps: list[Step] = []

    def run(self, step: Step, *, on_line: object = None, ok_codes: frozenset[int] = frozenset({0})) -> Completed:
        self.steps.append(step)
        assert (self.root / "etc" / "resolv.conf").read_text() == Path("/etc/resolv.conf").read_text()
        policy = self.root / "usr" / "sbin" / "policy-rc.d"
        assert "exit 101" in policy.read_text()
        assert os.access(policy, os.X_OK)
        if "install" in step.argv:
            (self.root / "usr" / "bin").mkdir(exist_ok=True)
            (self.root / "usr" / "bin" / "hello").write_text("#!/bin/sh\necho hello\n")
            if self.fail:
                raise CommandFailed("apt-get exited with status 100: E: Unable to locate package nosuch")
        return Completed(step.argv, 0, "", "", 0.0)


def test_install_runs_apt_in_a_prepared_chroot_and_records_the_packages(
    sqlite_sessions: sessionmaker[Session], clock: FakeClock, config: ImageConfig, tar: Path
) -> None:
    import_tarball(sqlite_sessions, clock, config, "apt", tar)
    root = config.path("apt")
    (root / "run").mkdir()
    os.symlink("../run/resolv.conf", root / "etc" / "resolv.conf")  # as Ubuntu's systemd-resolved has it
    (root / "usr" / "sbin").mkdir()
    with transaction(sqlite_sessions) as s:
        images.rescan(s, clock, images.get_image(s, "apt"), ACTOR)
        images.begin_change(s, "apt")
    fake = FakeApt(root)
    summary = images.run_install(
        sqlite_sessions, clock, fake, config, name="apt", packages=["hello", "jq=1.6-2.1"], actor=ACTOR, task_id=7
    )
    assert summary == "image apt: revision 3, installed hello jq=1.6-2.1"
    assert [s.argv[2:] for s in fake.steps] == [
        ("apt-get", "-q", "update"),
        ("apt-get", "-q", "-y", "--no-install-recommends", "install", "hello", "jq=1.6-2.1"),
        ("apt-get", "-q", "clean"),
    ]
    assert all(s.argv[:2] == ("chroot", str(root)) for s in fake.steps)
    assert fake.steps[1].env["DEBIAN_FRONTEND"] == "noninteractive"
    assert os.readlink(root / "etc" / "resolv.conf") == "../run/resolv.conf"  # put back as it was
    assert not os.path.lexists(root / "usr" / "sbin" / "policy-rc.d")
    assert not list(root.rglob("*.gpufleet-saved"))
    with transaction(sqlite_sessions, readonly=True) as s:
        image = images.get_image(s, "apt")
        latest = images.history(s, image)[0]
        assert (image.state, image.revision) == ("ready", 3)
        assert (latest.change, latest.task_id) == ("installed hello jq=1.6-2.1", 7)


def test_a_failed_install_is_recorded_as_such_and_frees_the_image(
    sqlite_sessions: sessionmaker[Session], clock: FakeClock, config: ImageConfig, tar: Path
) -> None:
    import_tarball(sqlite_sessions, clock, config, "broken", tar)
    root = config.path("broken")
    (root / "usr" / "sbin").mkdir()
    (root / "usr" / "sbin" / "policy-rc.d").write_text("#!/bin/sh\nexit 0\n")  # the image's own: kept
    with transaction(sqlite_sessions) as s:
        images.rescan(s, clock, images.get_image(s, "broken"), ACTOR)
        images.begin_change(s, "broken")
    with pytest.raises(CommandFailed, match="Unable to locate package"):
        images.run_install(
            sqlite_sessions, clock, FakeApt(root, fail=True), config,
            name="broken", packages=["nosuch"], actor=ACTOR, task_id=None,
        )  # fmt: skip
    assert (root / "usr" / "sbin" / "policy-rc.d").read_text() == "#!/bin/sh\nexit 0\n"
    assert not (root / "etc" / "resolv.conf").exists()  # there was none
    with transaction(sqlite_sessions, readonly=True) as s:
        image = images.get_image(s, "broken")
        assert image.state == "ready"
        assert images.history(s, image)[0].change == "failed install of nosuch (partly changed)"


def test_bad_requests_change_nothing(
    sqlite_sessions: sessionmaker[Session], clock: FakeClock, config: ImageConfig, tar: Path, tmp_path: Path
) -> None:
    import_tarball(sqlite_sessions, clock, config, "taken", tar)
    (config.images_dir / "stray").mkdir()
    not_a_tar = tmp_path / "junk.tar"
    not_a_tar.write_text("this is no tar file\n")
    cases: list[tuple[str, Source, type[Exception], str]] = [
        ("../etc", Source(release="bookworm"), InvalidInput, "invalid image name"),
        ("-rf", Source(release="bookworm"), InvalidInput, "invalid image name"),
        ("x", Source(), InvalidInput, "exactly one source"),
        ("x", Source(release="bookworm", tarball=str(tar)), InvalidInput, "exactly one source"),
        ("x", Source(release="--foreign"), InvalidInput, "not a release name"),
        ("x", Source(release="bookworm", mirror="ftp://m"), InvalidInput, "mirror must be"),
        ("x", Source(release="bookworm", mirror="http://evil.example/debian"), InvalidInput, "not an allowed mirror"),
        ("x", Source(release="noble", mirror="file:///tmp/repo"), InvalidInput, "not an allowed mirror"),
        ("x.exclude", Source(tarball=str(tar)), InvalidInput, "may not end in .exclude"),
        ("x", Source(tarball="image.tar"), InvalidInput, "absolute path"),
        ("x", Source(tarball=str(tmp_path / "none.tar")), InvalidInput, "not a file"),
        ("x", Source(clone_of="nosuch"), NotFound, "no such image"),
        ("taken", Source(tarball=str(tar)), Conflict, "exists"),
        ("stray", Source(tarball=str(tar)), Conflict, "exists on disk"),
    ]
    for name, source, error, message in cases:
        with pytest.raises(error, match=message), transaction(sqlite_sessions) as s:
            images.begin_create(s, clock, config, name, source, ACTOR)
    for packages, message in (([], "at least one"), (["-y"], "not a package"), (["a b"], "not a package")):
        with pytest.raises(InvalidInput, match=message):
            images.check_packages(packages)
    with pytest.raises(CommandFailed, match="tar exited with status 2"):
        import_tarball(sqlite_sessions, clock, config, "junk", not_a_tar)
    assert not config.path("junk").exists()
    assert not config.building("junk").exists()
    with transaction(sqlite_sessions, readonly=True) as s:
        assert "junk" not in [i.name for i in images.list_images(s)]
        assert images.get_image(s, "taken").revision == 1


def test_only_allowed_mirrors_may_be_named(sqlite_sessions: sessionmaker[Session], tmp_path: Path) -> None:
    settings = load_settings(client_file=tmp_path / "none.toml", data_dir=tmp_path)
    config = ImageConfig.of(settings)
    with transaction(sqlite_sessions, readonly=True) as s:
        for mirror in ("https://deb.debian.org/debian/", "http://archive.ubuntu.com/ubuntu", None):
            images.check_create(s, config, "mirrored", Source(release="noble", mirror=mirror))
        own = ImageConfig.of(settings.model_copy(update={"image_allowed_mirrors": ["http://apt.site.example/debian"]}))
        images.check_create(s, own, "mirrored", Source(release="bookworm", mirror="http://apt.site.example/debian"))
        images.check_create(s, own, "mirrored", Source(release="bookworm", mirror="http://deb.debian.org/debian"))
        with pytest.raises(InvalidInput, match="not an allowed mirror"):
            images.check_create(s, own, "mirrored", Source(release="bookworm", mirror="https://deb.debian.org/debian"))


def _add_image(sessions: sessionmaker[Session], clock: FakeClock, config: ImageConfig, name: str) -> None:
    with transaction(sessions) as s:
        s.add(Image(name=name, path=str(config.path(name)), source="test", state="ready",
                    created_at=to_datetime(clock.now()), created_by=ACTOR, revision=1))  # fmt: skip


def test_an_image_a_sync_or_clone_reads_is_held_until_it_ends(
    sqlite_sessions: sessionmaker[Session], clock: FakeClock, config: ImageConfig
) -> None:
    _add_image(sqlite_sessions, clock, config, "held")
    with transaction(sqlite_sessions) as s:
        images.hold(s, ["held"])
        params = {"images": ["other", "held"], "dry_run": False}
        syncing = tasks.create(s, clock, kind="image.sync", targets=["n1"], params=params, created_by=ACTOR).id
        tasks.create(s, clock, kind="image.sync", targets=["n2"], params={"images": ["x"]}, created_by=ACTOR)
        assert images.readers(s, "held") == [syncing]
    for attempt in (lambda s: images.begin_change(s, "held"), lambda s: images.remove_image(s, "held", config)):
        with pytest.raises(Conflict, match=f"held is being read by task {syncing}"), transaction(sqlite_sessions) as s:
            attempt(s)
    with transaction(sqlite_sessions) as s:
        assert images.get_image(s, "held").state == "ready"  # both refusals changed nothing
        tasks.mark_running(s, clock, syncing)
        # a clone of it, queued behind the running sync, reads it too
        cloning = tasks.create(
            s, clock, kind="image.clone", targets=["held2"], params={"image": "held2", "clone_of": "held"},
            created_by=ACTOR,
        ).id  # fmt: skip
    with transaction(sqlite_sessions) as s:
        tasks.finish(s, clock, syncing, error=None, summary="done")
    with pytest.raises(Conflict, match=f"being read by task {cloning}"), transaction(sqlite_sessions) as s:
        images.begin_change(s, "held")
    with transaction(sqlite_sessions) as s:
        tasks.finish(s, clock, cloning, error="cp failed", summary=None)
    with transaction(sqlite_sessions) as s:
        images.begin_change(s, "held")
    with pytest.raises(Conflict, match="held is changing"), transaction(sqlite_sessions) as s:
        images.hold(s, ["held"])  # a sync may not start on an image being changed


def test_a_crashed_install_is_undone_before_the_next(
    sqlite_sessions: sessionmaker[Session], clock: FakeClock, config: ImageConfig, tar: Path
) -> None:
    import_tarball(sqlite_sessions, clock, config, "crashed", tar)
    root = config.path("crashed")
    (root / "etc" / "resolv.conf").write_text("nameserver 10.141.255.254\n")  # the image's own
    (root / "usr" / "sbin").mkdir()  # and no policy-rc.d
    images._chroot_prepared(root).__enter__()  # the head died while apt ran: nothing put back
    assert "exit 101" in (root / "usr" / "sbin" / "policy-rc.d").read_text()
    with transaction(sqlite_sessions) as s:
        images.rescan(s, clock, images.get_image(s, "crashed"), ACTOR)
        images.begin_change(s, "crashed")
    images.run_install(
        sqlite_sessions, clock, FakeApt(root), config, name="crashed", packages=["hello"], actor=ACTOR, task_id=None
    )
    assert (root / "etc" / "resolv.conf").read_text() == "nameserver 10.141.255.254\n"
    assert not os.path.lexists(root / "usr" / "sbin" / "policy-rc.d")
    assert not [p for p in root.rglob("*") if ".gpufleet-" in p.name]


def test_exclude_files_follow_their_image(
    sqlite_sessions: sessionmaker[Session], clock: FakeClock, config: ImageConfig, tar: Path
) -> None:
    import_tarball(sqlite_sessions, clock, config, "excl", tar)
    config.exclude_file("excl").write_text("/opt/*\n")
    source = Source(clone_of="excl")
    with transaction(sqlite_sessions) as s:
        _, clone_path = images.begin_create(s, clock, config, "excl-copy", source, ACTOR)
    (config.path("excl-copy") / "stray").mkdir(parents=True)  # appears meanwhile: the copy cannot move in
    with pytest.raises(OSError, match="not empty"):
        images.run_create(
            sqlite_sessions, clock, ProcessRunner(), config, name="excl-copy", source=source,
            clone_path=clone_path, actor=ACTOR, task_id=None,
        )  # fmt: skip
    assert not config.exclude_file("excl-copy").exists()  # the failed copy's exclusions went with it
    assert (config.path("excl-copy") / "stray").is_dir()  # what it did not make stays
    config.exclude_file("gone").write_text("/srv/*\n")  # an image whose tree is already gone
    images.delete_tree(config.path("gone"), config)
    assert not config.exclude_file("gone").exists()


def test_one_change_at_a_time_and_an_abandoned_one_is_recovered(
    sessions: sessionmaker[Session], clock: FakeClock, config: ImageConfig
) -> None:
    with transaction(sessions) as s:
        s.add(Image(name="img", path=str(config.path("img")), source="test", state="ready",
                    created_at=to_datetime(clock.now()), created_by=ACTOR, revision=1))  # fmt: skip
    with transaction(sessions) as s:
        image = images.begin_change(s, "img")
        task = tasks.create(s, clock, kind="image.install", targets=["img"], params={}, created_by=ACTOR)
        images.attach_task(s, image, task.id)
        task_id = task.id
    with transaction(sessions) as s:
        with pytest.raises(Conflict, match="img is changing"):
            images.begin_change(s, "img")
        with pytest.raises(Conflict, match="img is changing"):
            images.remove_image(s, "img", config)
        with pytest.raises(Conflict, match="img is changing"):
            images.check_create(s, config, "copy", Source(clone_of="img"))
    with transaction(sessions) as s:  # the head running the install stopped; the next one says so
        tasks.finish(s, clock, task_id, error="interrupted", summary=None)
    with transaction(sessions) as s:
        assert images.begin_change(s, "img").state == "changing"


def test_an_image_in_use_cannot_be_removed(
    sqlite_sessions: sessionmaker[Session], clock: FakeClock, config: ImageConfig, tar: Path
) -> None:
    import_tarball(sqlite_sessions, clock, config, "used", tar)
    config.exclude_file("used").write_text("/srv/*\n")
    with transaction(sqlite_sessions) as s:
        categories.create_category(s, clock, "hgx-used", settings={"software_image": "used"})
    with pytest.raises(Conflict, match="software_image of category hgx-used"), transaction(sqlite_sessions) as s:
        images.remove_image(s, "used", config)
    assert config.path("used").is_dir()
    with transaction(sqlite_sessions) as s:
        assert images.users(s)["used"] == ["category hgx-used"]
        categories.get_category(s, "hgx-used").settings = {}
    with transaction(sqlite_sessions) as s:
        path = images.remove_image(s, "used", config)
    images.delete_tree(path, config)
    assert not config.path("used").exists()
    assert not config.exclude_file("used").exists()
    with pytest.raises(NotFound), transaction(sqlite_sessions, readonly=True) as s:
        images.get_image(s, "used")


def test_what_a_change_runs_is_an_argument_list() -> None:
    config = ImageConfig(images_dir=Path("/srv/images"), command_timeout_s=900)
    (debian,) = images.plan_create(config, "a", Source(release="bookworm"))
    (ubuntu,) = images.plan_create(config, "b", Source(release="noble"))
    (mirrored,) = images.plan_create(config, "c", Source(release="trixie", mirror="http://m.example/debian"))
    assert debian.argv == (
        "debootstrap", "--variant=minbase", "bookworm", "/srv/images/.a.building", "http://deb.debian.org/debian",
    )  # fmt: skip
    assert ubuntu.argv[-1] == "http://archive.ubuntu.com/ubuntu"
    assert mirrored.argv[-1] == "http://m.example/debian"
    assert debian.timeout_s == 900
    (tar,) = images.plan_create(config, "d", Source(tarball="/srv/x y.tar"))
    assert tar.argv[:3] == ("tar", "--extract", "--file=/srv/x y.tar")
    assert "'--file=/srv/x y.tar'" in tar.shown()  # quoted for people; never run through a shell
    (cp,) = images.plan_create(config, "e", Source(clone_of="a"), Path("/srv/images/a"))
    assert cp.argv == ("cp", "--archive", "--reflink=auto", "--no-target-directory", "/srv/images/a",
                       "/srv/images/.e.building")  # fmt: skip
    install = images.plan_install(config, Path("/srv/images/a"), ["curl"])
    assert install[1].shown() == (
        "APT_LISTCHANGES_FRONTEND=none DEBIAN_FRONTEND=noninteractive chroot /srv/images/a "
        "apt-get -q -y --no-install-recommends install curl"
    )


def test_the_runner_runs_argument_lists_with_a_timeout(tmp_path: Path) -> None:
    runner = ProcessRunner()
    done = runner.run(Step(("echo", "a; touch x", "$(id)", "*"), 5))
    assert done.stdout == "a; touch x $(id) *\n"  # words, never a shell's
    lines: list[str] = []
    runner.run(Step(("printf", "1%%\\r50%%\\r100%%\\ndone"), 5), on_line=lines.append)
    assert lines == ["1%", "50%", "100%", "done"]  # rsync's progress ends lines with \r
    with pytest.raises(CommandFailed, match=r"sh exited with status 3: oops"):
        runner.run(Step(("sh", "-c", "echo oops >&2; exit 3"), 5))
    assert runner.run(Step(("sh", "-c", "exit 24"), 5), ok_codes=frozenset({0, 24})).returncode == 24
    with pytest.raises(CommandFailed, match="cannot run no-such-program"):
        runner.run(Step(("no-such-program",), 5))
    started = time.monotonic()
    marker = tmp_path / "child-survived"
    # a child of its own that would outlive a kill of the parent alone
    script = f"(sleep 1; touch {marker}) & sleep 30"
    with pytest.raises(CommandFailed, match=r"ran past its timeout of 0\.3 s"):
        runner.run(Step(("sh", "-c", script), 0.3))
    assert time.monotonic() - started < 1
    time.sleep(max(0.0, 1.3 - (time.monotonic() - started)))
    assert not marker.exists()  # the whole process group was killed
