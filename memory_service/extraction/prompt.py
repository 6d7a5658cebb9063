"""The extraction prompt and the schema the model must fill, kept side by side.

The system prompt is byte-stable (llama.cpp reuses the KV cache of an identical
prefix) and short: the variable text goes last, in the user message.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

PROMPT_VERSION = "facts-v2"  # "+context" when earlier saves are shown (MEMORY_EXTRACT_CONTEXT_SAVES)

SYSTEM_PROMPT = (
    "You extract facts worth remembering from a text saved by an AI agent.\n"
    'Reply with JSON only: {"facts": ["...", "..."]}.\n'
    "Rules:\n"
    "- Each fact is one short, self-contained sentence that states one thing. A sentence that says two "
    "things becomes two facts. Never return the whole text as one fact.\n"
    "- Say who or what each fact is about; use the speaker's name instead of I, we or you when it is given. "
    "When the text does not say who I or we is, do not guess a name (a name in an email address is not the "
    "speaker).\n"
    "- Copy numbers, names, dates, emails and URLs exactly as written.\n"
    "- State only what the text says. Never guess or add anything.\n"
    '- Skip greetings, thanks, jokes and small talk. If nothing is worth keeping, reply {"facts": []}.'
)
# Added only when earlier saves are shown: without context the prompt stays the one the evals measured.
CONTEXT_RULE = (
    "\n- Earlier texts of the same conversation come first, each with its answer. Use them only to tell "
    "who or what the last text means (I, it, that, yes); take facts from the last text only."
)


class ExtractedFacts(BaseModel):
    """What the model must return."""

    model_config = ConfigDict(extra="ignore")
    # required: a reply in another shape ({"items": [...]}) must fail visibly, not read as "no facts"
    facts: list[str]


def facts_schema(max_facts: int, max_fact_chars: int) -> dict[str, Any]:
    """JSON schema for llama.cpp's grammar: bounded, so output can't run away."""
    return {
        "type": "object",
        "properties": {
            "facts": {
                "type": "array",
                "items": {"type": "string", "minLength": 3, "maxLength": max_fact_chars},
                "maxItems": max_facts,
            }
        },
        "required": ["facts"],
        "additionalProperties": False,
    }


def build_messages(text: str, history: list[tuple[str, str]] | None = None) -> list[dict[str, str]]:
    """The system prompt, then earlier texts of the conversation with their answers as past turns, then the
    text. Everything before the text is the previous call's prompt and answer, so the server's prompt cache
    covers it: the context costs almost no prompt reading."""
    messages = [{"role": "system", "content": SYSTEM_PROMPT + (CONTEXT_RULE if history else "")}]
    for earlier, answer in history or []:
        messages += [{"role": "user", "content": "Text:\n" + earlier}, {"role": "assistant", "content": answer}]
    return messages + [{"role": "user", "content": "Text:\n" + text}]
