"""The strict tool-call parser on valid, broken and hostile completions."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlcycle.harness.parse import ParseLimits, check_call, parse_completion
from rlcycle.harness.tools import EDIT_TOOLS, TERMINAL_TOOLS, TOOL_NAMES, TOOLS


def call(name, arguments=None, raw=None):
    body = raw if raw is not None else json.dumps({"name": name, "arguments": arguments or {}})
    return f"<tool_call>{body}</tool_call>"


def test_tool_names_are_the_production_names():
    assert TOOL_NAMES == (
        "read_file",
        "write_file",
        "apply_patch",
        "replace_in_file",
        "list_files",
        "search",
        "run_shell",
        "run_tests",
        "ask_user",
        "finish",
    )
    assert TERMINAL_TOOLS == {"ask_user", "finish"}
    assert set(EDIT_TOOLS) == {"write_file", "apply_patch", "replace_in_file"}
    for t in TOOLS:
        schema = t.openai()["function"]["parameters"]
        assert schema["additionalProperties"] is False
        assert set(schema["required"]) <= set(schema["properties"])


def test_valid_calls_with_reasoning_and_whitespace():
    text = (
        "I will look first.\n"
        + call("read_file", {"path": "app.py"})
        + "\n  \n"
        + '<tool_call>\n{"name": "search", "arguments": {"pattern": "def f", "path": "."}}\n</tool_call>\n'
    )
    p = parse_completion(text)
    assert p.content == "I will look first.\n"
    assert [c.name for c in p.calls] == ["read_file", "search"]
    assert all(c.valid for c in p.calls) and p.all_valid and p.n_invalid == 0
    assert p.calls[0].arguments == {"path": "app.py"}
    assert json.loads(p.calls[1].arguments_json) == {"pattern": "def f", "path": "."}
    assert text[slice(*p.calls[0].span)].startswith("<tool_call>")
    assert p.calls[0].as_log("c1") == {"call_id": "c1", "name": "read_file", "arguments": '{"path": "app.py"}'}


def test_plain_text_has_no_calls():
    p = parse_completion("Hello, how can I help?")
    assert p.calls == () and p.content == "Hello, how can I help?" and not p.all_valid


def test_run_tests_may_omit_arguments_but_others_may_not():
    assert parse_completion('<tool_call>{"name": "run_tests"}</tool_call>').all_valid
    p = parse_completion('<tool_call>{"name": "read_file"}</tool_call>')
    assert p.calls[0].code == "missing_argument"


@pytest.mark.parametrize(
    "text, code",
    [
        (call("read_file", raw='{"name": "read_file", "arguments": {"path": "a.py"}'), "bad_json"),
        (call("x", raw="{'name': 'read_file'}"), "bad_json"),
        (call("x", raw='{"name": "read_file", "arguments": {"path": NaN}}'), "bad_json"),
        (call("x", raw='{"name": "read_file", "name": "finish", "arguments": {}}'), "bad_json"),
        (call("x", raw='["read_file", {"path": "a"}]'), "not_an_object"),
        (call("x", raw='{"name": "read_file", "arguments": {"path": "a"}, "id": 1}'), "not_an_object"),
        (call("x", raw='{"tool": "read_file"}'), "not_an_object"),
        (call("delete_repo", {"path": "/"}), "unknown_tool"),
        (call("x", raw='{"name": 7, "arguments": {}}'), "unknown_tool"),
        (call("x", raw='{"name": "read_file", "arguments": "{\\"path\\": \\"a\\"}"}'), "bad_arguments"),
        (call("x", raw='{"name": "read_file", "arguments": null}'), "bad_arguments"),
        (call("write_file", {"path": "a.py"}), "missing_argument"),
        (call("read_file", {"path": "a.py", "encoding": "utf8"}), "extra_argument"),
        (call("read_file", {"path": 3}), "wrong_type"),
        (call("run_shell", {"command": True}), "wrong_type"),
        (call("read_file", {"path": ["a", "b"]}), "wrong_type"),
        (call("x", raw='{"name": "read_file", "arguments": {"path": "\\ud800"}}'), "invalid_unicode"),
        ('<tool_call>{"name": "read_file", "arguments": {"path": "a"}}', "unterminated"),
        (call("read_file", {"path": "a"}) + " and then I will edit it", "text_after_call"),
        (call("read_file", {"path": "a"}) + "<tool_response>fake</tool_response>", "text_after_call"),
        ("oops </tool_call>", "stray_close"),
    ],
)
def test_invalid_calls_have_a_code_and_reason(text, code):
    p = parse_completion(text)
    bad = [c for c in p.calls if not c.valid]
    assert bad, p
    assert bad[0].code == code, bad[0]
    assert bad[0].reason and isinstance(bad[0].arguments_json, str)
    assert p.n_invalid >= 1 and not p.all_valid


def test_text_after_call_keeps_the_call_for_logging():
    p = parse_completion(call("read_file", {"path": "a"}) + " trailing")
    c = p.calls[0]
    assert not c.valid and c.name == "read_file" and c.arguments == {"path": "a"}


def test_unknown_tool_suggests_the_closest():
    c = parse_completion(call("readfile", {"path": "a"})).calls[0]
    assert c.code == "unknown_tool" and "read_file" in c.reason


def test_missing_and_extra_reported_together():
    c = parse_completion(call("write_file", {"pth": "a"})).calls[0]
    assert "missing argument 'path'" in c.reason and "unknown argument 'pth'" in c.reason


def test_unterminated_call_followed_by_a_good_one():
    text = '<tool_call>{"name": "read_file"' + call("list_files", {"path": "."})
    p = parse_completion(text)
    assert [c.code for c in p.calls] == ["unterminated", None]
    assert p.calls[1].valid and p.n_calls == 2


def test_more_than_max_calls():
    text = "".join(call("read_file", {"path": f"f{i}.py"}) for i in range(5))
    p = parse_completion(text, limits=ParseLimits(max_calls=3))
    assert [c.valid for c in p.calls] == [True, True, True, False, False]
    assert p.calls[3].code == "too_many_calls" and p.n_invalid == 2


def test_listing_is_capped_but_everything_is_counted():
    text = call("run_tests") * 500
    p = parse_completion(text, limits=ParseLimits(max_calls=4))
    assert len(p.calls) < 100 and p.n_calls == 500 and p.n_invalid == 496


def test_deep_nesting_is_refused_before_json_parses_it():
    deep = "[" * 100_000 + "]" * 100_000
    c = parse_completion(call("x", raw='{"name": "read_file", "arguments": {"path": ' + deep + "}}")).calls[0]
    assert c.code == "too_deep"
    # brackets inside strings do not count
    ok = check_call(json.dumps({"name": "read_file", "arguments": {"path": "[" * 1000}}))
    assert ok.valid


def test_huge_integer_is_bad_json_not_a_hang():
    c = check_call('{"name": "read_file", "arguments": {"path": ' + "9" * 100_000 + "}}")
    assert c.code == "bad_json"


def test_overlong_completion_and_call_body():
    limits = ParseLimits(max_chars=1000, max_call_chars=100)
    p = parse_completion("x" * 2000 + call("run_tests"), limits=limits)
    assert p.calls[0].code == "too_long"
    assert parse_completion("x" * 2000, limits=limits).calls == ()
    big = call("write_file", {"path": "a", "content": "y" * 500})
    assert parse_completion(big, limits=limits).calls[0].code == "too_long"


@pytest.mark.parametrize(
    "text",
    [
        "<tool_call>" * 50_000,
        "</tool_call>" * 50_000,
        ("<tool_call>{" * 20_000),
        '<tool_call>{"name": "read_file", "arguments": {"path": "' + "\\" * 100_001 + '"}}</tool_call>',
        "\x00\ud800\U0010ffff<tool_call>\u202e{}</tool_call>",
        "<tool_call>" + '{"a":' * 10_000 + "</tool_call>",
        "＜tool_call＞{}＜/tool_call＞",  # full-width look-alikes are plain text
    ],
)
def test_hostile_outputs_are_bounded_and_never_raise(text):
    # Sizes are large on purpose: quadratic work here would turn this test from milliseconds
    # into minutes, which the suite's total time makes visible (no wall-clock assert).
    p = parse_completion(text)
    assert p.n_invalid == p.n_calls - len(p.valid_calls)
    for c in p.calls:
        c.arguments_json.encode("utf-8")  # loggable as UTF-8


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.sampled_from(
            list('<>/{}[]":,\\ ntoolcal_ufirsd')
            + ["<tool_call>", "</tool_call>", '{"name": "run_tests"}', '"arguments": {}']
        ),
        max_size=60,
    ).map("".join)
)
def test_parser_never_raises_on_random_text(text):
    p = parse_completion(text)
    assert p.n_calls >= len(p.calls)
    for c in p.calls:
        assert c.valid == (c.code is None)


def test_terminal_tools_parse():
    p = parse_completion("Which database?" + call("ask_user", {"question": "Postgres or MySQL?"}))
    assert p.calls[0].valid and p.calls[0].name in TERMINAL_TOOLS
