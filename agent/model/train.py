"""Pretraining on the local code corpus (``flywheel model train``).

One loop, nanoGPT-style: stream tokens from the corpus, AdamW with linear
warmup and cosine decay to ``min_lr_frac · lr``, gradient clipping, the MoE
auxiliary loss added to the language-model loss, and the auxiliary-loss-free
router-bias step after each optimizer step. Every step is logged to
``OUT/metrics.jsonl``; a line goes to stdout every ``log_every`` steps (or a
tqdm bar when stderr is a terminal). At the end the model, the tokenizer and
the training settings are written to ``OUT`` as a checkpoint.

Deterministic for a seed on a given machine (init, data order, sampling of
windows); not guaranteed across machines or thread counts (float reduction
order).

Memory is bounded: the loader holds one chunk of documents, one token buffer
and a pool of ``pool`` windows — never the corpus.

Prompt profile: the checkpoint records the :class:`agent.prompt.PromptProfile`
it is served with, and the corpus's tool-call transcripts are rendered with
that same profile. By default small presets (tiny, small: 1,024-token
contexts) get ``compact`` and larger ones ``default``
(:data:`DEFAULT_PROFILE_FOR`); ``--prompt-profile`` overrides.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import random
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, TextIO

import torch
import torch.nn.functional as F

from agent.model.checkpoint import save_checkpoint
from agent.model.config import ModelConfig, Precision
from agent.model.corpus import CODE_SOURCES, Corpus, build_corpus, code_roots
from agent.model.moe import expert_balance
from agent.model.numerics import KernelsUnavailable
from agent.model.tokenizer import FILENAME as TOKENIZER_FILE
from agent.model.tokenizer import Tokenizer, train_tokenizer
from agent.model.transformer import MoETransformer
from agent.prompt import PromptProfile, profile_named

DEFAULT_LR = {"tiny": 3e-3, "mini": 2e-3, "small": 1e-3, "1b": 3e-4}  # AdamW peak lr; small is unstable at 3e-3
# the full prompt (~1,700 tokens with the default tools) does not fit a 1,024-token context
DEFAULT_PROFILE_FOR = {"tiny": "compact", "mini": "compact", "small": "compact", "1b": "default"}


@dataclass(frozen=True)
class TrainConfig:
    preset: str = "tiny"
    steps: int = 300
    precision: Precision = "fp32"
    out: Path = Path("runs/model")
    seq_len: int = 256
    batch: int = 8
    seed: int = 0
    lr: float | None = None  # peak learning rate; None: the preset's (DEFAULT_LR)
    min_lr_frac: float = 0.1
    warmup: int | None = None  # default: min(100, steps // 10)
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    log_every: int = 10
    eval_every: int = 0  # 0: only at the end
    eval_batches: int = 4
    corpus_bytes: int = 64 << 20
    corpus_sources: tuple[str, ...] = CODE_SOURCES  # ("stdlib",): a corpus that depends on the Python version only
    tokenizer_dir: Path | None = None  # reuse this tokenizer; else OUT/tokenizer.json if present; else train one
    tokenizer_bytes: int = 8 << 20  # how much of the corpus the tokenizer is trained on
    model_overrides: dict[str, Any] = field(default_factory=dict)  # e.g. {"n_layers": 1} (tests, benchmarks)
    device: str = "cpu"  # "cuda" moves model and batches (not exercised in this repo's tests: no GPU there)
    prompt_profile: str | None = None  # None: the preset's (DEFAULT_PROFILE_FOR)

    @property
    def profile(self) -> PromptProfile:
        """The prompt profile stored with the checkpoint (``KeyError`` naming the known ones)."""
        return profile_named(self.prompt_profile or DEFAULT_PROFILE_FOR.get(self.preset, "default"))


@dataclass
class TrainResult:
    model: MoETransformer
    tokenizer: Tokenizer
    losses: list[tuple[int, float]]  # (step, training loss) every step
    val_loss: float | None
    tokens_per_s: float
    out: Path


class TokenBatches:
    """``[batch, seq_len + 1]`` LongTensors streamed from a corpus split.

    Documents are tokenised in chunks, joined with ``<|eos|>`` and cut into
    windows of ``seq_len + 1`` tokens (stride ``seq_len``, so every token is a
    target once). With ``shuffle``, documents come in a seeded per-epoch order,
    the stream repeats forever, and each batch draws its rows at random from a
    pool of ``pool`` windows, so one batch mixes many files. Without, one pass
    in corpus order (validation).
    """

    def __init__(self, corpus: Corpus, split: str, tokenizer: Tokenizer, batch: int, seq_len: int, *,
                 seed: int = 0, shuffle: bool = True, pool: int = 256, chunk_docs: int = 32) -> None:
        self.corpus, self.split, self.tok = corpus, split, tokenizer
        self.batch, self.seq_len, self.seed, self.shuffle = batch, seq_len, seed, shuffle
        self.pool_size, self.chunk_docs = max(pool, batch), chunk_docs

    def _windows(self) -> Iterator[list[int]]:
        span, buf, eos = self.seq_len, [], self.tok.eos_id
        for epoch in itertools.count():
            texts = self.corpus.texts(self.split, shuffle_seed=self.seed * 1_000_003 + epoch if self.shuffle else None)
            produced = False
            while chunk := list(itertools.islice(texts, self.chunk_docs)):
                for ids in self.tok.encode_batch(chunk):
                    buf.extend(ids)
                    buf.append(eos)
                start = 0
                while len(buf) - start >= span + 1:
                    yield buf[start:start + span + 1]
                    produced = True
                    start += span
                buf = buf[start:]
            if not self.shuffle:
                return
            if not produced and epoch > 0:
                raise ValueError(f"the {self.split} split is too small for one window of {span + 1} tokens")

    def __iter__(self) -> Iterator[torch.Tensor]:
        rng = random.Random(self.seed)
        windows = self._windows()
        if not self.shuffle:
            while rows := list(itertools.islice(windows, self.batch)):
                if len(rows) < self.batch:
                    return
                yield torch.tensor(rows, dtype=torch.long)
            return
        pool: list[list[int]] = []
        for w in windows:
            pool.append(w)
            if len(pool) >= self.pool_size:
                rows = []
                for _ in range(self.batch):  # swap-remove a random window
                    i = rng.randrange(len(pool))
                    pool[i], pool[-1] = pool[-1], pool[i]
                    rows.append(pool.pop())
                yield torch.tensor(rows, dtype=torch.long)


def peak_lr(tc: TrainConfig) -> float:
    return tc.lr if tc.lr is not None else DEFAULT_LR.get(tc.preset, 1e-3)


def lr_at(step: int, tc: TrainConfig) -> float:
    """Linear warmup to the peak, then cosine decay to ``min_lr_frac`` of it."""
    lr = peak_lr(tc)
    warmup = tc.warmup if tc.warmup is not None else min(100, tc.steps // 10)
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, tc.steps - warmup)
    return lr * (tc.min_lr_frac + (1 - tc.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


@torch.no_grad()
def evaluate(model: MoETransformer, batches: list[torch.Tensor]) -> float | None:
    if not batches:
        return None
    was_training = model.training
    model.eval()
    total = sum(float(lm_loss(model(b[:, :-1]).logits, b[:, 1:])) for b in batches) / len(batches)
    model.train(was_training)
    return total


def get_tokenizer(tc: TrainConfig, corpus: Corpus, vocab_size: int, log: TextIO) -> Tokenizer:
    if tc.tokenizer_dir is not None:
        return Tokenizer.load(tc.tokenizer_dir)
    if (tc.out / TOKENIZER_FILE).is_file():
        print(f"reusing the tokenizer in {tc.out}", file=log)
        return Tokenizer.load(tc.out)
    t0 = time.perf_counter()

    def sample() -> Iterator[str]:
        budget = tc.tokenizer_bytes
        for text in corpus.texts("train"):
            if budget <= 0:
                return
            budget -= len(text)
            yield text

    tok = train_tokenizer(sample(), vocab_size)
    tok.save(tc.out)
    print(f"trained a {tok.vocab_size}-token tokenizer in {time.perf_counter() - t0:.1f}s", file=log)
    return tok


def make_optimizer(model: MoETransformer, tc: TrainConfig) -> torch.optim.AdamW:
    """AdamW; weight decay on matrices (incl. embeddings and expert tensors), none on norms."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": tc.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=peak_lr(tc), betas=(0.9, 0.95), eps=1e-8)


def train(tc: TrainConfig, *, corpus: Corpus | None = None, tokenizer: Tokenizer | None = None,
          log: TextIO = sys.stdout, save: bool = True) -> TrainResult:
    """Train and (with ``save``) write the checkpoint. A ``corpus`` passed in must
    render its transcripts with ``tc.profile`` (``ValueError`` otherwise)."""
    try:
        profile = tc.profile
    except KeyError as exc:
        raise ValueError(f"--prompt-profile: {exc.args[0]}") from None
    base = ModelConfig.preset(tc.preset, precision=tc.precision, **tc.model_overrides)
    if tc.seq_len > base.max_seq_len:
        raise ValueError(f"--seq-len {tc.seq_len} exceeds the {tc.preset} preset's max_seq_len {base.max_seq_len}")
    if corpus is not None and corpus.prompt_profile != profile.name and (corpus.train or corpus.val):
        if any(d.path is None for d in corpus.train + corpus.val):
            raise ValueError(f"the corpus renders transcripts with prompt profile {corpus.prompt_profile!r} but the "
                             f"checkpoint will be served with {profile.name!r}: build it with that profile")
    roots = code_roots(tc.corpus_sources) if corpus is None else None  # unknown sources: refused before any write
    tc.out.mkdir(parents=True, exist_ok=True)
    corpus = corpus or build_corpus(max_bytes=tc.corpus_bytes, seed=tc.seed, prompt_profile=profile.name,
                                    roots=roots)
    tok = tokenizer or get_tokenizer(tc, corpus, base.vocab_size, log)
    cfg = replace(base, vocab_size=tok.vocab_size)

    torch.manual_seed(tc.seed)
    model = MoETransformer(cfg)
    if model.copy is not None:
        from agent.model.copy_head import twin_ids

        model.copy.set_twins(twin_ids(tok))
    model = model.to(tc.device)  # initialised on the CPU: the same weights on any device
    model.train()
    opt = make_optimizer(model, tc)
    print(f"model: {tc.preset} {cfg.precision}, {model.num_params() / 1e6:.2f}M params "
          f"({model.num_params(active=True) / 1e6:.2f}M active), context {cfg.max_seq_len}, prompt profile "
          f"{profile.name!r}, corpus {corpus.summary()}", file=log)

    val = [b.to(tc.device) for b in itertools.islice(
        TokenBatches(corpus, "val", tok, tc.batch, tc.seq_len, shuffle=False), tc.eval_batches)]
    batches = iter(TokenBatches(corpus, "train", tok, tc.batch, tc.seq_len, seed=tc.seed))
    metrics = (tc.out / "metrics.jsonl").open("w")
    bar = _progress(tc.steps)
    losses: list[tuple[int, float]] = []
    tokens, train_time, val_loss = 0, 0.0, None
    try:
        for step in range(tc.steps):
            batch = next(batches).to(tc.device, non_blocking=True)
            t0 = time.perf_counter()
            lr = lr_at(step, tc)
            for group in opt.param_groups:
                group["lr"] = lr
            out = model(batch[:, :-1])
            loss_t = lm_loss(out.logits, batch[:, 1:])
            (loss_t + out.aux_loss).backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
            model.update_router_bias(out.expert_counts)
            train_time += time.perf_counter() - t0
            loss, aux = loss_t.item(), out.aux_loss.item()
            tokens += batch[:, :-1].numel()
            record: dict[str, Any] = {
                "step": step + 1, "loss": round(loss, 5), "aux_loss": round(aux, 6),
                "balance": round(expert_balance(out.expert_counts), 4), "lr": lr,
                "grad_norm": round(float(grad_norm), 4), "tokens_per_s": round(tokens / train_time, 1),
            }
            last = step + 1 == tc.steps
            if (tc.eval_every and (step + 1) % tc.eval_every == 0) or last:
                val_loss = evaluate(model, val)
                record["val_loss"] = None if val_loss is None else round(val_loss, 5)
            losses.append((step + 1, loss))
            metrics.write(json.dumps(record) + "\n")
            metrics.flush()
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{loss:.3f}", bal=f"{record['balance']:.2f}")
            if (step + 1) % tc.log_every == 0 or last or "val_loss" in record:
                line = " ".join(f"{k}={v}" for k, v in record.items())
                (bar.write if bar is not None else lambda s: print(s, file=log, flush=True))(line)
    finally:
        metrics.close()
        if bar is not None:
            bar.close()
    if save:
        save_checkpoint(tc.out, model, tok, step=tc.steps, extra={
            "train": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(tc).items()},
            "peak_lr": peak_lr(tc), "val_loss": val_loss, "corpus": corpus.fingerprint,
        }, profile=profile)
        print(f"checkpoint written to {tc.out}", file=log)
    return TrainResult(model, tok, losses, val_loss, tokens / max(train_time, 1e-9), tc.out)


def _progress(total: int) -> Any:
    if not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit="step", dynamic_ncols=True)


def run_cli(args: argparse.Namespace) -> int:
    """``flywheel model train`` (the arguments are declared in ``backend/cli.py``)."""
    tc = TrainConfig(
        preset=args.preset, steps=args.steps, precision=args.precision, out=args.out, seq_len=args.seq_len,
        batch=args.batch, seed=args.seed, lr=args.lr, tokenizer_dir=args.tokenizer,
        corpus_bytes=int(args.corpus_mb * (1 << 20)), log_every=args.log_every, eval_every=args.eval_every,
        device=args.device, corpus_sources=tuple(getattr(args, "corpus_sources", None) or CODE_SOURCES),
        model_overrides={"mxfp8_scope": args.mxfp8_scope, "copy_head": bool(getattr(args, "copy_head", False)),
                         "copy_min_distance": int(getattr(args, "copy_min_distance", 1)),
                         "copy_successor_keys": bool(getattr(args, "copy_successor_keys", False)),
                         "copy_context_only": bool(getattr(args, "copy_context_only", False))},
        prompt_profile=getattr(args, "prompt_profile", None),
    )
    try:
        train(tc)
    except (ValueError, KernelsUnavailable, FileNotFoundError) as exc:
        print(f"flywheel model train: {exc}", file=sys.stderr)
        return 1
    return 0
