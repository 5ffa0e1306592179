"""authorized_keys: only plain key lines, written atomically, and never through a link the user planted."""

import os
import stat
from pathlib import Path

import pytest

from gpufleet.agent import authorized_keys
from gpufleet.agent.authorized_keys import HEADER, install, render

ED25519 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHRoaXNpc25vdGFyZWFsa2V5anVzdGFmaXh0dXJlISE bob@laptop"
RSA = "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQC7dGVzdGtleQ=="
UID, GID = os.getuid(), os.getgid()


def test_render_keeps_plain_keys_and_drops_anything_else() -> None:
    content, dropped = render(
        [
            ED25519,
            f"  {RSA}  ",
            f'command="/bin/sh" {ED25519}',  # options are never passed on
            f"{ED25519}\nssh-rsa AAAAinjected second-line",  # a second line smuggled in
            "sk-ssh-ed25519@openssh.com AAAAGnNrLXNzaC1lZDI1NTE5QG9wZW5zc2guY29t",
            "not a key",
        ]
    )
    text = content.decode()
    assert text.startswith(HEADER)
    assert text[len(HEADER) :].splitlines() == [
        ED25519,
        RSA,
        "sk-ssh-ed25519@openssh.com AAAAGnNrLXNzaC1lZDI1NTE5QG9wZW5zc2guY29t",
    ]
    assert dropped == [
        "SSH key 3 left out: not a plain public key line",
        "SSH key 4 left out: not a plain public key line",
        "SSH key 6 left out: not a plain public key line",
    ]


def test_install_writes_private_files_and_is_idempotent(tmp_path: Path) -> None:
    home = tmp_path / "bob"
    home.mkdir()
    content, _ = render([ED25519])
    assert install(home, UID, GID, content) is True
    ssh = home / ".ssh"
    keys = ssh / "authorized_keys"
    assert keys.read_bytes() == content
    assert stat.S_IMODE(ssh.stat().st_mode) == 0o700
    assert stat.S_IMODE(keys.stat().st_mode) == 0o600
    assert (keys.stat().st_uid, keys.stat().st_gid) == (UID, GID)
    assert install(home, UID, GID, content) is False  # nothing to do the second time
    keys.chmod(0o644)
    assert install(home, UID, GID, content) is True  # a loosened mode is put right
    assert stat.S_IMODE(keys.stat().st_mode) == 0o600
    assert sorted(p.name for p in ssh.iterdir()) == ["authorized_keys"]  # no temporary file left


def test_missing_home_is_created_only_when_asked(tmp_path: Path) -> None:
    content, _ = render([])
    with pytest.raises(FileNotFoundError):
        install(tmp_path / "gone", UID, GID, content)
    assert install(tmp_path / "new", UID, GID, content, create_home=True) is True
    assert stat.S_IMODE((tmp_path / "new").stat().st_mode) == 0o700


def test_a_symlinked_ssh_directory_is_refused(tmp_path: Path) -> None:
    home = tmp_path / "mallory"
    home.mkdir()
    target = tmp_path / "etc"
    target.mkdir()
    (home / ".ssh").symlink_to(target)
    with pytest.raises(OSError):  # noqa: PT011 - ELOOP or ENOTDIR, whichever the kernel says
        install(home, UID, GID, render([ED25519])[0])
    assert list(target.iterdir()) == []


def test_a_symlinked_home_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir()
    (tmp_path / "mallory").symlink_to(target)
    with pytest.raises(OSError):  # noqa: PT011
        install(tmp_path / "mallory", UID, GID, render([ED25519])[0])
    assert list(target.iterdir()) == []


def test_a_symlinked_or_fifo_keys_file_is_replaced_not_followed(tmp_path: Path) -> None:
    home = tmp_path / "mallory"
    (home / ".ssh").mkdir(parents=True, mode=0o700)
    victim = tmp_path / "shadow"
    victim.write_text("precious\n")
    keys = home / ".ssh" / authorized_keys.FILE_NAME
    keys.symlink_to(victim)
    content = render([ED25519])[0]
    assert install(home, UID, GID, content) is True
    assert victim.read_text() == "precious\n"
    assert not keys.is_symlink()
    assert keys.read_bytes() == content
    keys.unlink()
    os.mkfifo(keys)  # opening a FIFO to read it would block the agent forever
    assert install(home, UID, GID, content) is True
    assert stat.S_ISREG(keys.lstat().st_mode)
