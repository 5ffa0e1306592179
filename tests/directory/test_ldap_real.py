"""gpufleet's LDAP client against a real OpenLDAP (tests/directory/conftest.py: slapd with TLS, memberof and
ppolicy, seeded with alice, bob, carol and dave)."""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from ldap3 import SUBTREE, Connection, Server

from gpufleet.core.errors import Unauthorized
from gpufleet.directory.ldap import REFUSED, LdapDirectory, VerifiedTls
from gpufleet.directory.records import DirectoryUnavailable, DirectoryUser
from tests.directory.conftest import LdapEdits, LdapServer, stop

pytestmark = pytest.mark.ldap

ALICE_KEYS = (
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHk77pxGvLr0F9qyj0ZEEUmK01FZP7FR2EoN37FLyhCk alice@laptop",
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJqmbsO6VabbXYbvYJ+NYXNxFSu3pELU9+DDL/O5Vt2v alice@gpufleet.test",
)
GROUPS = {
    "alice": {"gpu-admins", "ml-vision", "hpc-users"},
    "bob": {"ml-vision", "ml-nlp", "hpc-users"},
    "carol": {"ml-nlp", "hpc-users"},
    "dave": {"hpc-users", "ops"},
}
CLOSED_URL = "ldap://127.0.0.1:9"  # discard: nothing listens there


def other_ca(directory: Path) -> Path:
    """A CA that signed nothing the server has."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "not the directory's CA")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    path = directory / "other-ca.pem"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


def test_starttls_with_the_ca_reads_a_user(ldap_server: LdapServer) -> None:
    alice = ldap_server.directory().find("alice")
    assert alice == DirectoryUser(  # noqa: S604 (shell is the login shell)
        username="alice",
        source_id=ldap_server.user_dn("alice"),
        full_name="Alice Archer",
        uid=20001,
        gid=20001,
        home="/home/alice",
        shell="/bin/bash",
        ssh_keys=ALICE_KEYS,
        groups=frozenset(GROUPS["alice"]),
        enabled=True,
    )


def test_ldaps_with_the_ca(ldap_server: LdapServer) -> None:
    directory = ldap_server.directory(urls=(ldap_server.ldaps_url,))
    directory.check()
    assert directory.authenticate("bob", ldap_server.passwords["bob"]).groups == GROUPS["bob"]


@pytest.mark.parametrize("use_ldaps", [False, True], ids=["starttls", "ldaps"])
def test_a_wrong_ca_is_unavailable_naming_the_url(ldap_server: LdapServer, tmp_path: Path, use_ldaps: bool) -> None:
    url = ldap_server.ldaps_url if use_ldaps else ldap_server.url
    directory = ldap_server.directory(urls=(url,), ca_file=other_ca(tmp_path))
    with pytest.raises(DirectoryUnavailable, match="certificate verify failed") as caught:
        directory.check()
    assert url in str(caught.value)
    with pytest.raises(DirectoryUnavailable):
        directory.authenticate("alice", ldap_server.passwords["alice"])


def test_the_system_cas_do_not_trust_a_private_ca(ldap_server: LdapServer) -> None:
    with pytest.raises(DirectoryUnavailable, match="certificate verify failed"):
        ldap_server.directory(ca_file=None).check()


def test_a_missing_ca_file_is_unavailable(ldap_server: LdapServer, tmp_path: Path) -> None:
    with pytest.raises(DirectoryUnavailable, match="CA file"):
        ldap_server.directory(ca_file=tmp_path / "none.pem").check()


def test_plain_ldap_only_when_allowed(ldap_server: LdapServer) -> None:
    directory = ldap_server.directory(starttls=False, allow_plain=True)
    assert directory.authenticate("carol", ldap_server.passwords["carol"]).username == "carol"


def test_the_right_password_gives_the_user(ldap_server: LdapServer) -> None:
    bob = ldap_server.directory().authenticate("bob", ldap_server.passwords["bob"])
    assert (bob.username, bob.uid, bob.gid, bob.enabled) == ("bob", 20002, 20002, True)
    assert bob.source_id == ldap_server.user_dn("bob")


@pytest.mark.parametrize(
    ("username", "password"),
    [
        ("bob", "wrong"),
        ("bob", ""),  # an unauthenticated bind, which the server would answer with success
        ("bob", "alice-pw"),
        ("nobody", "nobody-pw"),
        ("dave", "dave-pw"),  # the right password of a locked account
        ("*", "bob-pw"),
        ("*)(uid=*", "bob-pw"),
        ("bob)(|(uid=*", "bob-pw"),
        ("Bob", "bob-pw"),  # not a gpufleet user name
        ("bob\n", "bob-pw"),
    ],
)
def test_every_refusal_says_the_same(ldap_server: LdapServer, username: str, password: str) -> None:
    with pytest.raises(Unauthorized) as caught:
        ldap_server.directory().authenticate(username, password)
    assert str(caught.value) == REFUSED


@pytest.mark.parametrize("username", ["*", "*)(uid=*", "alice)(|(uid=*", "ALICE", "al ice", "a" * 33])
def test_find_of_a_name_that_is_no_user_name_finds_nothing(ldap_server: LdapServer, username: str) -> None:
    assert ldap_server.directory().find(username) is None


def test_filter_values_are_escaped(ldap_server: LdapServer) -> None:
    """The second defence behind the user-name check: a value reaches the server as a literal."""
    directory = ldap_server.directory()
    conn, url = directory._service()
    try:
        assert directory._person(conn, url, "*)(uid=*") is None
        assert directory._person(conn, url, "*") is None
        assert directory._person(conn, url, "alice") is not None
    finally:
        conn.unbind()


def test_groups_of_both_kinds(ldap_server: LdapServer) -> None:
    directory = ldap_server.directory()
    for name, groups in GROUPS.items():
        person = directory.find(name)
        assert person is not None
        assert person.groups == groups, name


def test_dave_is_disabled_and_cannot_log_in(ldap_server: LdapServer) -> None:
    directory = ldap_server.directory()
    dave = directory.find("dave")
    assert dave is not None
    assert not dave.enabled
    assert dave.groups == GROUPS["dave"]
    with pytest.raises(Unauthorized):
        directory.authenticate("dave", ldap_server.passwords["dave"])


def test_without_a_disabled_filter_only_the_server_refuses_dave(ldap_server: LdapServer) -> None:
    """ppolicy itself refuses the locked account's bind, whatever gpufleet's filter says."""
    directory = ldap_server.directory(disabled_filter=None)
    dave = directory.find("dave")
    assert dave is not None
    assert dave.enabled
    with pytest.raises(Unauthorized):
        directory.authenticate("dave", ldap_server.passwords["dave"])


@pytest.mark.parametrize("page_size", [1, 500])
def test_users_lists_everyone(ldap_server: LdapServer, page_size: int) -> None:
    people = {p.username: p for p in ldap_server.directory(page_size=page_size).users()}
    assert sorted(people) == ["alice", "bob", "carol", "dave"]
    assert {name: set(p.groups) for name, p in people.items()} == GROUPS
    assert {name for name, p in people.items() if not p.enabled} == {"dave"}
    assert people["alice"] == ldap_server.directory().find("alice")
    assert [people[n].uid for n in sorted(people)] == [20001, 20002, 20003, 20004]


def test_users_leaves_out_names_gpufleet_cannot_have(ldap_server: LdapServer, ldap_edit: LdapEdits) -> None:
    ldap_edit.add_user("Eve.Smith", 20099)
    ldap_edit.add_user("erin", 20005, password="erin-pw", ssh_keys=("ssh-ed25519 AAAAC3Nz erin@x",))
    names = [p.username for p in ldap_server.directory().users()]
    assert names == ["alice", "bob", "carol", "dave", "erin"]
    erin = ldap_server.directory().authenticate("erin", "erin-pw")
    assert (erin.uid, erin.ssh_keys, erin.groups) == (20005, ("ssh-ed25519 AAAAC3Nz erin@x",), frozenset())


def test_membership_changes_are_read(ldap_server: LdapServer, ldap_edit: LdapEdits) -> None:
    ldap_edit.add_member("gpu-admins", "carol")  # groupOfNames
    ldap_edit.add_member("ops", "bob")  # posixGroup
    ldap_edit.remove_member("ml-vision", "bob")
    directory = ldap_server.directory()
    carol, bob = directory.find("carol"), directory.find("bob")
    assert carol is not None
    assert bob is not None
    assert carol.groups == {"gpu-admins", "ml-nlp", "hpc-users"}
    assert bob.groups == {"ml-nlp", "hpc-users", "ops"}
    people = {p.username: p.groups for p in directory.users()}
    assert people["carol"] == carol.groups
    assert people["bob"] == bob.groups


def test_lock_and_unlock(ldap_server: LdapServer, ldap_edit: LdapEdits) -> None:
    directory = ldap_server.directory()
    ldap_edit.lock("bob")
    with pytest.raises(Unauthorized):
        directory.authenticate("bob", ldap_server.passwords["bob"])
    assert {p.username for p in directory.users() if not p.enabled} == {"bob", "dave"}
    ldap_edit.unlock("dave")
    assert directory.authenticate("dave", ldap_server.passwords["dave"]).enabled


def test_a_memberof_group_outside_the_filter_still_counts(ldap_server: LdapServer) -> None:
    """memberOf (kept by slapd's memberof overlay) names groups a member search would also find; with a
    group filter that matches no group, it is the only source left."""
    alice = ldap_server.directory(group_filter="(objectClass=nothing)").find("alice")
    assert alice is not None
    assert alice.groups == {"gpu-admins", "ml-vision"}


def test_the_reader_cannot_read_passwords(ldap_server: LdapServer) -> None:
    """The seed's ACLs: the service account reads people but never userPassword (and anonymous reads nothing)."""
    host, port = ldap_server.url.removeprefix("ldap://").rsplit(":", 1)
    server = Server(host, port=int(port), tls=VerifiedTls(ldap_server.ca_file.read_text()), get_info="NO_INFO")
    reader = Connection(server, ldap_server.bind_dn, ldap_server.bind_password, auto_bind="TLS_BEFORE_BIND")
    anonymous = Connection(server, auto_bind="TLS_BEFORE_BIND")
    try:
        reader.search(ldap_server.user_base, "(uid=alice)", SUBTREE, attributes=["uid", "userPassword"])
        assert [{k for k, v in item["raw_attributes"].items() if v} for item in reader.response] == [{"uid"}]
        anonymous.search(ldap_server.user_base, "(uid=*)", SUBTREE)
        assert anonymous.entries == []
    finally:
        reader.unbind()  # a `with` block would leave a connection bound before it open
        anonymous.unbind()


def test_a_wrong_service_password_is_unavailable(ldap_server: LdapServer) -> None:
    with pytest.raises(DirectoryUnavailable, match="service bind") as caught:
        ldap_server.directory(bind_password="wrong").authenticate("alice", ldap_server.passwords["alice"])
    assert ldap_server.url in str(caught.value)
    assert ldap_server.bind_dn in str(caught.value)


def test_nothing_listening_is_unavailable(ldap_server: LdapServer) -> None:
    directory = ldap_server.directory(urls=(CLOSED_URL,), timeout_s=2.0)
    with pytest.raises(DirectoryUnavailable, match="cannot connect") as caught:
        directory.users()
    assert CLOSED_URL in str(caught.value)


def test_a_stopped_server_and_its_replica(ldap_server: LdapServer, ldap_spare: LdapServer) -> None:
    spare = LdapDirectory(ldap_spare.config(timeout_s=2.0))
    spare.check()
    stop(ldap_spare)
    with pytest.raises(DirectoryUnavailable, match="cannot connect") as caught:
        spare.find("alice")
    assert ldap_spare.url in str(caught.value)
    # The stopped server first, then a live one: the second answers (both were seeded the same).
    both = ldap_server.directory(urls=(ldap_spare.url, ldap_server.url), timeout_s=2.0)
    assert both.authenticate("alice", ldap_server.passwords["alice"]).username == "alice"
    assert len(both.users()) == 4


def test_a_replica_with_the_wrong_certificate_is_passed_over(ldap_server: LdapServer, ldap_spare: LdapServer) -> None:
    """The spare's certificate comes from its own CA: with the main CA configured it fails TLS, and the next
    URL is used."""
    directory = ldap_server.directory(urls=(ldap_spare.ldaps_url, ldap_server.ldaps_url))
    assert directory.authenticate("carol", ldap_server.passwords["carol"]).username == "carol"
    with pytest.raises(DirectoryUnavailable, match="certificate verify failed"):
        ldap_server.directory(urls=(ldap_spare.url,)).check()
