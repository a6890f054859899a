"""Every definition kind the compiler reads: the six of `documents`, and `Eval` (§12).

Kept apart from `documents` so a kind with a module of its own (`eval_documents`)
imports the shared pieces from there without `documents` importing it back.
"""

from __future__ import annotations

from typing import Any

from . import documents
from .eval_documents import EvalDocument

DOCUMENT_MODELS: dict[str, type[documents.Document]] = {**documents.DOCUMENT_MODELS, "Eval": EvalDocument}
KINDS = (*documents.KINDS, "Eval")


def json_schema() -> dict[str, Any]:
    """One JSON Schema for any definition document, for editors (see `documents.json_schema`)."""
    return documents.json_schema(DOCUMENT_MODELS)
