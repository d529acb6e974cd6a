"""The tool-call parser on whole and cut-off outputs of each format it reads, and the call streamer
fed those parses token by token. No model: these run in milliseconds."""

from __future__ import annotations

import json

import pytest

from engine_service.text.tool_parser import CALL_OPEN, ParsedCall, ReplySplitter, parse_reply, parse_tool_calls
from engine_service.text.tools import CallStreamer

TOOLS = {"weather", "get_time"}
PARIS = '{"city": "Paris"}'
TAGGED = (f'<tool_call>{{"name": "weather", "arguments": {PARIS}}}</tool_call>\n'
          f'<tool_call>{{"name": "get_time", "arguments": {{"city": "Rome"}}}}</tool_call>')
BARE = f'[{{"name": "weather", "arguments": {PARIS}}}, {{"name": "get_time", "arguments": {{"city": "Rome"}}}}]'
PYTHONIC = '[weather(city="Paris"), get_time(city="Rome")]'
WHOLE = [ParsedCall("weather", PARIS), ParsedCall("get_time", '{"city": "Rome"}')]


@pytest.mark.parametrize("text", [TAGGED, BARE, PYTHONIC, TAGGED + "\n"], ids=["tagged", "bare", "pythonic", "newline"])
def test_whole_outputs_give_each_call_exactly(text: str) -> None:
    assert parse_tool_calls(text, TOOLS) == WHOLE


@pytest.mark.parametrize("text", [TAGGED, BARE, PYTHONIC], ids=["tagged", "bare", "pythonic"])
def test_every_cut_of_an_output_keeps_complete_calls_exact_and_markup_out(text: str) -> None:
    """Cut after each character: complete calls are whole and valid, a last partial call is the
    start of its final arguments, and no markup reaches a name or arguments."""
    for cut in range(len(text) + 1):
        calls = parse_tool_calls(text[:cut], TOOLS, truncated=True)
        assert calls is not None, text[:cut]
        assert len(calls) <= 2
        for k, call in enumerate(calls):
            assert "<" not in call.arguments and "tool_call" not in call.arguments, text[:cut]
            assert call.name == WHOLE[k].name
            if call.complete:
                assert call == WHOLE[k], text[:cut]
                json.loads(call.arguments)
            else:
                assert k == len(calls) - 1, "only the last call may be partial"
                assert WHOLE[k].arguments.startswith(call.arguments), (text[:cut], call.arguments)


def test_the_issue_7_output_is_four_calls_not_one() -> None:
    call = '<tool_call>{"name": "weather", "arguments": {"city": "%s"}}</tool_call>'
    text = "\n".join([call % "Paris"] * 3 + [(call % "Portspring")[:-6]])
    calls = parse_tool_calls(text, TOOLS, truncated=True)
    assert [c.arguments for c in calls] == [PARIS, PARIS, PARIS, '{"city": "Portspring"}']
    assert all(c.complete for c in calls), "a closing tag cut after a complete body leaves the call complete"
    text = "\n".join([call % "Paris", '<tool_call>{"name": "weather", "arguments": {"city": "Po'])
    assert parse_tool_calls(text, TOOLS, truncated=True) == [
        ParsedCall("weather", PARIS), ParsedCall("weather", '{"city": "Po', complete=False)]


def test_a_cut_before_the_name_is_complete_leaves_the_call_out() -> None:
    for text in ['<tool_call>{"name": "weat', "<tool_", '{"na', "[", "weath", '[weather(city="Paris"), get_ti']:
        calls = parse_tool_calls(text, TOOLS, truncated=True)
        assert calls is not None and all(c.name != "get_time" for c in calls), text
        assert not [c for c in calls if not c.complete], text


def test_a_cut_pythonic_call_keeps_its_completed_keyword_arguments() -> None:
    calls = parse_tool_calls('weather(city="Paris", unit="cel', {"weather"}, truncated=True)
    assert calls == [ParsedCall("weather", PARIS[:-1], complete=False)]


@pytest.mark.parametrize("text", [
    "The weather in Paris is sunny.",
    '<tool_call>{"name": "unknown", "arguments": {}}</tool_call>',
    '<tool_call>{"name": "weather", "arguments": {}}</tool_call> and some prose',
    '<tool_call>not json</tool_call>',
    '{"name": "weather", "arguments": [1]}',
    "print(1)",
    "",
])
def test_text_that_is_not_calls_is_none(text: str) -> None:
    assert parse_tool_calls(text, TOOLS) is None


def test_an_unfinished_output_that_was_not_cut_is_not_calls() -> None:
    assert parse_tool_calls('<tool_call>{"name": "weather", "arguments": {"ci', TOOLS) is None
    assert parse_tool_calls('<tool_call>{"name": "weather", "arguments": {}}', TOOLS) == [
        ParsedCall("weather", "{}")], "a model may end without the closing tag"


def test_arguments_written_as_a_json_string_are_decoded() -> None:
    text = '{"name": "weather", "arguments": "{\\"city\\": \\"Paris\\"}"}'
    assert parse_tool_calls(text, TOOLS) == [ParsedCall("weather", PARIS)]


def test_streamed_pieces_concatenate_to_the_final_calls() -> None:
    """The streamer fed the parse after every character sends each call's id and name once and
    argument pieces that add up to exactly the final arguments."""
    streamer = CallStreamer()
    deltas = []
    for cut in range(len(TAGGED) + 1):
        deltas += streamer.feed(parse_tool_calls(TAGGED[:cut], TOOLS, truncated=True))
    names = {d.index: d.name for d in deltas if d.id}
    arguments: dict[int, str] = {}
    for delta in deltas:
        arguments[delta.index] = arguments.get(delta.index, "") + delta.arguments
    assert names == {0: "weather", 1: "get_time"}
    assert [arguments[0], arguments[1]] == [c.arguments for c in WHOLE]
    assert len(set(streamer.ids)) == 2


def test_a_closing_tag_inside_an_unfinished_string_ends_up_in_no_arguments() -> None:
    """Seen with seed 16: the model forgot the closing quote, wrote its closing tag and went on."""
    text = '<tool_call>{"name": "weather", "arguments": {"city": "Paris}}</tool_call>All tourist modes to'
    streamer, deltas = CallStreamer(), []
    for cut in range(len(text) + 1):
        calls = parse_tool_calls(text[:cut], TOOLS, truncated=True)
        deltas += streamer.feed(calls)
    assert calls == [ParsedCall("weather", '{"city": "Paris}}', complete=False)]
    assert "".join(d.arguments for d in deltas) == '{"city": "Paris}}'


PROSE = "I'll check the weather for you."
FENCED = f"Write a call like this:\n```\n{TAGGED}\n```\nThat is all."
WEATHER_CALL, TIME_CALL = TAGGED.splitlines()


@pytest.mark.parametrize("text, content, calls", [
    (f"{PROSE}\n{TAGGED}", PROSE, WHOLE),
    (f"{PROSE}\n{WEATHER_CALL}", PROSE, WHOLE[:1]),
    (f"{PROSE} {TAGGED}\n\n", PROSE, WHOLE),
    (f"{TAGGED}\n \n", "", WHOLE),
    (f"```python\nprint(1)\n```\n{PROSE}\n{TAGGED}", f"```python\nprint(1)\n```\n{PROSE}", WHOLE),
    (FENCED, FENCED, None),
    (f"{PROSE}\n{TAGGED}\nI'll tell you.", f"{PROSE}\nI'll tell you.", WHOLE),
    (f"{TAGGED}\n\nI'll tell you.", "I'll tell you.", WHOLE),
    (f"{PROSE}\n{WEATHER_CALL}\nAnd the time:\n{TIME_CALL}", f"{PROSE}\nAnd the time:", WHOLE),
    (f"Use {CALL_OPEN} tags.", f"Use {CALL_OPEN} tags.", None),
    (f"Use {CALL_OPEN} tags:\n{WEATHER_CALL}", f"Use {CALL_OPEN} tags:", WHOLE[:1]),
    ('<tool_call>{"name": "unknown", "arguments": {}}</tool_call> and prose',
     '<tool_call>{"name": "unknown", "arguments": {}}</tool_call> and prose', None),
    (PROSE, PROSE, None),
], ids=["two-calls", "one-call", "trailing-whitespace", "calls-only", "fence-before", "in-a-fence", "prose-after",
        "calls-then-prose", "prose-between", "a-mention", "a-mention-then-a-call", "an-unknown-tool", "prose-only"])
def test_prose_and_tagged_calls_are_content_and_calls(text: str, content: str, calls: list | None) -> None:
    """The prose before, between and after tagged calls is content (vLLM's and SGLang's parsers of
    this format keep only the prose before the first call); a tag in a code fence is an example, and a
    tag that holds no call of a known tool is text."""
    assert parse_reply(text, TOOLS) == (content, calls)


def read_in_pieces(text: str, step: int, truncated: bool = False) -> list[str | ParsedCall]:
    """What a ReplySplitter gives back for `text` fed `step` characters at a time, adjacent prose joined;
    checks on the way that the prose given back never holds a tag that the whole reading does not."""
    splitter, pieces = ReplySplitter(TOOLS), []
    markup_is_text = CALL_OPEN in parse_reply(text, TOOLS, truncated)[0]
    for at in range(0, len(text), step):
        got = splitter.feed(text[at:at + step])
        assert markup_is_text or not any(isinstance(p, str) and "<" in p for p in got), (text, got)
        pieces += got
    pieces += splitter.finish(truncated)
    joined: list[str | ParsedCall] = []
    for piece in pieces:
        if isinstance(piece, str) and joined and isinstance(joined[-1], str):
            joined[-1] += piece
        else:
            joined.append(piece)
    return joined


@pytest.mark.parametrize("text", [f"{PROSE}\n{TAGGED}", FENCED, f"Use {CALL_OPEN} tags.", f"{PROSE}\n\n",
                                  f"a``b`\n```\n{CALL_OPEN}\n```\n{PROSE}\n{TAGGED}",
                                  f"{PROSE}\n{WEATHER_CALL}\nAnd the time:\n{TIME_CALL}\nThat is all.",
                                  f"Use {CALL_OPEN} tags:\n{WEATHER_CALL}\n"])
@pytest.mark.parametrize("step", [1, 2, 5])
def test_prose_and_calls_stream_in_order_and_add_up_to_the_whole_reading(text: str, step: int) -> None:
    """Fed in pieces, the prose and calls come back in the order written, without markup in the prose,
    and add up to the whole text's reading."""
    pieces = read_in_pieces(text, step)
    content, calls = parse_reply(text, TOOLS)
    assert "".join(p for p in pieces if isinstance(p, str)) == content
    assert [p for p in pieces if isinstance(p, ParsedCall)] == (calls or [])


def test_prose_after_calls_comes_after_them() -> None:
    text = f"{PROSE}\n{WEATHER_CALL}\nAnd the time:\n{TIME_CALL}\nThat is all."
    assert read_in_pieces(text, 1) == [PROSE, WHOLE[0], "\nAnd the time:", WHOLE[1], "\nThat is all."]


def test_a_call_comes_back_as_soon_as_its_closing_tag_does() -> None:
    splitter = ReplySplitter(TOOLS)
    assert splitter.feed(f"{PROSE}\n{WEATHER_CALL[:-1]}") == [PROSE]
    assert splitter.feed(">") == [WHOLE[0]]


def test_a_reply_cut_in_its_second_call_keeps_the_prose_and_the_calls_so_far() -> None:
    text = f"{PROSE}\n{WEATHER_CALL}\nThen {TIME_CALL[:40]}"
    assert parse_reply(text, TOOLS, truncated=True) == (f"{PROSE}\nThen", [WHOLE[0], ParsedCall("get_time", "", False)])
    assert parse_reply(text, TOOLS) == (f"{PROSE}\nThen {TIME_CALL[:40]}", WHOLE[:1]), "not cut: text"


def test_prose_cut_while_writing_a_tag_leaves_the_tag_out() -> None:
    text = f"{PROSE}\n<tool_c"
    assert parse_reply(text, TOOLS, truncated=True) == (PROSE, None)
    assert parse_reply(text, TOOLS) == (text, None), "not cut: the model wrote it as text"


@pytest.mark.parametrize("text", [
    '{"name": "weather", "country": "France"}',
    '{"name": "weather"}',
    '[{"name": "weather"}]',
])
def test_a_bare_object_without_arguments_is_no_call(text: str) -> None:
    """The Agents SDK's output_type answer `{"name": <a tool's name>, ...}` was read as that tool's call."""
    assert parse_tool_calls(text, TOOLS) is None


def test_a_tagged_call_may_leave_out_its_arguments() -> None:
    assert parse_tool_calls('<tool_call>{"name": "weather"}</tool_call>', TOOLS) == [ParsedCall("weather", "{}")]
