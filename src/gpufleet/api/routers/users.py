"""Users: accounts for people, with their role and POSIX identity."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter

from gpufleet.api.deps import Ctx, allow, tx
from gpufleet.auth import users
from gpufleet.auth.policy import Permission
from gpufleet.auth.schemas import Principal, UserCreate, UserOut, UserUpdate

router = APIRouter(prefix="/users", tags=["users"])
Read = Annotated[Principal, allow(Permission.USERS_READ)]
Write = Annotated[Principal, allow(Permission.USERS_WRITE)]


@router.get("")
def list_users(_: Read, ctx: Ctx) -> list[UserOut]:
    with tx(ctx, readonly=True) as db:
        return [UserOut.model_validate(u) for u in users.list_users(db)]


@router.post("", status_code=201)
def create_user(body: UserCreate, _: Write, ctx: Ctx) -> UserOut:
    with tx(ctx) as db:
        return UserOut.model_validate(users.create_user(db, ctx.clock, body))


@router.get("/{username}")
def show_user(username: str, _: Read, ctx: Ctx) -> UserOut:
    with tx(ctx, readonly=True) as db:
        return UserOut.model_validate(users.get_user(db, username))


@router.patch("/{username}")
def update_user(username: str, body: UserUpdate, _: Write, ctx: Ctx) -> UserOut:
    with tx(ctx) as db:
        return UserOut.model_validate(users.update_user(db, ctx.clock, username, body))


@router.delete("/{username}", status_code=204)
def delete_user(username: str, _: Write, ctx: Ctx) -> None:
    with tx(ctx) as db:
        users.delete_user(db, username)
