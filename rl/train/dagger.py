"""DAgger-style relabelling of the model's own rollouts: training on its mistakes.

Teacher-forced SFT only ever shows the model demonstrations' prefixes, so the first wrong token
of a free-running rollout (a path copied with one letter off, an edit whose ``search`` does not
match) takes it to prompts it was never trained on, and it does not recover (exposure bias).
DAgger (Ross, Gordon & Bagnell, 2011) fixes that by asking an expert what it would do in the
states the LEARNER reaches, and training on those answers. Here the learner's states are real
rollouts of the SFT checkpoint through the production runtime (``rl.rollout.driver.evaluate``:
Ray workers, sandbox, the same prompt), and the expert is the scripted solver of the task,
which knows the solution files:

* some file the fix touches still differs from its solution and has not been read in this
  conversation: read those files (one call, in parallel);
* else some still differs: the edits that turn its CURRENT content into the solution
  (:func:`rl.train.tight_edits.tighten_edit` against the file as the model left it, so an
  earlier wrong edit is repaired, not assumed away);
* else the tests have not run since the last change: run them;
* else: the final answer.

Each model call of a rollout gives one example: the exact token ids the engine consumed before
that call (the model's own earlier outputs and the real tool results; no loss on them), then the
expert's output as the sampled segment (:func:`agent.policies.tito.scripted_output_ids`, the
demonstrations' encoding; loss on it). The rollout itself is never changed: the expert labels
states, it does not act (Ross et al.'s β = 0 after the first round; the first round's data is
the demonstrations themselves).

Departures and what is NOT guaranteed:

* The expert's view of the files is rebuilt from the rollout's events: successful ``edit_file``
  and ``write_file`` calls replayed on the start files with ``edit_file``'s exactly-once rule.
  A ``run_command`` that changes files (``sed -i``) is not seen.
* A ``run_command`` other than the task's test command, its one-command form
  (``DemoTask.shell_edit``) or a read-only pipeline (grep, ls, cat, ...; no redirection) may have
  changed files the expert cannot replay (``sed -i`` with another pattern): the rest of that
  rollout gets no labels (``RelabelStats.unknown_state``). The one-command form itself is assumed
  to leave the solution files (the demonstrations' tests check that it passes the grader, not that
  it equals the reference patch byte for byte: :func:`rl.train.demos.shell_edit_for`).
* With ``shell_share`` > 0 the expert of a task that has a one-command form uses it, in that share
  of rollouts (one draw per rollout), for as long as nothing has changed — the demonstrations'
  ``shell`` style; otherwise, and once a file differs from its start, it reads and edits.
* A file counts as read only after a successful ``read_file`` of exactly its path (``./`` and
  redundant separators normalised); a grep hit does not count.
* Rollouts whose sampled segments do not line up with their ``assistant_message`` events are
  skipped and counted, never guessed. A last call cut by the wall-time limit has a message but
  no sampled ids; it gets no example (its prefix is still labelled by nothing: the rollout ended).
"""

from __future__ import annotations

import dataclasses
import posixpath
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agent.parser import encode_call
from rl.train.demos import DemoTask, Edit
from rl.train.tight_edits import tighten_edit
from rl.types import Segment

if TYPE_CHECKING:
    from rl.types import Rollout

__all__ = ["ExpertState", "RelabelStats", "expert_next", "observe", "read_only_command", "relabel", "solution_files"]

_SAY = ("Let me look at the code first.", "I'll inspect the relevant files.", "Checking the code.")
_ANSWER = ("The fix is in and the tests pass.", "Done: the change is made and the tests pass.")


@dataclass(slots=True)
class ExpertState:
    """What the expert knows before one model call."""

    files: dict[str, str]  # the current text of every file the fix touches
    read: set[str] = field(default_factory=set)  # paths read successfully so far
    tested: bool = False  # the test command ran (successfully dispatched) since the last change
    shell: bool = False  # this rollout's expert uses the task's one-command form while nothing has changed
    changed: bool = False  # some change was replayed (an edit, a write, the one command)
    unknown: bool = False  # a command may have changed files in a way the expert cannot replay


def solution_files(task: DemoTask, start: dict[str, str]) -> dict[str, str]:
    """The files the fix touches, as the task's (tight) edits leave them."""
    out = {p: start[p] for p in dict.fromkeys(e.path for e in task.edits)}
    for e in task.edits:
        out[e.path] = out[e.path].replace(e.search, e.replace, 1)
    return out


def expert_next(task: DemoTask, solution: dict[str, str], state: ExpertState, rng: random.Random) -> str | None:
    """The scripted solver's next output from ``state`` (see the module docstring); ``None`` when
    no ``edit_file`` can express the repair (a file the model emptied)."""
    if state.unknown:
        return None
    todo = [p for p in solution if state.files[p] != solution[p]]
    if todo:
        if state.shell and task.shell_edit is not None and not state.changed:
            return encode_call("run_command", {"command": task.shell_edit})
        unread = [p for p in todo if p not in state.read]
        if unread:
            return rng.choice(_SAY) + "\n" + "\n".join(encode_call("read_file", {"path": p}) for p in unread)
        edits: list[Edit] = []
        for p in todo:
            if not state.files[p]:
                return None
            edits += tighten_edit(state.files[p], Edit(p, state.files[p], solution[p]))
        return "\n".join(encode_call("edit_file", {"path": e.path, "search": e.search, "replace": e.replace})
                         for e in edits)
    if not state.tested:
        return encode_call("run_command", {"command": task.test_command})
    return rng.choice(_ANSWER)


@dataclass(slots=True)
class RelabelStats:
    rollouts: int = 0
    examples: int = 0
    unaligned: int = 0  # rollouts skipped: sampled segments and assistant messages differ
    too_long: int = 0  # examples longer than the model's context
    no_label: int = 0  # model calls the expert had no output for
    unknown_state: int = 0  # model calls after a command the expert cannot replay (no label)
    agreed: int = 0  # examples whose label is exactly what the model sampled


def _norm(path: Any) -> str:
    p = posixpath.normpath(str(path).strip())
    return p[2:] if p.startswith("./") else p


_READ_ONLY = frozenset({"grep", "rg", "ls", "cat", "find", "head", "tail", "wc", "sort", "uniq", "echo", "pwd"})


def read_only_command(command: str) -> bool:
    """A pipeline of read-only programs without redirection, ``-exec`` or ``-delete`` (a
    conservative test: anything else may write files)."""
    if re.search(r"[<>`]|\$\(|-exec|-delete|-fprint", command):
        return False
    stages = [s.strip() for s in re.split(r"\|\||&&|[|;&]", command)]
    return all(s and s.split()[0] in _READ_ONLY for s in stages)


def observe(state: ExpertState, task: DemoTask, solution: dict[str, str], started: dict[str, Any],
            results: dict[str, Any]) -> None:
    """Replay one call on ``state`` (``started``/``results``: its tool_call_started / tool_result
    events; see the module docstring for what is not seen)."""
    if not started.get("valid", True):
        return
    name, args = started.get("name"), started.get("args") or {}
    if name == "run_command":
        command = str(args.get("command", "")).strip()
        if command == task.test_command.strip():
            state.tested = state.tested or bool(results.get("ok"))
        elif task.shell_edit is not None and command == task.shell_edit.strip():
            if results.get("ok"):
                state.files, state.changed, state.tested = dict(solution), True, False
            else:  # it may have run part way
                state.unknown = True
        elif not read_only_command(command):
            state.unknown = True
        return
    if not results.get("ok"):
        return
    path = _norm(args.get("path", ""))
    if name == "read_file":
        state.read.add(path)
    elif name == "edit_file" and path in state.files:
        search, replace = str(args.get("search", "")), str(args.get("replace", ""))
        text = state.files[path]
        if search and text.count(search) >= 1:
            state.files[path] = text.replace(search, replace, 1)
            state.tested, state.changed = False, True
    elif name == "write_file" and path in state.files:
        state.files[path] = str(args.get("content", ""))
        state.tested, state.changed = False, True


def relabel(rollout: Rollout, task: DemoTask, start: dict[str, str], tokenizer: Any, *, max_len: int,
            rng: random.Random, stats: RelabelStats | None = None, shell_share: float = 0.0) -> list[list[Segment]]:
    """One example per model call of ``rollout`` (see the module docstring). ``start``: the
    starting text of every file ``task`` edits; ``shell_share``: the chance that this rollout's
    expert uses the task's one-command form."""
    from agent.policies.tito import scripted_output_ids

    stats = stats if stats is not None else RelabelStats()
    stats.rollouts += 1
    events = rollout.events
    messages = [e for e in events if e.get("type") == "assistant_message"]
    sampled = [i for i, s in enumerate(rollout.segments) if s.sampled]
    # a call cut by a limit (wall time) may leave a message but no sampled ids: only the last ones
    messages = messages[: len(sampled)]
    if len(messages) != len(sampled) or any(
            m.get("token_ids") and list(m["token_ids"]) != list(rollout.segments[i].token_ids)
            for m, i in zip(messages, sampled, strict=True)):
        stats.unaligned += 1
        return []
    started = {e["call_id"]: e for e in events if e.get("type") == "tool_call_started"}
    results = {e["call_id"]: e for e in events if e.get("type") == "tool_result"}
    solution = solution_files(task, start)
    state = ExpertState(files={p: start[p] for p in solution},
                        shell=task.shell_edit is not None and shell_share > 0 and rng.random() < shell_share)
    out: list[list[Segment]] = []
    for message, seg_i in zip(messages, sampled, strict=True):
        label = expert_next(task, solution, state, rng)
        if state.unknown:
            stats.unknown_state += 1
        elif label is None:
            stats.no_label += 1
        else:
            ids = scripted_output_ids(label, tokenizer)
            prefix = [t for s in rollout.segments[:seg_i] for t in s.token_ids]
            if len(prefix) + len(ids) > max_len:
                stats.too_long += 1
            else:
                out.append([Segment(prefix, sampled=False), Segment(ids, sampled=True, logprobs=[0.0] * len(ids))])
                stats.examples += 1
                stats.agreed += ids == list(rollout.segments[seg_i].token_ids)
        step = message.get("step")
        calls = sorted((e for e in started.values() if e.get("step") == step), key=lambda e: e.get("index", 0))
        for call in calls:
            observe(state, task, solution, call, results.get(call["call_id"], {}))
    return out


def relabel_all(rollouts: Sequence[Rollout], demo_task_for: Callable[[str], tuple[DemoTask, dict[str, str]] | None],
                tokenizer: Any, *, max_len: int, seed: int = 0,
                shell_share: float = 0.0) -> tuple[list[list[Segment]], RelabelStats]:
    """:func:`relabel` over ``rollouts``; ``demo_task_for(task_id)`` gives a task's tight
    :class:`DemoTask` and start files (``None``: no editable patch; the rollout is skipped).
    Infrastructure-error rollouts are skipped (their states are not the model's)."""
    from rl.types import RolloutStatus

    stats = RelabelStats()
    out: list[list[Segment]] = []
    for r in rollouts:
        if r.status is RolloutStatus.INFRA_ERROR:
            continue
        got = demo_task_for(r.task_id)
        if got is None:
            continue
        out += relabel(r, got[0], got[1], tokenizer, max_len=max_len,
                       rng=random.Random(f"{seed}:{r.task_id}:{r.sample}"), stats=stats, shell_share=shell_share)
    return out, stats


def demo_tasks(tasks: Sequence[Any], store: Any, *, tight: bool = True) -> dict[str, tuple[DemoTask, dict[str, str]]]:
    """Each task's :class:`DemoTask` (tightened when ``tight``) and the start text of the files it
    edits; tasks whose reference patch no ``edit_file`` can express are left out."""
    from rl.tasks.workspaces import materialise
    from rl.train.demos import demo_task_from_patch, shell_edit_for, tighten

    out: dict[str, tuple[DemoTask, dict[str, str]]] = {}
    for task in tasks:
        try:
            demo = demo_task_from_patch(task.id, task.request, task.reference_patch, task.grader.agent_command,
                                        extra_reads=task.grader.test_files)
        except ValueError:
            continue
        demo = dataclasses.replace(demo, shell_edit=shell_edit_for(task))
        base = materialise(task, store)
        try:
            start = {p: base.read_bytes(p).decode() for p in dict.fromkeys(e.path for e in demo.edits)}
            if tight:
                demo = tighten(demo, start.__getitem__)
        finally:
            base.delete()
        out[task.id] = (demo, start)
    return out


@dataclass(slots=True)
class RoundResult:
    """One DAgger round's relabelled examples (SFT-train and SFT-held-out tasks) and its figures."""

    train: list[list[Segment]]
    heldout: list[list[Segment]]
    stats: dict[str, float]


def dagger_round(checkpoint: Any, train_tasks: Sequence[Any], held_tasks: Sequence[Any],
                 demos: dict[str, tuple[DemoTask, dict[str, str]]], tokenizer: Any, *, max_len: int,
                 samples: int, limits: Any, max_tokens: int, store_root: Any, seed: int,
                 sandbox_extra_ro: Sequence[Any] = (), shell_share: float = 0.0,
                 progress: Callable[[int], None] | None = None) -> RoundResult:
    """Free-running rollouts of ``checkpoint`` on both task lists (``rl.rollout.driver.evaluate``:
    Ray workers, the production runtime, temperature 1; an in-memory log: these are training
    data, not a run), each relabelled by :func:`relabel` (``shell_share``: its expert's share of
    one-command forms). ``stats``: the share of rollouts
    solved (the model's own free-running success on these tasks), examples, agreement."""
    from rl.rollout.driver import evaluate
    from rl.rollout.log import MemoryRolloutLog

    got: list[Rollout] = []
    stats: dict[str, float] = {}
    sets: list[list[list[Segment]]] = []
    for name, tasks in (("train", train_tasks), ("heldout", held_tasks)):
        before = len(got)
        evaluate(list(tasks), k=samples, checkpoint=checkpoint, log=MemoryRolloutLog(), limits=limits,
                 temperature=1.0, max_tokens=max_tokens, store_root=store_root, seed=seed, run_id="dagger",
                 on_rollout=got.append, progress=progress, sandbox_extra_ro=sandbox_extra_ro)
        mine = got[before:]
        examples, st = relabel_all(mine, demos.get, tokenizer, max_len=max_len, seed=seed, shell_share=shell_share)
        sets.append(examples)
        graded = [r for r in mine if r.grade is not None]
        stats |= {f"{name}_rollouts": float(len(mine)),
                  f"{name}_solved": sum(bool(r.grade.passed) for r in graded) / max(1, len(graded)),
                  f"{name}_examples": float(st.examples),
                  f"{name}_agreed": st.agreed / max(1, st.examples),
                  f"{name}_unknown_state": float(st.unknown_state),
                  f"{name}_unaligned": float(st.unaligned), f"{name}_too_long": float(st.too_long)}
        family = {t.id: getattr(t, "family", "unknown") for t in tasks}
        for fam in sorted(set(family.values())):
            mine_f = [r for r in graded if family.get(r.task_id) == fam]
            stats[f"{name}_solved_{fam}"] = sum(bool(r.grade.passed) for r in mine_f) / max(1, len(mine_f))
    return RoundResult(sets[0], sets[1], stats)


def run_dagger(model: Any, tokenizer: Any, profile: Any, train_tasks: Sequence[Any], held_tasks: Sequence[Any],
               train_demos: Sequence[list[Segment]], held_demos: Sequence[list[Segment]], run_cfg: Any, *,
               out: Any, seed: int, first: Any, curve_path: Any) -> tuple[Any, list[dict[str, float]]]:
    """``run_cfg.sft.dagger_rounds`` rounds after the first SFT (``first``, its result): each saves
    the current weights, collects and relabels free-running rollouts (:func:`dagger_round`), and
    trains SFT on, and early-stops on, demonstrations + relabelled calls (held-out demonstrations
    + relabelled calls of the SFT-held-out tasks). Appends each round's curve to ``curve_path``
    (steps continue from the first SFT's) and its figures to ``OUT/dagger.jsonl``. Returns the
    last SFT's result (``steps``: all steps) and the rounds' figures. ``model`` ends with the last
    round's best weights."""
    import sys
    from pathlib import Path

    from tqdm import tqdm

    from agent.model.checkpoint import save_checkpoint
    from rl.config import RunConfig
    from rl.rollout.driver import agent_sandbox_paths
    from rl.train.copy_tokens import format_token_ids, user_marker_id
    from rl.train.metrics import append_metrics
    from rl.train.sft import train_sft
    from tools.workspace import WorkspaceStore, remove_store

    run_cfg = run_cfg if run_cfg is not None else RunConfig()
    cfg = run_cfg.sft
    work = Path(out).parent / (Path(out).name + ".dagger")
    rounds: list[dict[str, float]] = []
    res, steps = first, first.steps
    try:
        demos = demo_tasks([*train_tasks, *held_tasks], WorkspaceStore(work / "demos"),
                           tight=cfg.edit_context == "minimal")
        for r in range(cfg.dagger_rounds):
            rng = random.Random(f"{seed}:dagger:{r}")
            tr = rng.sample(list(train_tasks), min(len(train_tasks), cfg.dagger_tasks or len(train_tasks)))
            he = rng.sample(list(held_tasks), min(len(held_tasks), cfg.dagger_heldout_tasks or len(held_tasks)))
            ckpt = work / f"round{r + 1}"
            save_checkpoint(ckpt, model, tokenizer, step=steps, profile=profile)
            bar = tqdm(total=(len(tr) + len(he)) * cfg.dagger_samples, unit="rollout", file=sys.stderr,
                       desc=f"DAgger round {r + 1}/{cfg.dagger_rounds}: free-running rollouts")
            try:
                rr = dagger_round(ckpt, tr, he, demos, tokenizer, max_len=model.cfg.max_seq_len,
                                  samples=cfg.dagger_samples, limits=run_cfg.limits.to_limits(),
                                  max_tokens=run_cfg.rollout.max_tokens_per_call, store_root=work / f"ws{r + 1}",
                                  seed=seed * 1000 + r, progress=bar.update, shell_share=cfg.shell_share,
                                  sandbox_extra_ro=agent_sandbox_paths([*tr, *he], run_cfg.rollout.sandbox_extra_ro))
            finally:
                bar.close()
            print(f"DAgger round {r + 1}: solved {rr.stats['train_solved']:.3f} of train, "
                  f"{rr.stats['heldout_solved']:.3f} of held-out rollouts; {len(rr.train)} + {len(rr.heldout)} "
                  f"relabelled calls ({rr.stats['train_agreed']:.2f} already as the solver would)", file=sys.stderr)
            res = train_sft(model, [*train_demos, *rr.train], [*held_demos, *rr.heldout],
                            cfg.model_copy(update={"max_steps": cfg.dagger_max_steps}), pad_id=tokenizer.pad_id,
                            seed=seed + r + 1, user_id=user_marker_id(tokenizer),
                            format_ids=format_token_ids(tokenizer),
                            progress=lambda p: print(f"round {r + 1} step {int(p['step'])}: train "
                                                     f"{p['train_loss']:.4f} held-out {p['heldout_loss']:.4f}",
                                                     file=sys.stderr))
            for point in res.curve:
                append_metrics(curve_path, point | {"step": point["step"] + steps, "round": float(r + 1)})
            steps += res.steps
            rounds.append(rr.stats | {"round": float(r + 1), "steps": float(res.steps),
                                      "best_heldout_loss": res.best_heldout_loss})
            append_metrics(Path(out) / "dagger.jsonl", rounds[-1])
    finally:
        remove_store(work)
    res.steps = steps
    return res, rounds
