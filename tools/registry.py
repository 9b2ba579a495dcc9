"""The default tool set: the one list that serving, RL and replay all use."""

from __future__ import annotations

from tools.base import Tool


def default_tools(*, commands: bool = True, semantic_search: bool = False) -> list[Tool]:
    """Fresh instances of every built-in tool, in prompt order.

    ``commands=False`` leaves out ``run_command`` (for a server with no
    sandbox); the model is then never told about it. ``semantic_search=True``
    adds ``semantic_search``, which needs an index on the context
    (``ToolContext.search_index``, e.g. ``Session(search_index=...)``).
    """
    from tools.edit_file import EditFile
    from tools.glob import Glob
    from tools.grep import Grep
    from tools.list_dir import ListDir
    from tools.read_file import ReadFile
    from tools.write_file import WriteFile

    tools: list[Tool] = [ReadFile(), ListDir(), Glob(), Grep(), EditFile(), WriteFile()]
    if commands:
        from tools.run_command import RunCommand

        tools.append(RunCommand())
    if semantic_search:
        from tools.semantic_search import SemanticSearch

        tools.append(SemanticSearch())
    return tools
