"""The generation engine's tensor side: one batched forward of the model over its KV cache.

:class:`ModelRunner` holds what the engine (:mod:`agent.model.engine`) computes
with: the model, its KV cache (one row per cache slot) and, with
``record_routes``, the MoE experts each cached position was routed to in each
layer. :meth:`ModelRunner.forward` runs one forward over some slots and samples
one token per row (:func:`agent.model.sampling.sample`); a prefill first sets
each slot to the prefix it reuses (:class:`agent.model.prefix_cache.Placement`),
copying that prefix's routes with it. The engine's loop decides what to run;
the runner only runs it, on the engine's one worker thread.

Not guaranteed: thread safety. Calls must not overlap (the engine makes them
from one worker thread, one at a time); :meth:`load` between two forwards is
the caller's to arrange.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from agent.model.prefix_cache import Placement
from agent.model.sampling import sample

SamplingParams = tuple[float, float, torch.Generator, bool]
"""One row's temperature, top-p, random generator, and whether its logprobs are the tempered
distribution's (``GenerationRequest.logprobs_mode == "processed"``; :func:`sample`)."""


class ModelRunner:
    def __init__(self, model: torch.nn.Module, *, max_slots: int, max_len: int, device: str | torch.device = "cpu",
                 record_routes: bool = True) -> None:
        from agent.model.transformer import KVCache

        self.model = model.to(device).eval()
        self.cfg = model.cfg
        self.device = torch.device(device)
        dtype = next(model.parameters()).dtype
        self.cache = KVCache(self.cfg, max_slots, max_len, dtype=dtype, device=self.device)
        # expert ids per cached position (int16: n_experts < 32768); routes of copied prefixes are copied too
        self.routes = (
            torch.zeros(max_slots, max_len, self.cfg.n_layers, self.cfg.top_k, dtype=torch.int16)
            if record_routes else None
        )

    @property
    def records_routes(self) -> bool:
        return self.routes is not None

    def forward(self, tokens: list[list[int]], slots: list[int], params: Sequence[SamplingParams],
                placements: list[Placement | None] | None) -> tuple[list[int], list[float]]:
        """One forward over ``slots`` (row i feeds ``tokens[i]``, all rows equally long), then
        one token sampled per row with its logprob. A prefill (``placements`` given) first
        sets each slot to its reused prefix."""
        with torch.inference_mode():
            if placements is not None:  # the slot keeps (or copies) its reused prefix, nothing more
                for p in placements:
                    assert p is not None
                    self.cache.keep_prefix(p.slot, p.keep, p.source)
                    if self.routes is not None and p.source is not None and p.keep:
                        self.routes[p.slot, : p.keep] = self.routes[p.source, : p.keep]
            input_ids = torch.tensor(tokens, dtype=torch.long, device=self.device)
            slot_t = torch.tensor(slots, dtype=torch.long, device=self.device)
            start = self.cache.lengths[slot_t].tolist()
            out = self.model(input_ids, cache=self.cache, slots=slot_t, return_routes=self.routes is not None)
            if self.routes is not None and out.routes is not None:
                routes = out.routes.to("cpu", torch.int16)
                t = input_ids.shape[1]
                for row, (slot, s0) in enumerate(zip(slots, start, strict=True)):
                    self.routes[slot, s0 : s0 + t] = routes[row]
            logits = out.logits[:, -1, :]
            temperature = torch.tensor([p[0] for p in params], device=self.device)
            top_p = torch.tensor([p[1] for p in params], device=self.device)
            uniform = torch.cat([torch.rand(1, generator=p[2]) for p in params]).to(self.device)
            processed = torch.tensor([p[3] for p in params], dtype=torch.bool, device=self.device)
            ids, lps = sample(logits, temperature, top_p, uniform, processed)
            return ids.tolist(), lps.tolist()

    def routes_of(self, slot: int, start: int, stop: int) -> list[list[list[int]]]:
        """The expert ids of ``slot``'s cached positions ``start .. stop - 1``, ``[n][n_layers][top_k]``."""
        if self.routes is None:
            raise ValueError("this runner does not record routes (record_routes=False)")
        return self.routes[slot, start:stop].tolist()  # type: ignore[no-any-return]

    def weights_problem(self, state_dict: dict[str, torch.Tensor]) -> str | None:
        """Why ``state_dict`` does not fit the model (missing or unexpected keys, wrong
        shapes), or None when it does."""
        own = self.model.state_dict()
        missing = sorted(set(own) - set(state_dict))
        unexpected = sorted(set(state_dict) - set(own))
        wrong = sorted(k for k in own.keys() & state_dict.keys() if tuple(own[k].shape) != tuple(state_dict[k].shape))
        if missing or unexpected or wrong:
            return (f"weights do not fit this model: missing {missing[:5]}, unexpected {unexpected[:5]}, "
                    f"wrong shape {wrong[:5]}")
        return None

    def load(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Copy ``state_dict`` into the model (check it with :meth:`weights_problem` first)."""
        with torch.no_grad():
            self.model.load_state_dict(state_dict)
