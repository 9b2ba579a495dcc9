"""tools.progress: a listener belongs to one call's task and never breaks the tool."""

from __future__ import annotations

import asyncio

from tools.progress import current_listener, listening, report_output


async def test_a_listener_is_seen_only_inside_its_own_task() -> None:
    a: list[str] = []
    b: list[str] = []

    async def call(sink: list[str], word: str) -> None:
        with listening(sink.append):
            await asyncio.sleep(0.01)  # the other call runs meanwhile
            report_output(word)

    await asyncio.gather(call(a, "from a"), call(b, "from b"))
    assert a == ["from a"] and b == ["from b"]
    assert current_listener() is None
    report_output("nobody listens")  # a no-op outside a call


def test_a_failing_listener_is_contained() -> None:
    def broken(_: str) -> None:
        raise RuntimeError("display broke")

    with listening(broken):
        report_output("text")  # does not raise
        assert current_listener() is broken
    assert current_listener() is None
