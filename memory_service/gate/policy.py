"""The gate's policy file: which upstream tools are guarded, and how.

    [tools.process_item]
    once = "ticket:{item_id}"   # the handled-ledger key, built from the call's arguments
    scope = "team"              # whose ledger holds the key: "team" (default) or "agent"
    lease_s = 300               # how long a reservation blocks the key if the gate dies mid-call
    [tools.send_email]
    limit = "emails"            # a daily limit of the service; `units` (default 1) are used per call
    units = 1

It is read once, at start, and checked whole before anything is served: a mistake found at the first guarded
call would be found by an agent, mid-task. Every error names the file, the table and the field. A `once`
template is checked by the contract's own rule (contract/gate.py), the one the key is rendered by at each call.
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ..config import ConfigError
from ..contract.gate import DEFAULT_LEASE_S, MAX_LEASE_S, template_fields
from ..contract.limit_rules import MAX_DAILY_LIMIT, MAX_HANDLED_KEY_LEN, NAME_PATTERN, NAME_RULE

Scope = Literal["team", "agent"]
SCOPES: tuple[Scope, ...] = ("team", "agent")
TOOL_NAME_RE = re.compile(r"^[A-Za-z0-9._-]{1,128}$")  # the contract's tool name: what MCP allows a tool's name
TOOL_NAME_RULE = "1-128 characters of A-Z a-z 0-9 . _ -"
KEYS = ("once", "scope", "lease_s", "limit", "units")


class PolicyError(ConfigError):
    """The policy file cannot be used: the message names the file, the table and the field, and what to write."""


@dataclass(frozen=True)
class ToolPolicy:
    """How one tool is guarded: a handled-ledger key template (`once`), a daily limit, or both."""

    tool: str
    once: str | None = None
    scope: Scope = "team"
    lease_s: float = float(DEFAULT_LEASE_S)
    limit: str | None = None
    units: int = 1

    @property
    def fields(self) -> tuple[str, ...]:
        """The arguments `once` is built from, in order."""
        return tuple(template_fields(self.once)) if self.once else ()


@dataclass(frozen=True)
class Policy:
    path: Path
    tools: Mapping[str, ToolPolicy]

    def unknown_tools(self, listed: set[str]) -> list[str]:
        """Guarded tools the upstream does not list (a typo, or a tool it lists later): a warning at start."""
        return sorted(set(self.tools) - listed)


def check_template(template: str) -> str | None:
    """What is wrong with a `once` template, or None: the contract's rule (`template_fields`, the one `render_key`
    applies at each call), so a template accepted here renders at every call that has its arguments."""
    if not template.strip():
        return "is empty: write a key such as 'ticket:{item_id}'"
    if len(template) > MAX_HANDLED_KEY_LEN:
        return f"is longer than a handled key may be ({MAX_HANDLED_KEY_LEN} characters)"
    if "\x00" in template:
        return "contains a NUL character"
    try:
        template_fields(template)
    except ValueError as exc:
        return f"is not a key template: {exc}"
    return None


def load_policy(path: Path) -> Policy:
    """Read and check the policy file; `PolicyError` names what is wrong."""
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PolicyError(f"policy file {path}: not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise PolicyError(f"policy file {path}: cannot be read ({exc})") from None
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(f"policy file {path}: not valid TOML: {exc}") from None
    return parse_policy(raw, path)


def parse_policy(raw: Mapping[str, Any], path: Path) -> Policy:
    where = f"policy file {path}"
    unknown = sorted(set(raw) - {"tools"})
    if unknown:
        raise PolicyError(
            f"{where}: unknown top-level entry {unknown[0]!r}: the file holds only [tools.<tool name>] tables"
        )
    tables = raw.get("tools", {})
    if not isinstance(tables, dict):
        raise PolicyError(f"{where}: 'tools' must be tables, one per tool: [tools.process_item]")
    if not tables:
        raise PolicyError(f"{where}: guards no tool: add a table such as [tools.process_item] with once = '...'")
    tools = {}
    for name, table in tables.items():
        tools[name] = parse_tool(name, table, where)
    return Policy(path=path, tools=tools)


def parse_tool(name: str, table: Any, where: str) -> ToolPolicy:
    at = f"{where}, [tools.{name}]"
    if not TOOL_NAME_RE.match(name):
        raise PolicyError(f"{at}: {name!r} is not a tool name ({TOOL_NAME_RULE})")
    if not isinstance(table, dict):
        raise PolicyError(f"{at}: must be a table of settings (once, scope, lease_s, limit, units), not a value")
    for key in table:
        if key not in KEYS:
            raise PolicyError(f"{at}: unknown field {key!r}: the fields are {', '.join(KEYS)}")
    once, limit = table.get("once"), table.get("limit")
    if once is None and limit is None:
        raise PolicyError(f"{at}: guards nothing: give once = 'item:{{argument}}', limit = 'name', or both")
    if once is not None:
        if not isinstance(once, str):
            raise PolicyError(f"{at}: once must be a string such as 'ticket:{{item_id}}', not {_kind(once)}")
        problem = check_template(once)
        if problem:
            raise PolicyError(f"{at}: once {problem}")
    scope = table.get("scope", "team")
    if scope not in SCOPES:
        raise PolicyError(f"{at}: scope must be 'team' or 'agent', not {scope!r}")
    if "scope" in table and once is None:
        raise PolicyError(f"{at}: scope says whose ledger holds once's key, and this tool has no once")
    lease = table.get("lease_s", float(DEFAULT_LEASE_S))
    if (
        isinstance(lease, bool)
        or not isinstance(lease, int | float)
        or not math.isfinite(lease)
        or not 1 <= lease <= MAX_LEASE_S
    ):
        raise PolicyError(f"{at}: lease_s must be a number of seconds from 1 to {MAX_LEASE_S}, not {lease!r}")
    if limit is not None and (not isinstance(limit, str) or not re.match(NAME_PATTERN, limit) or ".." in limit):
        raise PolicyError(f"{at}: limit must be a daily limit's name ({NAME_RULE}), not {limit!r}")
    units = table.get("units", 1)
    if "units" in table and limit is None:
        raise PolicyError(f"{at}: units are used of a limit, and this tool has no limit")
    if isinstance(units, bool) or not isinstance(units, int) or not 1 <= units <= MAX_DAILY_LIMIT:
        raise PolicyError(f"{at}: units must be a whole number from 1 to {MAX_DAILY_LIMIT}, not {units!r}")
    return ToolPolicy(tool=name, once=once, scope=scope, lease_s=float(lease), limit=limit, units=units)


def _kind(value: Any) -> str:
    return type(value).__name__
