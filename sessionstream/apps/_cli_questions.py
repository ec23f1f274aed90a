"""CLI commands of questions to a person: `questions list|answer`
(docs/protocol.md, questions to a person).

`list` reads PostgreSQL (the sink's projection, a moment behind the log); `answer` finds the
run's session there, checks it is the tenant's, and sends `question.answer` naming the run,
as `--actor` (recorded as `answeredBy`).
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from sessionstream.apps._cli_approvals import Tenant, _db_call, _session_of
from sessionstream.apps._cli_send import Actor, AsJson, CommandId, Wait, _submit

__all__ = ["register"]

questions_app = typer.Typer(
    help="Questions a run asked a person (ctx.ask_user): list the open ones, answer one.",
    no_args_is_help=True,
)


@questions_app.command("list")
def list_(
    tenant: Tenant = "default",
    limit: Annotated[int, typer.Option(min=1, max=1000, help="at most this many")] = 200,
    as_json: AsJson = False,
) -> None:
    """The tenant's open questions (active runs only), the window closing soonest first:
    run, session, questionId, the question, its schema, generation, expiresAt."""
    import time

    from sessionstream.runtimes.sink.questions import open_questions

    rows: list[dict[str, Any]] = _db_call(open_questions, tenant, limit)
    if as_json:
        typer.echo(json.dumps(rows))
        return
    if not rows:
        typer.echo(f"no question of tenant {tenant!r} waits for an answer")
        return
    now = int(time.time() * 1000)
    for r in rows:
        left = max(0, (r["expiresAt"] or 0) - now) // 1000
        schema = "" if r["schema"] is None else f" schema {json.dumps(r['schema'])}"
        typer.echo(
            f"run {r['runId']} question {r['questionId']}: {r['question']!r}{schema} "
            f"gen {r['generation']} {left}s left (session {r['sessionId']})"
        )


@questions_app.command("answer")
def answer(
    run: Annotated[str, typer.Argument(help="the run that asked", show_default=False)],
    question_id: Annotated[str, typer.Argument(help="the question's id", show_default=False)],
    value: Annotated[
        str,
        typer.Argument(
            help="the answer: a JSON value (`'\"yes\"'`, `3`, `'{\"n\": 3}'`), or with --text "
            "the words as they are",
            show_default=False,
        ),
    ],
    text: Annotated[
        bool, typer.Option("--text", help="send VALUE as a string, not as JSON")
    ] = False,
    generation: Annotated[
        int | None,
        typer.Option(help="the asking holder's generation (default: whichever asked)", min=1),
    ] = None,
    tenant: Tenant = "default",
    wait: Wait = 10.0,
    as_json: AsJson = False,
    command_id: CommandId = None,
    actor: Actor = None,
) -> None:
    """Answer the open question QUESTION_ID of RUN (exit 1 when rejected: not open, a stale
    generation, expired, too large; exit 2 when VALUE is not JSON without --text)."""
    if text:
        parsed: Any = value
    else:
        try:
            parsed = json.loads(value)
        except ValueError as e:
            typer.echo(f"error: the answer is not JSON ({e}); add --text to send words", err=True)
            raise typer.Exit(code=2) from e
    payload = {"questionId": question_id, "answer": parsed, "generation": generation}
    session = _session_of(run, tenant)
    _submit(session, "question.answer", payload, tenant, wait, as_json, command_id, actor, run)


def register(app: typer.Typer) -> None:
    app.add_typer(questions_app, name="questions")
