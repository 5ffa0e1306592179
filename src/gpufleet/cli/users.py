"""gpufleet user create|list|show|update|disable|delete"""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer

from gpufleet.cli.output import Format, OutputOpt, fields, print_json, table
from gpufleet.cli.state import state

app = typer.Typer(help="Users: people, their role and their POSIX identity on the nodes.", no_args_is_help=True)
ROLES = "admin, operator, member or viewer"
PasswordStdin = Annotated[bool, typer.Option("--password-stdin", help="read the password from standard input")]
SshKeyOpt = Annotated[list[str] | None, typer.Option("--ssh-key", help="an SSH public key (repeatable)")]
USER_FIELDS = [
    ("username", "Username"),
    ("full_name", "Name"),
    ("role", "Role"),
    ("enabled", "Enabled"),
    ("uid", "UID"),
    ("gid", "GID"),
    ("shell", "Shell"),
    ("ssh_keys", "SSH keys"),
    ("home", "Home"),
    ("source", "Source"),
    ("synced_at", "Synced from source"),
    ("created_at", "Created"),
    ("updated_at", "Updated"),
]


def _password(from_stdin: bool, ask: bool) -> str | None:
    if from_stdin:
        return sys.stdin.readline().rstrip("\n")
    if ask:
        value: str = typer.prompt("Password", hide_input=True, confirmation_prompt=True)
        return value
    return None


def _show(user: dict[str, Any], output: Format) -> None:
    if output is Format.json:
        print_json(user)
    else:
        fields(user | {"ssh_keys": len(user["ssh_keys"])}, USER_FIELDS)


@app.command("create")
def create(
    ctx: typer.Context,
    username: str,
    role: Annotated[str, typer.Option(help=ROLES)] = "member",
    full_name: Annotated[str, typer.Option(help="the person's name")] = "",
    uid: Annotated[int | None, typer.Option(help="default: the next free one from 10000")] = None,
    gid: Annotated[int | None, typer.Option(help="default: the uid")] = None,
    shell: Annotated[str, typer.Option()] = "/bin/bash",
    ssh_key: SshKeyOpt = None,
    password_stdin: PasswordStdin = False,
    no_password: Annotated[bool, typer.Option("--no-password", help="token-only account, no web login")] = False,
    output: Format = OutputOpt,
) -> None:
    """Create a user. Asks for a password unless --password-stdin or --no-password."""
    spec: dict[str, Any] = {
        "username": username,
        "role": role,
        "full_name": full_name,
        "shell": shell,
        "ssh_keys": ssh_key or [],
        "uid": uid,
        "gid": gid,
    }
    spec["password"] = _password(password_stdin, ask=not no_password)
    _show(state(ctx).client().create_user(spec), output)


@app.command("list")
def list_(ctx: typer.Context, output: Format = OutputOpt) -> None:
    """List users."""
    users = state(ctx).client().list_users()
    if output is Format.json:
        print_json(users)
        return
    columns = [c for c in USER_FIELDS if c[0] not in {"ssh_keys", "updated_at", "home", "synced_at"}]
    table(users, columns, title=f"{len(users)} users")


@app.command("show")
def show(ctx: typer.Context, username: str, output: Format = OutputOpt) -> None:
    """Show one user."""
    _show(state(ctx).client().show_user(username), output)


@app.command("update")
def update(
    ctx: typer.Context,
    username: str,
    role: Annotated[str | None, typer.Option(help=ROLES)] = None,
    full_name: Annotated[str | None, typer.Option()] = None,
    shell: Annotated[str | None, typer.Option()] = None,
    ssh_key: SshKeyOpt = None,
    password: Annotated[bool, typer.Option("--password", help="set a new password (asked for)")] = False,
    password_stdin: PasswordStdin = False,
    enable: Annotated[bool, typer.Option("--enable", help="enable a disabled user")] = False,
    output: Format = OutputOpt,
) -> None:
    """Change a user. --ssh-key replaces the user's keys with those given."""
    change: dict[str, Any] = {
        k: v
        for k, v in {"role": role, "full_name": full_name, "shell": shell, "ssh_keys": ssh_key}.items()
        if v is not None
    }
    secret = _password(password_stdin, ask=password)
    if secret is not None:
        change["password"] = secret
    if enable:
        change["enabled"] = True
    _show(state(ctx).client().update_user(username, change), output)


@app.command("disable")
def disable(ctx: typer.Context, username: str) -> None:
    """Disable a user: their logins and tokens stop working at once; nothing is deleted."""
    state(ctx).client().update_user(username, {"enabled": False})
    typer.echo(f"disabled user {username}")


@app.command("delete")
def delete(ctx: typer.Context, username: str) -> None:
    """Delete a user and their tokens."""
    state(ctx).client().delete_user(username)
    typer.echo(f"deleted user {username}")
