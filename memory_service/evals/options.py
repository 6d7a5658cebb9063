"""The options of `memory-service eval`, apart from the harnesses.

Every `memory-service` command builds the full parser, `eval` included, so these
definitions must import nothing heavy: the harnesses (httpx, service runners) load
only when an eval actually runs.
"""

from __future__ import annotations

import argparse

from ..config import ClientEnv


def _recall_budget(value: str) -> int:
    """The reader's context is recall's own, asked with this `max_tokens`: recall's bounds apply."""
    try:
        tokens = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number of tokens") from None
    if not 32 <= tokens <= 32768:
        raise argparse.ArgumentTypeError(f"{tokens} is outside recall's max_tokens bounds, 32 to 32768")
    return tokens


def add_eval_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument(
        "--data", action="append", default=[], help="a LoCoMo .json or PersonaExt .jsonl file (all but --agent)"
    )
    parser.add_argument("--out", default="eval-results")
    env = ClientEnv.from_env()
    parser.add_argument("--url", default=env.url, help="evaluate a running service")
    parser.add_argument("--api-key", default=env.api_key)
    parser.add_argument(
        "--limit", type=int, default=None, help="only the first N conversations / utterances (--agent: tasks)"
    )
    parser.add_argument("--model", default="default", help="model of the self-started service")
    parser.add_argument("--llm-url", default=None, help="self-started service: reuse this llama-server")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="MEMORY_NAME=VALUE",
        dest="settings",
        help="self-started service: this setting too (repeatable), e.g. MEMORY_EXTRACT_COMPLETE=0 "
        "to measure without it",
    )
    parser.add_argument(
        "--consolidate",
        action="store_true",
        help="self-started service: MEMORY_CONSOLIDATE=1, and wait for consolidation before asking",
    )
    add_agent_arguments(parser)
    add_answer_arguments(parser)
    return parser


def add_answer_arguments(parser: argparse.ArgumentParser) -> None:
    """LoCoMo: evidence recall within a token budget and a reader's answers (memory_service/evals/budget, reader)."""
    group = parser.add_argument_group("budgeted recall and answers (LoCoMo)")
    group.add_argument(
        "--tokenizer-url", default=None, help="llama-server whose /tokenize counts the budget (default: the service's)"
    )
    group.add_argument("--no-reader", action="store_true", help="budgeted recall only: no reader, no answers")
    group.add_argument("--reader-url", default=None, help="the reader: any OpenAI-compatible endpoint")
    group.add_argument(
        "--reader-model",
        default=None,
        help="without --reader-url: its own llama-server's model (default large); with it: the `model` field sent",
    )
    group.add_argument("--reader-threads", type=int, default=None, help="threads of the reader's own llama-server")
    group.add_argument(
        "--reader-budget", type=_recall_budget, default=512, help="tokens of context the reader gets (32-32768)"
    )
    group.add_argument("--reader-limit", type=int, default=None, help="the reader answers only the first N questions")
    group.add_argument("--judge-url", default=None, help="an OpenAI-compatible LLM judge of the answers (J)")
    group.add_argument("--judge-model", default=None, help="the `model` field sent to --judge-url, if it needs one")


def add_agent_arguments(parser: argparse.ArgumentParser) -> None:
    """`--agent`: a small model as the agent, in a real loop over the MCP server (memory_service/evals/agent_*)."""
    agent = parser.add_argument_group("agent-in-the-loop eval (--agent)")
    agent.add_argument(
        "--agent", action="store_true", help="run the agent eval: a model works scripted tasks through the MCP tools"
    )
    agent.add_argument("--agent-url", default=None, help="the agent: any OpenAI-compatible endpoint with tool calling")
    agent.add_argument(
        "--agent-model", default="large", help="without --agent-url: model of the agent's own llama-server"
    )
    agent.add_argument(
        "--agent-model-name", default=None, help="the `model` field sent to --agent-url, if it needs one"
    )
    agent.add_argument(
        "--agent-threads", type=int, default=None, help="threads of the agent's own llama-server (default: every core)"
    )
    agent.add_argument(
        "--profiles",
        default="off,core,core+brief,full,gate,proxy,gate+proxy",
        help="comma-separated: off (no memory tools, the baseline), core, core+brief (core, and a recall of the "
        "session's prompt put in its system prompt first), full, gate (no memory tools; the task's tools behind "
        "`memory-service gate`), proxy (no memory tools; the model behind `memory-service proxy`), gate+proxy",
    )
    agent.add_argument("--tasks", action="append", default=None, help="only this task (repeatable); default all")
    agent.add_argument(
        "--sessions-timeout", type=float, default=300.0, help="seconds one session may take before it is cut"
    )
    agent.add_argument(
        "--seeds",
        type=int,
        default=None,
        help="runs of each task per profile, one seed each (default 3; 1 with --greedy)",
    )
    agent.add_argument(
        "--profile-seeds",
        default="off=1,full=1",
        metavar="PROFILE=N,...",
        help="these profiles run N seeds instead of --seeds (default off=1,full=1; '' for none)",
    )
    agent.add_argument(
        "--greedy", action="store_true", help="temperature 0 (no prompt cache) instead of the model card's sampling"
    )
    agent.add_argument(
        "--agent-sampling",
        default=None,
        metavar="JSON",
        help='request fields over the sampling, e.g. \'{"temperature": 0.6, "top_k": null}\' (null drops one)',
    )


def eval_parser(description: str = "memory-service eval", prog: str = "memory-service eval") -> argparse.ArgumentParser:
    """The same options as `memory-service eval`, for `python -m memory_service.evals`."""
    return add_eval_arguments(argparse.ArgumentParser(prog=prog, description=description))
