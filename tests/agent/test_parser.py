"""The streaming parser: chunking invariance, byte-exact bodies, never raises."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.parser import (
    CallOpened,
    MalformedCall,
    ParamDelta,
    ParsedCall,
    StreamParser,
    TextDelta,
    encode_call,
    encode_param,
)


def parse_chunks(chunks: list[str]) -> list:
    p = StreamParser()
    events = []
    for c in chunks:
        events += p.feed(c)
    return events + p.finish()


def parse_bytes(data: bytes, cuts: list[int]) -> list:
    p = StreamParser()
    events = []
    prev = 0
    for cut in sorted(set(cuts)) + [len(data)]:
        events += p.feed_bytes(data[prev:cut])
        prev = cut
    return events + p.finish()


def coalesce(events: list) -> list:
    """Merge adjacent deltas: only their split may depend on chunking."""
    out: list = []
    for e in events:
        if out and isinstance(e, TextDelta) and isinstance(out[-1], TextDelta):
            out[-1] = TextDelta(out[-1].text + e.text)
        elif (
            out and isinstance(e, ParamDelta) and isinstance(out[-1], ParamDelta)
            and (out[-1].index, out[-1].param) == (e.index, e.param)
        ):
            out[-1] = ParamDelta(e.index, e.param, out[-1].text + e.text)
        else:
            out.append(e)
    return out


def calls(events: list) -> list:
    return [e for e in events if isinstance(e, ParsedCall | MalformedCall)]


def text(events: list) -> str:
    return "".join(e.text for e in events if isinstance(e, TextDelta))


CODE = 'if a < b && c > d:\n    s = "x]]>y" + \'<param>\' + "&amp;"\n'


def test_text_and_one_call() -> None:
    stream = "Let me look.\n" + encode_call("read_file", {"path": "a.py"}) + "\nDone."
    events = parse_chunks([stream])
    assert text(events) == "Let me look.\n\nDone."
    assert calls(events) == [ParsedCall(0, "read_file", (("path", "a.py"),))]


def test_raw_code_with_markup_characters_is_byte_exact() -> None:
    stream = f'<tool_call name="write_file"><param name="content">{CODE}</param></tool_call>'
    [call] = calls(parse_chunks([stream]))
    assert call.params == (("content", CODE),)


def test_cdata_and_split_cdata() -> None:
    value = "a</param>b]]>c"
    stream = f'<tool_call name="w"><param name="v">{encode_param(value)}</param></tool_call>'
    assert "<![CDATA[" in stream
    [call] = calls(parse_chunks([stream]))
    assert call.params == (("v", value),)


def test_call_emitted_at_closing_tag_before_stream_ends() -> None:
    p = StreamParser()
    events = p.feed('<tool_call name="x"><param name="a">1</param></tool_call')
    assert not calls(events)
    events = p.feed(">and the model keeps talking")
    assert calls(events) == [ParsedCall(0, "x", (("a", "1"),))]


def test_partial_param_deltas_stream_before_call_completes() -> None:
    p = StreamParser()
    evs = p.feed('<tool_call name="edit_file"><param name="replace">def f():\n')
    evs += p.feed("    return 1\n")
    assert isinstance(evs[0], CallOpened) and evs[0].name == "edit_file"
    deltas = [e for e in evs if isinstance(e, ParamDelta)]
    assert "".join(d.text for d in deltas) == "def f():\n    return 1\n"
    assert not calls(evs)


def test_lookalike_tags_are_text() -> None:
    stream = "a <tool_callx> b <tool_cal <toolbox> </tool_call> <param>"
    events = parse_chunks(list(stream))
    assert text(events) == stream
    assert not calls(events)


def test_unclosed_call_at_end_of_stream() -> None:
    [err] = calls(parse_chunks(['<tool_call name="grep"><param name="pattern">x']))
    assert isinstance(err, MalformedCall)
    assert "unclosed" in err.message and "grep" in err.message


def test_garbage_inside_call_is_reported_and_stream_recovers() -> None:
    stream = '<tool_call name="x">oops</tool_call>after<tool_call name="y"/>'
    events = parse_chunks([stream])
    err, ok = calls(events)
    assert isinstance(err, MalformedCall) and "'oops'" in err.message and "expected" in err.message
    assert ok == ParsedCall(1, "y", ())
    assert text(events) == "after"


def test_missing_name_and_bad_attributes() -> None:
    a, b = calls(parse_chunks(['<tool_call>x</tool_call><tool_call name="a" foo="1"></tool_call>']))
    assert isinstance(a, MalformedCall) and "name=" in a.message
    assert isinstance(b, MalformedCall) and "foo" in b.message


def test_external_entity_is_never_resolved(tmp_path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET")
    stream = (
        f'<!DOCTYPE r [<!ENTITY xxe SYSTEM "file://{secret}">]>'
        '<tool_call name="&xxe;"><param name="p">&xxe;</param></tool_call>'
        '<tool_call name="read_file"><param name="path">&xxe;</param></tool_call>'
    )
    events = parse_chunks([stream])
    assert "TOP-SECRET" not in repr(events)
    bad, good = calls(events)
    assert isinstance(bad, MalformedCall) and "xxe" in bad.message
    assert good.params == (("path", "&xxe;"),)  # raw text: no expansion


def test_billion_laughs_does_nothing() -> None:
    lol = '<!DOCTYPE lolz [<!ENTITY lol "lol">' + "".join(
        f'<!ENTITY lol{i} "{("&lol%d;" % (i - 1) if i > 1 else "&lol;") * 10}">' for i in range(1, 10)
    ) + "]>"
    stream = lol + '<tool_call name="x" a="&lol9;"/><tool_call name="y"><param name="v">&lol9;</param></tool_call>'
    events = parse_chunks([stream])
    bad, good = calls(events)
    assert isinstance(bad, MalformedCall)
    assert good.params == (("v", "&lol9;"),)
    assert len(repr(events)) < 10_000


def test_oversized_tag_and_call_are_refused() -> None:
    p = StreamParser(max_tag_chars=64, max_call_chars=100)
    events = p.feed('<tool_call name="' + "a" * 100 + '"></tool_call>')
    events += p.feed('<tool_call name="w"><param name="c">' + "x" * 200 + "</param></tool_call>")
    events += p.finish()
    a, b = calls(events)
    assert "longer than 64" in a.message
    assert "larger than 100" in b.message


def test_multibyte_split_inside_code_point() -> None:
    s = 'é≈😀 <tool_call name="w"><param name="c">ünï😀</param></tool_call>'
    data = s.encode()
    events = parse_bytes(data, list(range(1, len(data))))
    assert text(events) == "é≈😀 "
    assert calls(events)[0].params == (("c", "ünï😀"),)


def test_dispatch_happens_per_call_in_stream_order() -> None:
    p = StreamParser()
    seen = []
    stream = "".join(encode_call("t", {"i": str(i)}) for i in range(5))
    for ch in stream:
        seen += [e.index for e in p.feed(ch) if isinstance(e, ParsedCall)]
    assert seen == [0, 1, 2, 3, 4]


# -- properties ---------------------------------------------------------------

_pieces = st.sampled_from(
    ["<", ">", "&", "]]>", "<![CDATA[", "</param>", "<param", "<tool_call", "</tool_call>", '"', "\n", " ",
     'name="a"', "x", "é", "😀", "/>", "<tool_call name=\"t\">", '<param name="p">']
)
_noise = st.lists(st.one_of(_pieces, st.text(max_size=5)), max_size=40).map("".join)


@st.composite
def streams_with_cuts(draw):
    stream = draw(_noise)
    data = stream.encode()
    cuts = draw(st.lists(st.integers(0, len(data)), max_size=30))
    return data, cuts


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(streams_with_cuts())
def test_property_any_split_gives_same_events_and_never_raises(case) -> None:
    data, cuts = case
    whole = coalesce(parse_bytes(data, []))
    split = coalesce(parse_bytes(data, cuts))
    one_by_one = coalesce(parse_bytes(data, list(range(len(data)))))
    assert whole == split == one_by_one


_values = st.lists(st.one_of(_pieces, st.text()), max_size=20).map("".join)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.tuples(st.sampled_from(["path", "content", "search", "x"]), _values), max_size=4),
    st.text(alphabet=st.characters(blacklist_characters="<"), max_size=30),
    st.lists(st.integers(0, 2000), max_size=20),
)
def test_property_parameter_bodies_are_byte_exact(params, prose, cuts) -> None:
    stream = prose + encode_call("tool", params) + prose
    data = stream.encode("utf-8", "surrogatepass")
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return  # lone surrogates are not valid model output
    events = parse_bytes(data, [c for c in cuts if c <= len(data)])
    [call] = calls(events)
    assert call == ParsedCall(0, "tool", tuple(params))
    assert text(events) == prose + prose


@settings(max_examples=200)
@given(st.binary(max_size=300))
def test_property_arbitrary_bytes_never_raise(data: bytes) -> None:
    events = parse_bytes(data, list(range(0, len(data), 7)))
    assert all(isinstance(e, TextDelta | CallOpened | ParamDelta | ParsedCall | MalformedCall) for e in events)


def test_broken_call_never_runs_text_from_its_parameters() -> None:
    # An unquoted attribute breaks the param tag; the body documents calls.
    body = 'Example:\n<tool_call name="run_command"><param name="command">rm -rf src</param></tool_call>\n'
    stream = f'<tool_call name="write_file"><param name=path>docs.md</param><param name="content">{body}</param></tool_call>'
    for chunks in ([stream], list(stream)):
        events = parse_chunks(chunks)
        assert len(calls(events)) == 1
        [bad] = calls(events)
        assert isinstance(bad, MalformedCall) and bad.name == "write_file"
        assert "run_command" not in repr([e for e in events if isinstance(e, ParsedCall)])


def test_stray_tag_inside_call_is_skipped_structurally() -> None:
    stream = '<tool_call name="a"><oops/><param name="p">x</tool_call>y</param></tool_call>after'
    events = parse_chunks(list(stream))
    [bad] = calls(events)
    assert isinstance(bad, MalformedCall) and "'<oops/>'" in bad.message
    assert text(events) == "after"


def _parse_small(data: bytes, cuts: list[int]) -> list:
    p = StreamParser(max_tag_chars=30, max_call_chars=10)
    events, prev = [], 0
    for cut in sorted(set(cuts)) + [len(data)]:
        events += p.feed_bytes(data[prev:cut])
        prev = cut
    return events + p.finish()


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(streams_with_cuts())
def test_property_chunking_invariance_at_the_size_caps(case) -> None:
    data, cuts = case
    assert coalesce(_parse_small(data, [])) == coalesce(_parse_small(data, cuts)) == coalesce(
        _parse_small(data, list(range(len(data))))
    )


def test_call_size_cap_cuts_at_exactly_the_cap() -> None:
    stream = '<tool_call name="w"><param name="c">' + "B" * 20 + "</param></tool_call>TAIL"
    for chunks in ([stream], list(stream)):
        p = StreamParser(max_call_chars=10)
        events = [e for c in chunks for e in p.feed(c)] + p.finish()
        assert "".join(e.text for e in events if isinstance(e, ParamDelta)) == "B" * 10
        assert text(events) == "TAIL"
        assert "larger than 10" in calls(events)[0].message
