"""An agent for the question tests: it asks a person which account to pay from
(`ctx.ask_user`, a `Literal` type) and returns the answer, `{"account": ...}`."""

from __future__ import annotations

from typing import Literal

from sessionstream.agent import RunContext

__all__ = ["run"]


async def run(ctx: RunContext) -> dict[str, object]:
    account = await ctx.ask_user("Which account?", Literal["acme-main", "acme-travel"])
    return {"account": account}
