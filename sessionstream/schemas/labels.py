"""A run's labels: the bounded key/value `metadata` a prompt gives its run, which run search
filters on (`GET /v1/runs?label=k:v`)."""

from __future__ import annotations

from typing import Annotated, Final

from pydantic import AfterValidator

from sessionstream.schemas._base import AvroJsonText

__all__ = ["MAX_LABELS", "MAX_LABEL_KEY_CHARS", "MAX_LABEL_VALUE_CHARS", "Labels", "label_problem"]


#: bounds of a prompt's `metadata` (the run's labels): how many keys, how long a key (of
#: `[A-Za-z0-9._/-]`) and a value may be
MAX_LABELS: Final = 16
MAX_LABEL_KEY_CHARS: Final = 64
MAX_LABEL_VALUE_CHARS: Final = 256
_LABEL_KEY_CHARS: Final = frozenset(
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._/-"
)


def label_problem(labels: dict[str, str]) -> str | None:
    """Why `labels` cannot be a run's metadata (None: they can): what the prompt's
    validation, the SDK, the gateway and the CLI all say."""
    if len(labels) > MAX_LABELS:
        return f"metadata has {len(labels)} keys, at most {MAX_LABELS}"
    for k, v in labels.items():
        if not isinstance(k, str) or not 1 <= len(k) <= MAX_LABEL_KEY_CHARS:
            return f"a metadata key is 1-{MAX_LABEL_KEY_CHARS} characters: {k!r}"
        if not _LABEL_KEY_CHARS.issuperset(k):
            return f"a metadata key is made of A-Z a-z 0-9 . _ / - only: {k!r}"
        if not isinstance(v, str):
            return f"metadata {k!r}: a value is a string"
        if len(v) > MAX_LABEL_VALUE_CHARS:
            return f"metadata {k!r}: a value is at most {MAX_LABEL_VALUE_CHARS} characters"
    return None


def _checked(labels: dict[str, str] | None) -> dict[str, str] | None:
    problem = label_problem(labels or {})
    if problem is not None:
        raise ValueError(problem)
    return labels or None  # `{}` is no labels: one form, one digest, one Avro record


#: a run's labels (null: none), checked against their bounds. Avro carries them as a JSON
#: object's text, not as a `map`: Kafka Connect's Flatten refuses a map in a record with a
#: schema, which would stop the JDBC sink's task on every `run.started`
Labels = Annotated[dict[str, str] | None, AfterValidator(_checked), AvroJsonText()]
