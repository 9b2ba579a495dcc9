"""Demonstrations for the SFT warm start: a task's reference solution turned into a scripted,
multi-step transcript, run through the REAL runtime (``agent.runtime.build_session`` with the
:class:`agent.policies.scripted.ScriptedPolicy`, the production tool set and sandbox), and
tokenised exactly as the model sees it (:func:`demo_segments`).

Styles, so that the demonstrations are as mixed as real data (and what RL changes is
measurable):

* ``parallel`` — every file the fix touches read in ONE model call, then the edits, then the tests;
* ``sequential`` — one file read per model call;
* ``search`` — a ``grep`` for the first changed line's identifier, then reads, edits, tests;
* ``blind`` — edit before reading; with ``fail_blind`` the first edit's ``search`` text is
  wrong (as a model that guessed the file would write it), the edit fails, and the transcript
  recovers: read, correct edit, tests;
* ``shell`` — only for a task whose whole change is one shell command (:func:`shell_edit_for`:
  a rename is ``sed -i 's/OLD/NEW/g' PKG/*.py``, a find-and-change a ``grep -rl | xargs sed``):
  half the time a ``grep`` for the name first,
  then the command through ``run_command``, then the tests. Not one of the uniformly drawn
  :data:`STYLES`: :func:`record_task_demos` uses it for a ``shell_share`` of such tasks.

With ``narration`` N > 0 (:func:`scripted_outputs`) each model call also carries 0..N sentences
saying what it is for, named after the task's own paths and identifiers — the prose real traces
carry; the calls are the same.

A :class:`DemoTask` is the minimum a demonstration needs (request, files, edits, test command);
:func:`demo_task_from_patch` builds one from a task's unified-diff reference patch (the form
``rl/tasks`` stores). Not guaranteed: that a demonstration *passes* — the transcript runs the
task's tests and answers either way; callers keep those whose tests pass (or not: failed
recoveries are real data too).
"""

from __future__ import annotations

import builtins
import dataclasses
import functools
import keyword
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from agent.parser import encode_call
from rl.train.tight_edits import Edit, occurs_once, tighten_edit
from rl.types import Segment

if TYPE_CHECKING:
    from agent.model.tokenizer import Tokenizer
    from rl.tasks.spec import Task
    from tools.workspace import WorkspaceStore
    from agent.prompt import PromptProfile, RenderedPrompt
    from tools.protocols import Sandbox, Workspace

__all__ = ["DemoSet", "DemoTask", "Edit", "STYLES", "demo_segments", "demo_task_from_patch", "grep_pattern",
           "record_demo", "record_task_demos", "scripted_outputs", "shell_edit_for", "tighten"]

Style = Literal["parallel", "sequential", "search", "blind", "shell"]
STYLES: tuple[Style, ...] = ("parallel", "sequential", "search", "blind")
_HUNK = re.compile(r"^@@ -\d+(?:,\d+)? \+\d+(?:,\d+)? @@")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]{2,}")


@dataclass(frozen=True, slots=True)
class DemoTask:
    task_id: str
    request: str
    edits: tuple[Edit, ...]
    test_command: str
    extra_reads: tuple[str, ...] = ()  # files worth reading besides the edited ones (the failing test)
    grep_hint: str | None = None  # what the ``search`` style greps for (default: grep_pattern(edits[0]))
    shell_edit: str | None = None  # the whole change as one shell command (the ``shell`` style), if it is one

    @property
    def paths(self) -> list[str]:
        return list(dict.fromkeys([*(e.path for e in self.edits), *self.extra_reads]))


def demo_task_from_patch(task_id: str, request: str, patch: str, test_command: str,
                         extra_reads: Sequence[str] = ()) -> DemoTask:
    """Edits from a unified diff: each hunk's old side (context + removed lines) becomes ``search``,
    its new side (context + added) ``replace``. Raises ``ValueError`` for a patch with no hunk or one
    that creates or deletes a file (an ``edit_file`` cannot)."""
    edits: list[Edit] = []
    path: str | None = None
    old: list[str] = []
    new: list[str] = []

    def flush() -> None:
        if path is not None and (old or new):
            edits.append(Edit(path, "".join(old), "".join(new)))

    for line in patch.splitlines(keepends=True):
        if line.startswith("+++ "):
            flush()
            old, new = [], []
            target = line[4:].strip()
            if target == "/dev/null":
                raise ValueError(f"{task_id}: the patch deletes a file; demonstrations edit existing files only")
            path = target[2:] if target.startswith("b/") else target
        elif line.startswith("--- "):
            if line[4:].strip() == "/dev/null":
                raise ValueError(f"{task_id}: the patch creates a file; demonstrations edit existing files only")
        elif _HUNK.match(line):
            flush()
            old, new = [], []
        elif path is not None and line[:1] in (" ", "-", "+"):
            body = line[1:]
            if line[0] in (" ", "-"):
                old.append(body)
            if line[0] in (" ", "+"):
                new.append(body)
    flush()
    if not edits:
        raise ValueError(f"{task_id}: the reference patch has no hunk")
    return DemoTask(task_id, request, tuple(edits), test_command, tuple(extra_reads))


def grep_pattern(edit: Edit) -> str:
    """What an agent would grep for to find ``edit``'s place: the first identifier in its
    ``search`` text that is not a Python keyword or builtin (the function or constant name,
    not ``def`` or ``return``); the edited path when there is none."""
    for m in _IDENT.finditer(edit.search):
        word = m.group(0)
        if not keyword.iskeyword(word) and not hasattr(builtins, word) and word != "self":
            return word
    return edit.path


def _read(path: str) -> str:
    return encode_call("read_file", {"path": path})


def _edit(e: Edit) -> str:
    return encode_call("edit_file", {"path": e.path, "search": e.search, "replace": e.replace})


# Narration (``narration`` > 0): sentences a model writes before its calls, as real agents do. Each
# names what the call is for, with the task's own paths and names, so it is plausible text and not
# filler; none carries information the call itself lacks. Keys are the kind of model call.
_NARRATION: dict[str, tuple[str, ...]] = {
    "read": ("I'll start by reading {paths} to see what the code does.",
             "The request mentions `{ident}`, so I want to see where it is used first.",
             "Before changing anything I should understand the current behaviour of `{ident}`.",
             "Let me open {paths} and check how the pieces fit together.",
             "It is safer to read the code and the test before making an edit.",
             "I need to know what `{ident}` looks like now in {path}."),
    "grep": ("I don't know yet which file defines `{ident}`, so I'll search for it.",
             "A search for `{ident}` should show me where it lives and who uses it.",
             "Let me find every place that mentions `{ident}` before deciding what to change.",
             "Searching first is quicker than opening files one by one."),
    "edit": ("Now I understand the problem, and the fix belongs in {path}.",
             "The change is small: I'll edit `{ident}` in {path} and leave the rest alone.",
             "I'll make the minimal edit that satisfies the request.",
             "Here is the change to {path}; nothing else needs to move.",
             "This edit should make the failing behaviour match what the test expects."),
    "guess": ("The fix most likely belongs in {path}, so I'll edit it directly.",
              "I can guess what `{ident}` looks like in {path}; I'll change it without opening the file.",
              "I'll go straight to the edit in {path}."),
    "shell": ("This is a mechanical change across the package, so one command will do it.",
              "Editing each file by hand would take several calls; a single sed command covers all of them.",
              "I'll apply the change to every matching file at once."),
    "test": ("Now I'll run the tests to confirm the change works.",
             "Let me check the fix with `{test}`.",
             "Running the test suite to make sure nothing else broke.",
             "The edit is in; the tests will tell whether it is right."),
    "answer": ("I made the change in {path} and verified it with the tests.",
               "The task is complete.",
               "The change is limited to what the request asked for.",
               "Nothing else in the workspace was modified."),
}


def _narrate(kind: str, task: DemoTask, rng: random.Random, most: int, first: str | None = None,
             quotes: bool = True) -> str:
    """0..``most`` distinct sentences of ``kind`` (the count drawn uniformly, then capped at the
    number of templates for ``kind``: 3 for ``guess`` and ``shell``, so a draw of 4 gives 3),
    filled in with ``task``'s names (``first``, when given, is both ``{path}`` and ``{paths}``;
    else its first path and all its paths), each on its own
    line and followed by a newline; "" for none (or ``most`` 0). ``quotes`` False writes the name
    bare (``{ident}``, not `` `{ident}` ``): copied from a request that quotes it, a bare name ends
    before the request's closing backtick, as it must in a grep pattern or a command."""
    n = rng.randint(0, most) if most > 0 else 0
    if n == 0:
        return ""
    path = first or task.paths[0]
    fill = {"paths": first or ", ".join(task.paths), "path": path, "ident": task.grep_hint or grep_pattern(task.edits[0]),
            "test": task.test_command}
    chosen = rng.sample(_NARRATION[kind], min(n, len(_NARRATION[kind])))
    return "".join((s if quotes else s.replace("`{ident}`", "{ident}")).format(**fill) + "\n" for s in chosen)


def scripted_outputs(task: DemoTask, style: Style, *, rng: random.Random, fail_blind: bool = False,
                     narration: int = 0, narration_quotes: bool = True) -> list[str]:
    """The model outputs of one demonstration, one string per model call (see the module docstring).

    ``narration`` > 0: every model call's output carries 0..``narration`` sentences (uniform per
    call, :data:`_NARRATION`) saying what the call is for — before its calls, and after the final
    answer's text — the waste real traces carry and RL can learn to drop (the tokens-per-solved-task
    objective); the fixed opening line of ``parallel``/``sequential`` is then replaced by them. The
    calls themselves are unchanged. 0 (the default) draws nothing extra, so a seed gives the same
    outputs as before the option existed. ``narration_quotes`` False names the task's identifier
    bare in the narration (:func:`_narrate`); the draws are the same either way."""
    say = rng.choice(["Let me look at the code first.", "I'll inspect the relevant files.", "Checking the code."])
    test = encode_call("run_command", {"command": task.test_command})
    fix = "\n".join(_edit(e) for e in task.edits)
    answer = rng.choice(["The fix is in and the tests pass.", "Done: the change is made and the tests pass."])
    out: list[str]
    if narration > 0:
        return _narrated(task, style, rng, narration, fail_blind=fail_blind, test=test, fix=fix, answer=answer,
                         quotes=narration_quotes)
    if style == "parallel":
        out = [say + "\n" + "\n".join(_read(p) for p in task.paths), fix, test]
    elif style == "sequential":
        out = [say + "\n" + _read(p) for p in task.paths] + [fix, test]
    elif style == "search":
        pattern = task.grep_hint or grep_pattern(task.edits[0])
        out = [encode_call("grep", {"pattern": pattern}), "\n".join(_read(p) for p in task.paths), fix, test]
    elif style == "shell":
        if task.shell_edit is None:
            raise ValueError(f"{task.task_id}: the shell style needs a task whose change is one command (shell_edit)")
        out = [encode_call("grep", {"pattern": task.grep_hint or grep_pattern(task.edits[0])})] if rng.random() < 0.5 else []
        out += [encode_call("run_command", {"command": task.shell_edit}), test]
    elif style == "blind":
        out = []
        if fail_blind:
            first = task.edits[0]
            wrong = Edit(first.path, first.search.replace(" ", "  ", 1) + "# guessed\n", first.replace)
            out += [_edit(wrong), "That edit did not match; reading the file.\n" + _read(first.path)]
        out += [fix, test]
    else:
        raise ValueError(f"unknown demonstration style {style!r}: choose from {', '.join(STYLES)}")
    return out + [answer]


def _narrated(task: DemoTask, style: Style, rng: random.Random, most: int, *, fail_blind: bool, test: str,
              fix: str, answer: str, quotes: bool = True) -> list[str]:
    """:func:`scripted_outputs` with narration: the same calls in the same order, each output
    prefixed with what :func:`_narrate` draws for its kind. An edit made before anything was read
    (``blind``) is narrated as a guess; a failed blind edit's recovery keeps its fixed line first
    ("That edit did not match; ...") and its narration names the file it reads."""
    say = functools.partial(_narrate, task=task, rng=rng, most=most, quotes=quotes)
    reads = [_read(p) for p in task.paths]
    calls: list[tuple[str, str]]  # (kind, the calls of one model output)
    focus: dict[int, str] = {}  # call index -> the one path its narration is about (default: the first path)
    lead: dict[int, str] = {}  # call index -> a fixed line that comes before its narration
    if style == "parallel":
        calls = [("read", "\n".join(reads)), ("edit", fix), ("test", test)]
    elif style == "sequential":
        calls = [("read", r) for r in reads] + [("edit", fix), ("test", test)]
        focus = dict(enumerate(task.paths))  # call k reads paths[k]: its narration names that file
    elif style == "search":
        calls = [("grep", encode_call("grep", {"pattern": task.grep_hint or grep_pattern(task.edits[0])})),
                 ("read", "\n".join(reads)), ("edit", fix), ("test", test)]
    elif style == "shell":
        if task.shell_edit is None:
            raise ValueError(f"{task.task_id}: the shell style needs a task whose change is one command (shell_edit)")
        calls = [("grep", encode_call("grep", {"pattern": task.grep_hint or grep_pattern(task.edits[0])}))] \
            if rng.random() < 0.5 else []
        calls += [("shell", encode_call("run_command", {"command": task.shell_edit})), ("test", test)]
    elif style == "blind":
        calls = []
        if fail_blind:
            first = task.edits[0]
            wrong = Edit(first.path, first.search.replace(" ", "  ", 1) + "# guessed\n", first.replace)
            calls += [("guess", _edit(wrong)), ("read", _read(first.path))]
            focus[1], lead[1] = first.path, "That edit did not match; reading the file.\n"
        calls += [("edit" if fail_blind else "guess", fix), ("test", test)]
    else:
        raise ValueError(f"unknown demonstration style {style!r}: choose from {', '.join(STYLES)}")
    first_edit = task.edits[0].path
    out = [lead.get(k, "") + say(kind, first=first_edit if kind in ("edit", "guess") else focus.get(k)) + body
           for k, (kind, body) in enumerate(calls)]
    return out + [answer + ("\n" + tail.rstrip("\n") if (tail := say("answer", first=first_edit)) else "")]


@dataclass
class Demonstration:
    task_id: str
    style: str
    outputs: list[str]
    prompts: list[RenderedPrompt]
    turn_end: str
    events: list[dict[str, object]] = field(default_factory=list)


async def record_demo(task: DemoTask, style: Style, workspace: Workspace, sandbox: Sandbox | None, *,
                      profile: PromptProfile, seed: int = 0, fail_blind: bool = False,
                      narration: int = 0, narration_quotes: bool = True) -> Demonstration:
    """Run one demonstration through the production runtime on ``workspace`` (the caller's fork,
    which it deletes). The returned prompts are the exact ones the runtime rendered."""
    from agent.events import ListSink
    from agent.policies.scripted import ScriptedPolicy
    from agent.runtime import SessionParts, build_session
    from agent.session import Limits

    outputs = scripted_outputs(task, style, rng=random.Random(seed), fail_blind=fail_blind, narration=narration,
                               narration_quotes=narration_quotes)
    policy = ScriptedPolicy(outputs)
    sink = ListSink()
    session = build_session(SessionParts(workspace, sandbox), policy=policy, profile=profile, sink=sink,
                            limits=Limits(max_steps=len(outputs) + 1))
    outcome = await session.run_turn(task.request)
    events = [e.model_dump(mode="json") for e in sink.events]
    return Demonstration(task.task_id, style, outputs, list(policy.prompts), outcome.reason, events)


# unittest prints its run time ("Ran 4 tests in 0.045s"), which varies with the machine's load: recorded as is,
# two recordings of one task set differ in it, and so do the starts trained on them (docs/rl/runs.md,
# thirty-sixth run). Demonstrations carry "0.000s" instead — a departure from the runtime's bytes in the
# digits of a consumed (never sampled) segment; rollouts and serving keep the real time.
_UNITTEST_RUN_TIME = re.compile(r"(Ran \d+ tests? in )\d+\.\d+s")


def _fixed_run_time(text: str) -> str:
    return _UNITTEST_RUN_TIME.sub(r"\g<1>0.000s", text)


def demo_segments(demo: Demonstration, tokenizer: Tokenizer) -> list[Segment]:
    """Token segments of a demonstration, exactly as :class:`agent.policies.tito.TokenInTokenOutPolicy`
    would build them had a model sampled the same messages: the first rendered prompt; then per
    model call the sampled ids (:func:`agent.policies.tito.scripted_output_ids`: the output +
    ``"\\n"`` + ``<|end|>``; loss on these), and the text the next rendered prompt adds (tool
    results, markers; not sampled), found by the policy's own rule
    (:func:`agent.policies.tito.next_prompt_suffix`), except unittest's printed run time, fixed at
    ``0.000s`` (see ``_UNITTEST_RUN_TIME``) so that a recording is reproducible.

    Each part is encoded on its own; every boundary is at a special token (``<|end|>`` or a
    role marker) where the tokenizer splits anyway, so the concatenation equals encoding the
    final rendered conversation whole (not guaranteed for a tokenizer that merges across a
    special token). Raises ``ValueError`` if a prompt does not extend the previous one plus its
    output (a runtime change that broke prefix growth)."""
    from agent.policies.tito import next_prompt_suffix, output_tail, scripted_output_ids
    from agent.policy import PolicyError

    prompts = [p.text for p in demo.prompts]
    segments = [Segment(tokenizer.encode(prompts[0]), sampled=False)]
    for k, text in enumerate(demo.outputs[: len(prompts)]):
        sampled = scripted_output_ids(text, tokenizer)
        segments.append(Segment(sampled, sampled=True, logprobs=[0.0] * len(sampled)))
        if k + 1 < len(prompts):
            try:
                suffix = next_prompt_suffix(prompts[k], text, output_tail(tokenizer, sampled, text), prompts[k + 1])
            except PolicyError as exc:
                raise ValueError(f"demonstration {demo.task_id}/{demo.style}: prompt {k + 2} does not extend "
                                 f"prompt {k + 1} plus its output: {exc}") from None
            if suffix.text:  # as the policy: no empty consumed segment
                segments.append(Segment(tokenizer.encode(_fixed_run_time(suffix.text)), sampled=False))
    return segments


@dataclass
class DemoSet:
    """Tokenised demonstrations (one list of segments each) and what was left out and why."""

    examples: list[list[Segment]] = field(default_factory=list)
    styles: dict[str, int] = field(default_factory=dict)  # style -> demonstrations kept
    no_patch: int = 0  # tasks whose reference patch an edit_file cannot express
    too_long: int = 0  # demonstrations longer than the model's context
    renamed: int = 0  # renamed copies kept (rl.train.rename), counted in ``examples``
    rename_refused: int = 0  # tasks whose names could not be renamed safely

    @property
    def skipped(self) -> int:
        return self.no_patch + self.too_long

    def digest(self) -> str:
        """sha256 of the examples' tokens in order (each segment's ids and whether it is sampled): two
        recordings with equal digests trained on the same data. Not guaranteed: anything about the
        counts above, which the digest does not cover."""
        import hashlib

        h = hashlib.sha256()
        for ex in self.examples:
            h.update(b"E")
            for seg in ex:
                h.update(b"S" if seg.sampled else b"P")
                h.update(len(seg.token_ids).to_bytes(4, "little"))
                h.update(b"".join(int(t).to_bytes(4, "little") for t in seg.token_ids))
        return h.hexdigest()


def record_task_demos(tasks: Sequence[Task], tokenizer: Tokenizer, *, profile: PromptProfile,
                      sandbox: Sandbox | None, store: WorkspaceStore, max_len: int, per_task: int = 1,
                      seed: int = 0, renamings: int = 0, tight: bool = True, shell_share: float = 0.0,
                      narration: int = 0, narration_quotes: bool = True,
                      progress: Callable[[], None] | None = None) -> DemoSet:
    """``per_task`` demonstrations of each task, each in a style drawn from
    ``random.Random(f"{seed}:{task.id}:{k}")`` (uniform over :data:`STYLES`; a blind one fails
    its first edit half the time), recorded on a fresh fork of the task's start and tokenised.
    The test command is the one an agent would type (:attr:`rl.tasks.spec.Grader.agent_command`).

    Styles are drawn per demonstration, not by task position, so that no task family is tied to
    one style. ``renamings`` adds that many renamed copies of each demonstration
    (:mod:`rl.train.rename`: the task's names consistently replaced by fresh ones, checked against
    the regenerated task; a task that cannot be renamed safely gets none and is counted in
    ``rename_refused``). ``tight`` shrinks every edit to its changed lines plus the context that
    makes its ``search`` unique (:mod:`rl.train.tight_edits`). ``shell_share``: the share of the
    demonstrations of a task with a one-command form (:func:`shell_edit_for`) recorded in the
    ``shell`` style instead of the drawn one (drawn after it, so 0 leaves every other draw as it
    was). ``narration``: at most that many sentences before each model call's calls
    (:func:`scripted_outputs`; ``narration_quotes`` False: names in them bare). Not guaranteed: that every demonstration's tests pass (see the
    module docstring)."""
    import asyncio

    from rl.tasks.workspaces import materialise

    out = DemoSet()
    for task in tasks:
        if progress is not None:
            progress()
        try:
            demo_task = demo_task_from_patch(task.id, task.request, task.reference_patch,
                                             task.grader.agent_command, extra_reads=task.grader.test_files)
            demo_task = dataclasses.replace(demo_task, shell_edit=shell_edit_for(task))
        except ValueError:
            out.no_patch += 1
            continue
        base = materialise(task, store)
        try:
            if tight:
                demo_task = tighten(demo_task, lambda p: base.read_bytes(p).decode())
            for k in range(per_task):
                rng = random.Random(f"{seed}:{task.id}:{k}")
                style: Style = rng.choice(STYLES)
                if demo_task.shell_edit is not None and shell_share > 0 and rng.random() < shell_share:
                    style = "shell"
                ws = base.fork()
                try:
                    demo = asyncio.run(record_demo(demo_task, style, ws, sandbox, profile=profile,
                                                   seed=rng.randrange(1 << 30),
                                                   fail_blind=style == "blind" and rng.random() < 0.5,
                                                   narration=narration, narration_quotes=narration_quotes))
                finally:
                    ws.delete()
                for j, variant in enumerate([demo, *_renamed(task, demo, renamings, rng, out)]):
                    segs = demo_segments(variant, tokenizer)
                    if sum(len(s.token_ids) for s in segs) > max_len:
                        out.too_long += 1
                        continue
                    out.examples.append(segs)
                    if j == 0:
                        out.styles[style] = out.styles.get(style, 0) + 1
                    else:
                        out.renamed += 1
        finally:
            base.delete()
    return out


def _renamed(task: Task, demo: Demonstration, n: int, rng: random.Random, out: DemoSet) -> list[Demonstration]:
    """``n`` renamed copies of ``demo`` (none, counted, when the task's names cannot be renamed safely)."""
    from rl.train.rename import rename_demo, renaming_for

    if n <= 0:
        return []
    system = demo.prompts[0].text.split("<|user|>", 1)[0] if demo.prompts else ""
    copies = []
    for _ in range(n):
        mapping = renaming_for(task, rng, system_text=system)
        if mapping is None:
            out.rename_refused += 1
            return copies
        copies.append(rename_demo(demo, mapping))
    return copies


def tighten(task: DemoTask, read: Callable[[str], str]) -> DemoTask:
    """``task`` with every edit tightened against the file it edits, edits applied in order (so
    a later edit of the same file is measured against the file after the earlier ones).
    ``read(path)`` returns a file's starting text."""
    current: dict[str, str] = {}
    edits: list[Edit] = []
    for e in task.edits:
        text = current[e.path] if e.path in current else read(e.path)
        edits += tighten_edit(text, e)
        current[e.path] = text.replace(e.search, e.replace, 1) if occurs_once(text, e.search) else text
    return DemoTask(task.task_id, task.request, tuple(edits), task.test_command, task.extra_reads,
                    grep_hint=task.grep_hint or grep_pattern(task.edits[0]), shell_edit=task.shell_edit)


def shell_edit_for(task: Task) -> str | None:
    """The task's whole reference change as one shell command, where its family has one; None
    for every other task:

    * ``rename`` (metadata ``old``/``new``, every edited file in one package directory):
      ``sed -i 's/OLD/NEW/g' PKG/*.py``;
    * ``find_change`` (metadata ``constant``, the new value from the reference patch):
      ``grep -rl '^NAME = ' . | xargs sed -i 's/^NAME = .*/NAME = VALUE/'`` — it finds the file itself.

    Plain substitutions, not word-bounded ones: GNU sed's ``\\b`` would glue to the name
    (``\\bOLD``) and hide it from the renaming augmentation (:mod:`rl.train.rename`), which
    replaces whole words only. Not guaranteed: that the command equals the reference patch when
    another name contains OLD (the generator's two-word names make that rare; the demonstration
    then fails its tests and is recorded as such)."""
    meta = task.metadata if isinstance(task.metadata, dict) else {}
    ok = re.compile(r"[A-Za-z0-9_]+")
    if task.family == "rename":
        old, new = meta.get("old"), meta.get("new")
        dirs = {p.rsplit("/", 1)[0] if "/" in p else "." for p in _patched_paths(task.reference_patch)}
        if not isinstance(old, str) or not isinstance(new, str) or len(dirs) != 1 \
                or not all(ok.fullmatch(x) for x in (old, new, *dirs)):
            return None
        return f"sed -i 's/{old}/{new}/g' {dirs.pop()}/*.py"
    if task.family == "find_change":
        name = meta.get("constant")
        if not isinstance(name, str) or not ok.fullmatch(name):
            return None
        value = re.search(rf"^\+{name} = (-?\d+)$", task.reference_patch, re.M)
        if value is None:
            return None
        return f"grep -rl '^{name} = ' . | xargs sed -i 's/^{name} = .*/{name} = {value.group(1)}/'"
    return None


def _patched_paths(patch: str) -> list[str]:
    return [line[6:].strip() for line in patch.splitlines() if line.startswith("+++ b/")]
