"""Shared by the benchmark scripts: result writing, percentiles, repo on sys.path."""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# FLYWHEEL_BENCH_RESULTS redirects the result files (the smoke tests write to a temporary dir)
RESULTS = Path(os.environ.get("FLYWHEEL_BENCH_RESULTS") or ROOT / "benchmarks" / "results")
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile, q in [0, 100]."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[k]


def median(values: list[float]) -> float:
    return statistics.median(values)


def is_quick(data: dict | None = None, argv: list[str] | None = None) -> bool:
    """A smoke run: ``--quick`` on the command line, or ``"quick": true`` in the result."""
    argv = sys.argv[1:] if argv is None else argv
    return "--quick" in argv or bool((data or {}).get("quick") is True)


def result_name(name: str, quick: bool) -> str:
    """The file stem a result is written under: a quick run's is ``NAME_quick``, so a
    smoke run never overwrites the committed full result."""
    return name if not quick or name.endswith("_quick") or "_quick_" in name else f"{name}_quick"


REDIRECTED = bool(os.environ.get("FLYWHEEL_BENCH_RESULTS"))


def write_result(name: str, data: dict, *, quick: bool | None = None) -> Path:
    """Write RESULTS/NAME.json — RESULTS/NAME_quick.json for a quick run (``quick=True``,
    ``--quick`` on the command line or ``"quick": true`` in ``data``), so a smoke run never
    overwrites a committed result — print the object as the last line, and return the path.
    ``"benchmark"`` in the object is the file's stem.

    While FLYWHEEL_BENCH_RESULTS redirects the results (tests), a quick run is also written
    under the name the script gave (a temporary directory holds no committed result; older
    smoke tests read that name)."""
    quick = is_quick(data) if quick is None else quick
    stem = result_name(name, quick)
    data = {"benchmark": stem, "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version()}, **data}
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{stem}.json"
    text = json.dumps(data, indent=2) + "\n"
    path.write_text(text)
    if REDIRECTED and stem != name:
        (RESULTS / f"{name}.json").write_text(text)
    print(json.dumps(data))
    return path


def simple_cli(doc: str | None, argv: list[str] | None = None) -> argparse.Namespace:
    """The command line of a benchmark that takes no options: ``--help`` prints its
    docstring, anything else is a usage error (exit status 2)."""
    parser = argparse.ArgumentParser(description=(doc or "").strip() or None,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    return parser.parse_args(argv)


def recorded_demos(checkpoint: Path, tasks_file: Path, split: str, *, max_tasks: int, seed: int,
                   families: list[str] | None = None, **demo_kw: object) -> tuple[object, object, object, int]:
    """For the teacher-forced probes: ``(model, tokenizer, DemoSet, tasks)`` — the checkpoint (eval mode,
    one thread) and scripted demonstrations of the first ``max_tasks`` tasks of ``split`` (of
    ``families``, when given), recorded through the production runtime on a temporary store that is
    removed afterwards; ``tasks`` counts the tasks drawn. ``demo_kw`` goes to ``rl.train.demos.record_task_demos``."""
    import tempfile

    import torch

    from agent.model.checkpoint import load_checkpoint, load_profile
    from rl.rollout.driver import load_split
    from rl.train.demos import record_task_demos
    from rl.types import Split
    from tools.sandbox import make_sandbox
    from tools.workspace import WorkspaceStore, remove_store

    torch.set_num_threads(1)
    model, tok = load_checkpoint(checkpoint)
    model.eval()
    tasks = [t for t in load_split(tasks_file, Split(split)) if not families or t.family in families][:max_tasks]
    if not tasks:
        raise SystemExit(f"no {split} tasks{f' of families {families}' if families else ''} in {tasks_file}")
    tmp = tempfile.mkdtemp(prefix="probe-demos-")
    try:
        demos = record_task_demos(tasks, tok, profile=load_profile(checkpoint), sandbox=make_sandbox(),
                                  store=WorkspaceStore(Path(tmp) / "s"), max_len=model.cfg.max_seq_len,
                                  seed=seed, **demo_kw)  # type: ignore[arg-type]
    finally:
        remove_store(tmp)
    return model, tok, demos, len(tasks)
