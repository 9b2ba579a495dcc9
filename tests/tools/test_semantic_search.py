"""semantic_search: output format, argument checks, and freshness inside a Session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent.events import ListSink, ToolResultEvent
from agent.parser import encode_call as call
from agent.policies.scripted import ScriptedPolicy
from agent.session import Session
from embeddings.embedder import SentenceTransformerEmbedder
from embeddings.index import WorkspaceIndex
from tools.base import ToolContext, ToolError
from tools.registry import default_tools
from tools.semantic_search import SemanticSearch
from tools.workspace import Workspace, WorkspaceStore

os.environ.setdefault("HF_HUB_OFFLINE", "1")

CODE = '''def celsius_to_fahrenheit(c):
    """Convert a temperature from Celsius to Fahrenheit."""
    return c * 9 / 5 + 32


def median(values):
    """The middle value of a list of numbers."""
    s = sorted(values)
    return s[len(s) // 2]
'''


@pytest.fixture(scope="session")
def minilm() -> SentenceTransformerEmbedder:
    return SentenceTransformerEmbedder()


@pytest.fixture
def ws(tmp_path: Path):
    src = tmp_path / "src"
    (src / "lib").mkdir(parents=True)
    (src / "lib" / "units.py").write_text(CODE)
    (src / "README.md").write_text("# demo\n\nSmall helpers for units and statistics.\n")
    w = WorkspaceStore(tmp_path / "store").from_dir(src)
    yield w
    w.delete()


@pytest.fixture
def index(ws: Workspace, tmp_path: Path, minilm) -> WorkspaceIndex:
    idx = WorkspaceIndex(ws.root, embedder=minilm, data_dir=tmp_path / "index")
    idx.refresh()
    return idx


async def test_output_lists_location_symbol_score_and_snippet(ws, index) -> None:
    res = await SemanticSearch().run({"query": "convert temperature units", "k": 2}, ToolContext(ws, search_index=index))
    assert res.ok and res.data["results"] == 2
    first = res.output.splitlines()[:3]
    loc, symbol, score = first[0].split("  ")
    assert loc == "lib/units.py:1-3" and symbol == "celsius_to_fahrenheit" and float(score) > 0
    assert first[1] == "    def celsius_to_fahrenheit(c):" and first[2] == '        """Convert a temperature from Celsius to Fahrenheit."""'
    assert res.data["hits"][0]["symbol"] == "celsius_to_fahrenheit"


async def test_path_glob_default_k_and_limits(ws, index) -> None:
    tool = SemanticSearch()
    ctx = ToolContext(ws, search_index=index)
    res = await tool.run({"query": "helpers", "path_glob": "*.md"}, ctx)
    assert res.ok and {h["path"] for h in res.data["hits"]} == {"README.md"}
    none = await tool.run({"query": "helpers", "path_glob": "nope/**"}, ctx)
    assert none.ok and none.output.startswith("no results")
    for k in (0, 51):
        with pytest.raises(ToolError, match="k must be between 1 and 50"):
            await tool.run({"query": "x", "k": k}, ctx)
    with pytest.raises(ToolError, match="empty"):
        await tool.run({"query": "  "}, ctx)
    assert tool.spec.param("k").default == 10 and "grep" in tool.spec.description


async def test_without_an_index_the_tool_says_so(ws) -> None:
    with pytest.raises(ToolError, match="not available"):
        await SemanticSearch().run({"query": "x"}, ToolContext(ws))


def test_registry_adds_it_only_on_request() -> None:
    assert "semantic_search" not in {t.spec.name for t in default_tools()}
    assert "semantic_search" in {t.spec.name for t in default_tools(semantic_search=True)}


async def test_an_edit_in_one_step_is_found_by_search_in_the_next(ws, index) -> None:
    sink = ListSink()
    new_code = CODE + '''

def haversine_distance(lat1, lon1, lat2, lon2):
    """Great-circle distance in kilometres between two points on Earth."""
    return 6371 * central_angle(lat1, lon1, lat2, lon2)
'''
    policy = ScriptedPolicy([
        call("write_file", {"path": "lib/units.py", "content": new_code}),
        call("semantic_search", {"query": "distance between two GPS coordinates on the globe", "k": "1"}),
        "done",
    ])
    s = Session(workspace=ws, policy=policy, tools=default_tools(commands=False, semantic_search=True),
                sink=sink, search_index=index)
    outcome = await s.run_turn("add a distance helper")
    assert outcome.reason == "completed"
    results = [e for e in sink.events if isinstance(e, ToolResultEvent)]
    assert [r.name for r in results] == ["write_file", "semantic_search"] and all(r.ok for r in results)
    assert results[1].output.splitlines()[0].split("  ")[1] == "haversine_distance"
