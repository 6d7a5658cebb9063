"""The gate's policy file is checked whole at start, and every mistake is one message naming the file, the table
and the field; the command line prints it without a traceback and exits 2 (a usage error)."""

from __future__ import annotations

from pathlib import Path

import pytest

from memory_service.cli.main import main
from memory_service.gate.policy import DEFAULT_LEASE_S, PolicyError, ToolPolicy, load_policy


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "gate.toml"
    path.write_text(text)
    return path


def test_a_policy_reads_with_its_defaults(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
[tools.process_item]
once = "ticket:{item_id}"
[tools.send_email]
limit = "emails"
units = 2
[tools.post]
once = "post:{channel}:{day}"
scope = "agent"
lease_s = 30
limit = "posts"
""",
    )
    policy = load_policy(path)
    assert policy.tools["process_item"] == ToolPolicy("process_item", once="ticket:{item_id}")
    assert policy.tools["process_item"].scope == "team" and policy.tools["process_item"].lease_s == DEFAULT_LEASE_S
    assert policy.tools["send_email"] == ToolPolicy("send_email", limit="emails", units=2)
    post = policy.tools["post"]
    assert (post.scope, post.lease_s, post.limit, post.units, post.fields) == (
        "agent",
        30.0,
        "posts",
        1,
        ("channel", "day"),
    )
    assert policy.unknown_tools({"process_item", "send_email"}) == ["post"]


BAD = [
    ('[tools.a]\nonce = "k:{x}"\nonse = 1\n', "[tools.a]: unknown field 'onse'"),
    ('[tools.a]\nscope = "team"\n', "[tools.a]: guards nothing"),
    ('[tools.a]\nonce = "k:{x}"\nscope = "everyone"\n', "[tools.a]: scope must be 'team' or 'agent'"),
    ('[tools.a]\nlimit = "emails"\nscope = "agent"\n', "[tools.a]: scope says whose ledger"),
    ('[tools.a]\nonce = "k:{x}"\nunits = 2\n', "[tools.a]: units are used of a limit"),
    ('[tools.a]\nlimit = "emails"\nunits = 0\n', "[tools.a]: units must be a whole number from 1"),
    ('[tools.a]\nlimit = "emails"\nunits = 1.5\n', "[tools.a]: units must be a whole number"),
    ('[tools.a]\nlimit = "no such"\n', "[tools.a]: limit must be a daily limit's name"),
    ('[tools.a]\nonce = "k:{x}"\nlease_s = 0\n', "[tools.a]: lease_s must be a number of seconds from 1 to 86400"),
    ('[tools.a]\nonce = "k:{x}"\nlease_s = "5m"\n', "[tools.a]: lease_s must be a number"),
    ("[tools.a]\nonce = 42\n", "[tools.a]: once must be a string"),
    ('[tools.a]\nonce = "  "\n', "[tools.a]: once is empty"),
    ('[tools.a]\nonce = "k:{x:>3}"\n', "[tools.a]: once is not a key template: key template 'k:{x:>3}': {x:>3} is"),
    ('[tools.a]\nonce = "k:{x.y}"\n', "[tools.a]: once is not a key template: key template 'k:{x.y}': {x.y} is"),
    ('[tools.a]\nonce = "k:{x"\n', "[tools.a]: once is not a key template: key template 'k:{x' is not valid"),
    ('[tools."a b"]\nonce = "k:{x}"\n', "[tools.a b]: 'a b' is not a tool name"),
    ("[tools]\na = 1\n", "[tools.a]: must be a table of settings"),
    ('[tool.a]\nonce = "k:{x}"\n', "unknown top-level entry 'tool'"),
    ("", "guards no tool"),
    ("[tools.a\n", "not valid TOML: Expected ']'"),
]


@pytest.mark.parametrize(("text", "said"), BAD, ids=[said for _, said in BAD])
def test_each_mistake_names_the_file_the_table_and_the_field(tmp_path: Path, text: str, said: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(PolicyError) as caught:
        load_policy(path)
    assert str(caught.value).startswith(f"policy file {path}"), caught.value
    assert said in str(caught.value), caught.value


def test_a_missing_policy_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match=r"policy file .*nowhere\.toml: not found"):
        load_policy(tmp_path / "nowhere.toml")


def test_the_command_line_prints_the_mistake_without_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, '[tools.process_item]\nonce = "ticket:{item_id}"\nleese_s = 30\n')
    code = main(["gate", "--policy", str(path), "--", "python", "tools.py"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith(f"memory-service gate: configuration error: policy file {path}, [tools.process_item]: "), err
    assert "unknown field 'leese_s'" in err and "Traceback" not in err, err


def test_the_command_line_wants_an_upstream_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, '[tools.process_item]\nonce = "ticket:{item_id}"\n')
    for tail in ([], ["--"]):
        assert main(["gate", "--policy", str(path), *tail]) == 2
        err = capsys.readouterr().err
        assert "no upstream command" in err and "-- python my_tools.py" in err, err


def test_http_beyond_loopback_wants_a_token_as_mcp_does(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, '[tools.process_item]\nonce = "ticket:{item_id}"\n')
    code = main(["gate", "--policy", str(path), "--transport", "http", "--host", "0.0.0.0", "--", "python", "t.py"])
    err = capsys.readouterr().err
    assert code == 2 and "refusing to serve MCP over HTTP on 0.0.0.0 without a token" in err, err


def test_a_bad_agent_id_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, '[tools.process_item]\nonce = "ticket:{item_id}"\n')
    assert main(["gate", "--policy", str(path), "--agent-id", "triage 2", "--", "python", "t.py"]) == 2
    err = capsys.readouterr().err
    assert "--agent-id 'triage 2' is not an agent id" in err and "Traceback" not in err, err
