"""benchmarks/call_boundary_probe.py: which boundary each </param> is, on a hand-made demonstration."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from agent.model.config import ModelConfig
from agent.model.transformer import MoETransformer
from agent.parser import encode_call
from rl.types import Segment
from tests.agent.model.test_engine import tiny_tokenizer

ROOT = Path(__file__).resolve().parents[2]


def test_boundaries_are_labelled_by_tool_parameter_and_what_follows() -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from call_boundary_probe import boundary_probs

    tok = tiny_tokenizer()
    torch.manual_seed(0)
    model = MoETransformer(ModelConfig.preset("tiny", vocab_size=tok.vocab_size, max_seq_len=512)).eval()
    out = encode_call("read_file", {"path": "a.py"}) + "\n" + encode_call(
        "edit_file", {"path": "a.py", "search": "x = 1\n", "replace": "x = 2\n"})
    segs = [Segment(tok.encode("fix a.py"), sampled=False), Segment(tok.encode(out), sampled=True),
            Segment(tok.encode(encode_call("grep", {"pattern": "x"})), sampled=False)]  # not the policy's: skipped
    probs = boundary_probs(model, tok, [segs])
    assert set(probs) == {"read_file/path/next=close", "edit_file/path/next=param",
                          "edit_file/search/next=param", "edit_file/replace/next=close"}
    for pairs in probs.values():
        assert len(pairs) == 1
        p_close, p_param = pairs[0]
        assert 0.0 <= p_close <= 1.0 and 0.0 <= p_param <= 1.0 and p_close + p_param <= 1.0 + 1e-6
