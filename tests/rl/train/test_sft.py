"""SFT demonstrations through the real runtime (real workspace, real bwrap sandbox, the scripted
policy) on a tiny hand-made task, their exact tokenisation, and training with early stopping."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from agent.model.config import ModelConfig
from agent.model.tokenizer import Tokenizer, train_tokenizer
from agent.model.transformer import MoETransformer
from agent.prompt import profile_named
from rl.config import SFTConfig
from rl.train.demos import (STYLES, DemoTask, demo_segments, demo_task_from_patch, grep_pattern, record_demo,
                            scripted_outputs)
from rl.train.sft import train_sft
from tools.sandbox import make_sandbox
from tools.workspace import WorkspaceStore

CALC = "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n"
TEST = "from calc import add\n\nassert add(2, 3) == 5, add(2, 3)\nprint('ok')\n"
PATCH = """--- a/calc.py
+++ b/calc.py
@@ -1,2 +1,2 @@
 def add(a, b):
-    return a - b
+    return a + b
"""


def _task() -> DemoTask:
    return demo_task_from_patch("calc-1", "test_calc.py fails: fix add.", PATCH, "cd /workspace && python3 test_calc.py",
                                extra_reads=["test_calc.py"])


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return train_tokenizer([CALC * 20, TEST * 20, "<tool_call name=\"read_file\">\n" * 10], 400)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> tuple[WorkspaceStore, Path]:
    src = tmp_path_factory.mktemp("src")
    (src / "calc.py").write_text(CALC)
    (src / "test_calc.py").write_text(TEST)
    return WorkspaceStore(tmp_path_factory.mktemp("store")), src


def test_patch_becomes_search_replace_edits() -> None:
    t = _task()
    assert [(e.path, e.search, e.replace) for e in t.edits] == [
        ("calc.py", "def add(a, b):\n    return a - b\n", "def add(a, b):\n    return a + b\n")]
    assert t.paths == ["calc.py", "test_calc.py"]
    with pytest.raises(ValueError, match="creates a file"):
        demo_task_from_patch("x", "r", "--- /dev/null\n+++ b/new.py\n@@ -0,0 +1 @@\n+x\n", "true")


def test_styles_differ_in_shape() -> None:
    t, rng = _task(), random.Random(0)
    parallel = scripted_outputs(t, "parallel", rng=rng)
    sequential = scripted_outputs(t, "sequential", rng=rng)
    assert parallel[0].count("<tool_call") == 2 and len(sequential) == len(parallel) + 1
    assert scripted_outputs(t, "blind", rng=rng)[0].startswith('<tool_call name="edit_file"')


@pytest.mark.parametrize("narration", [0, 3])
@pytest.mark.parametrize("style", STYLES)
async def test_demonstration_runs_through_the_runtime_and_tokenises_exactly(
        style: str, narration: int, store: tuple[WorkspaceStore, Path], tok: Tokenizer) -> None:
    ws_store, src = store
    ws = ws_store.from_dir(src)
    try:
        demo = await record_demo(_task(), style, ws, make_sandbox(), profile=profile_named("compact"),  # type: ignore[arg-type]
                                 fail_blind=style == "blind", narration=narration, seed=7)
        assert ws.read_bytes("calc.py").decode() == CALC.replace("a - b", "a + b")
    finally:
        ws.delete()
    starts = [e for e in demo.events if e["type"] == "tool_call_started"]
    assert starts and all(e["valid"] for e in starts)  # prose before a call never breaks its parsing
    results = [e for e in demo.events if e["type"] == "tool_result"]
    assert demo.turn_end == "completed" and any(r["name"] == "run_command" and "ok" in r["output"] for r in results)
    if style == "blind":
        assert not results[0]["ok"]  # the guessed edit failed; the transcript recovered
    segs = demo_segments(demo, tok)
    whole = demo.prompts[-1].text + demo.outputs[-1] + "\n<|end|>"
    assert [t for s in segs for t in s.token_ids] == tok.encode(whole)
    assert sum(s.sampled for s in segs) == len(demo.outputs)


async def test_sft_lowers_heldout_loss_and_stops_early(store: tuple[WorkspaceStore, Path], tok: Tokenizer) -> None:
    ws_store, src = store
    examples = []
    for i, style in enumerate(["parallel", "sequential", "parallel", "sequential"]):
        ws = ws_store.from_dir(src)
        try:
            demo = await record_demo(_task(), style, ws, make_sandbox(), profile=profile_named("compact"),  # type: ignore[arg-type]
                                     seed=i)
        finally:
            ws.delete()
        examples.append(demo_segments(demo, tok))
    n = max(sum(len(s.token_ids) for s in e) for e in examples)
    torch.manual_seed(0)
    model = MoETransformer(ModelConfig.preset("tiny", vocab_size=tok.vocab_size, max_seq_len=max(1024, n + 8),
                                              n_layers=1, d_model=32, n_heads=2, n_kv_heads=1, d_ff=64))
    # A high learning rate on three examples: the held-out loss falls within a few steps and then
    # stalls, so the run stops early (here at step 18 of at most 30) instead of spending its whole
    # budget (120 steps and 41 evaluations at lr 3e-3, which never stopped early).
    cfg = SFTConfig(lr=3e-2, batch=1, max_epochs=10, eval_every=2, patience=2)
    res = train_sft(model, examples[:3], examples[3:], cfg, pad_id=tok.pad_id)
    assert res.curve[0]["step"] == 0 and len(res.curve) >= 3
    assert res.best_heldout_loss < res.curve[0]["heldout_loss"]
    assert res.stopped_early or res.steps == cfg.max_epochs * 3


def test_epoch_batches_cover_every_example_once_and_pad_less_than_random() -> None:
    import random

    from rl.train.sft import _batches
    from rl.types import Segment

    rng = random.Random(0)
    examples = [[Segment([1] * rng.randrange(10, 2000), sampled=False)] for _ in range(203)]
    batches = _batches(examples, 4, random.Random(1))
    flat = [j for b in batches for j in b]
    assert sorted(flat) == list(range(203)) and all(1 <= len(b) <= 4 for b in batches)

    def padding(bs: list[list[int]]) -> int:
        lens = [len(e[0].token_ids) for e in examples]
        return sum(max(lens[j] for j in b) * len(b) - sum(lens[j] for j in b) for b in bs)

    order = list(range(203))
    random.Random(1).shuffle(order)
    assert padding(batches) < padding([order[i: i + 4] for i in range(0, 203, 4)]) / 2


def _calls(output: str) -> list[str]:
    import re

    return re.findall(r"<tool_call.*?</tool_call>", output, re.S)


@pytest.mark.parametrize("style", [*STYLES, "shell"])
def test_narration_adds_text_before_the_same_calls(style: str) -> None:
    import dataclasses

    t = dataclasses.replace(_task(), shell_edit="sed -i 's/a - b/a + b/' calc.py")
    narrated_calls = 0
    for seed in range(20):
        plain = scripted_outputs(t, style, rng=random.Random(seed), fail_blind=True)  # type: ignore[arg-type]
        assert scripted_outputs(t, style, rng=random.Random(seed), fail_blind=True, narration=0) == plain  # type: ignore[arg-type]
        talk = scripted_outputs(t, style, rng=random.Random(seed), fail_blind=True, narration=3)  # type: ignore[arg-type]
        assert len(talk) == len(plain)
        assert [_calls(o) for o in talk] == [_calls(o) for o in plain]
        for o in talk[:-1]:
            prose = o.split("<tool_call", 1)[0]
            assert len([line for line in prose.splitlines() if line]) <= 3 + ("did not match" in prose)
            narrated_calls += bool(prose.strip())
    assert narrated_calls > 0  # some calls talk ...
    assert narrated_calls < sum(len(scripted_outputs(t, style, rng=random.Random(s), fail_blind=True)) - 1  # type: ignore[arg-type]
                                for s in range(20))  # ... and some do not (0 sentences is one of the draws)


def test_narration_names_the_tasks_files() -> None:
    outs = [o for seed in range(10) for o in scripted_outputs(_task(), "sequential", rng=random.Random(seed), narration=3)]
    prose = "\n".join(o.split("<tool_call", 1)[0] for o in outs)
    assert "calc.py" in prose and "test_calc.py" in prose and "python3 test_calc.py" in prose
    assert "{" not in prose  # every placeholder was filled


def test_bare_narration_names_the_identifier_without_backticks_and_draws_the_same() -> None:
    quoted = [o for seed in range(20) for o in scripted_outputs(_task(), "search", rng=random.Random(seed), narration=3)]
    bare = [o for seed in range(20)
            for o in scripted_outputs(_task(), "search", rng=random.Random(seed), narration=3, narration_quotes=False)]
    ident = grep_pattern(_task().edits[0])  # "add": what the narration names
    assert any(f"`{ident}`" in o for o in quoted)  # the templates quote it ...
    assert not any(f"`{ident}`" in o for o in bare) and any(ident in o.split("<tool_call", 1)[0] for o in bare)
    # ... and bare is the same text with the quotes dropped: the same draws, the same calls
    assert [o.replace(f"`{ident}`", ident) for o in quoted] == bare


def test_without_narration_a_seed_gives_the_transcript_it_gave_before_the_option() -> None:
    # pinned from the code before ``narration`` existed (fe09632): starts built then stay reproducible
    read = '<tool_call name="read_file">\n<param name="path">{}</param>\n</tool_call>'
    assert scripted_outputs(_task(), "sequential", rng=random.Random(0)) == [
        "I'll inspect the relevant files.\n" + read.format("calc.py"),
        "I'll inspect the relevant files.\n" + read.format("test_calc.py"),
        '<tool_call name="edit_file">\n<param name="path">calc.py</param>\n<param name="search">def add(a, b):\n'
        '    return a - b\n</param>\n<param name="replace">def add(a, b):\n    return a + b\n</param>\n</tool_call>',
        '<tool_call name="run_command">\n<param name="command">cd /workspace && python3 test_calc.py</param>\n</tool_call>',
        "Done: the change is made and the tests pass."]


def test_narrated_blind_edits_are_guesses_and_the_recovery_says_why_first() -> None:
    for seed in range(30):
        outs = scripted_outputs(_task(), "blind", rng=random.Random(seed), fail_blind=True, narration=3)
        before_reading = outs[0].split("<tool_call", 1)[0]
        assert "understand" not in before_reading and "I read" not in before_reading
        assert outs[1].startswith("That edit did not match; reading the file.\n")
        assert "test_calc.py" not in outs[1]  # its narration is about the file it reads (calc.py)
        no_fail = scripted_outputs(_task(), "blind", rng=random.Random(seed), narration=3)
        assert "understand" not in no_fail[0] and not any("I read" in o for o in no_fail)
