"""``flywheel embeddings train``: sessions -> (query, chunk) pairs -> fine-tune -> keep if better.

The driver joins three packages that must not know each other's insides:
the session log (``backend.db.log``), the event reader (``agent.trajectories``:
what the agent read or edited for which query) and the embedder's pair builder
and trainer (``embeddings.pairs``, ``embeddings.finetune``), which take plain
pairs and never read a log.

Not guaranteed: sessions whose source directory no longer exists (or came from
git) are chunked from what the session itself showed, which gives coarser
``window`` chunks.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.events import Event
from agent.synthetic_sessions import synthetic_sessions
from agent.trajectories import (
    FileText,
    dir_file_text,
    evidence_from_events,
    read_events_jsonl,
    session_repo,
    source_file_text,
)
from embeddings.pairs import Chunker, Pair, pairs_from_evidence, write_pairs

if TYPE_CHECKING:
    from backend.db.log import SessionLog


def pairs_from_events(events: Iterable[Event | dict[str, Any]], *, repo: str = "", file_text: FileText | None = None,
                      chunker: Chunker | None = None, max_chunks: int = 3, max_read_lines: int = 200) -> list[Pair]:
    """Pairs from one session's events (event models or their JSON dicts), in order."""
    evidence = evidence_from_events(events, file_text=file_text, max_read_lines=max_read_lines)
    return pairs_from_evidence(evidence, repo=repo, chunker=chunker, max_chunks=max_chunks)


def pairs_from_jsonl(path: str | Path, *, workspace_root: str | Path | None = None, repo: str | None = None,
                     **kw: Any) -> list[Pair]:
    """Pairs from a JSONL of events. ``repo`` defaults to each session's id (so a held-out split
    keeps sessions apart); ``workspace_root`` is the sessions' starting tree, if known."""
    ft = dir_file_text(workspace_root) if workspace_root else None
    out: list[Pair] = []
    for sid, evs in read_events_jsonl(path).items():
        out += pairs_from_events(evs, repo=repo or sid or "events", file_text=ft, **kw)
    return out


def pairs_from_log(log: SessionLog, *, limit: int = 10_000, **kw: Any) -> list[Pair]:
    """Pairs from the newest ``limit`` sessions of a session log. The session's source
    directory, when it still exists, gives the starting file texts."""
    out: list[Pair] = []
    offset = 0
    while offset < limit:
        page = log.list_sessions(limit=min(500, limit - offset), offset=offset)
        if not page:
            break
        offset += len(page)
        for info in page:
            src = info.source or {}
            out += pairs_from_events(log.all_events(info.id), repo=session_repo(src, info.id),
                                     file_text=source_file_text(src), **kw)
    return out


def synthetic_pairs(package_dir: str | Path, *, repo: str | None = None, max_sessions: int | None = None,
                    **kw: Any) -> list[Pair]:
    """Pairs from :func:`agent.synthetic_sessions.synthetic_sessions` (SYNTHETIC; see there)."""
    name = repo or Path(package_dir).name
    sessions, texts = synthetic_sessions(package_dir, repo=name, max_sessions=max_sessions)
    out: list[Pair] = []
    for evs in sessions:
        out += pairs_from_events(evs, repo=name, file_text=texts.get, **kw)
    return out


def collect_pairs(args: argparse.Namespace) -> tuple[list[Pair], str]:
    """The pairs the command line asks for, and a note saying where they came from.
    Raises :class:`backend.cli_checks.CliCheckError` (one line) for a source it cannot read."""
    from backend.cli_checks import CliCheckError, check_database, check_dir, check_file, one_line

    if args.sessions:
        from sqlalchemy import create_engine
        from sqlalchemy.exc import SQLAlchemyError

        from backend.db.log import SessionLog

        check_database(args.sessions, "--sessions")
        engine = create_engine(args.sessions)
        try:
            return pairs_from_log(SessionLog(engine)), f"recorded sessions in {args.sessions.split('@')[-1]}"
        except SQLAlchemyError as exc:
            raise CliCheckError(f"--sessions: cannot read sessions from that database (is it a Flywheel session "
                                f"log?): {one_line(exc)}") from None
        finally:
            engine.dispose()
    if args.events:
        check_file(args.events, "--events")
        if args.workspace_root:
            check_dir(args.workspace_root, "--workspace-root")
        try:
            return pairs_from_jsonl(args.events, workspace_root=args.workspace_root), f"events from {args.events}"
        except (ValueError, KeyError, TypeError) as exc:
            raise CliCheckError(f"--events {args.events}: not a JSON-lines file of events ({one_line(exc)})") from None
    if args.synthetic:
        pairs: list[Pair] = []
        for name in args.synthetic.split(","):
            try:
                spec = importlib.util.find_spec(name) if name else None
            except (ImportError, ValueError):
                spec = None
            if spec is None or not spec.submodule_search_locations:
                raise CliCheckError(f"--synthetic: {name!r} is not an installed package")
            pairs += synthetic_pairs(list(spec.submodule_search_locations)[0], repo=name,
                                     max_sessions=args.max_pairs_per_repo)
        return pairs, (f"SYNTHETIC trajectories (docstring first sentence -> function with its docstring "
                       f"removed) from installed packages {args.synthetic}; not recorded sessions")
    raise CliCheckError("give --sessions DB_URL, --events FILE.jsonl or --synthetic PKGS")


def check_args(args: argparse.Namespace) -> None:
    """Refuse impossible settings before any pairs are collected or a model loads
    (:class:`backend.cli_checks.CliCheckError`, one line)."""
    from backend.cli_checks import CliCheckError, check_embedding_model

    check_embedding_model(args.base_model, "--base-model")
    for flag, value, low in (("--epochs", args.epochs, 0.0), ("--lr", args.lr, 0.0)):
        if not value > low:
            raise CliCheckError(f"{flag} {value}: must be greater than {low:g}")
    if args.batch_size < 2:
        raise CliCheckError(f"--batch-size {args.batch_size}: at least 2 (in-batch negatives need another pair)")
    if args.max_steps == 0 or args.max_steps < -1:
        raise CliCheckError(f"--max-steps {args.max_steps}: give a positive number, or -1 for no limit")
    if args.out.exists() and not args.out.is_dir():
        raise CliCheckError(f"--out {args.out}: exists and is not a directory")


def run_cli(args: argparse.Namespace) -> int:
    """``flywheel embeddings train``; every refusal is one line on stderr (exit status 1)."""
    from backend.cli_checks import CliCheckError, one_line, quiet_third_party

    quiet_third_party()
    try:
        check_args(args)
        pairs, note = collect_pairs(args)
        if not pairs:
            raise CliCheckError(f"no (query, chunk) pairs found in {note.split(';')[0]}: nothing to train on")
    except CliCheckError as exc:
        print(f"flywheel embeddings train: {exc}", file=sys.stderr)
        return 1
    from embeddings.finetune import train_and_select

    print(f"{len(pairs)} pairs from {len({p.repo for p in pairs})} repositories ({note})", flush=True)
    try:
        if args.pairs_out:
            write_pairs(pairs, args.pairs_out)
        report = train_and_select(
            pairs, args.out, base_model=args.base_model, epochs=args.epochs, batch_size=args.batch_size,
            learning_rate=args.lr, max_steps=args.max_steps, seed=args.seed, min_gain=args.min_gain,
            held_out=args.held_out.split(",") if args.held_out else None, data_note=note,
        )
    except (ValueError, OSError) as exc:
        print(f"flywheel embeddings train: {one_line(exc)}", file=sys.stderr)
        return 1
    b, t = report["base"], report["fine_tuned"]
    print(f"held-out ({', '.join(report['pairs']['test_repos'])}): base MRR@10 {b.get('mrr@10')}, "
          f"fine-tuned {t.get('mrr@10')} -> using {report['decision']}: {report['selected_model']}")
    print(f"report: {Path(args.out) / 'report.json'}")
    return 0
