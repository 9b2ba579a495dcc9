"""Task sets and graders for the RL flywheel.

* :mod:`rl.tasks.spec` — the :class:`~rl.tasks.spec.Task` model and its JSONL file format;
* :mod:`rl.tasks.families` — procedural families (fix a bug, rename, find and change,
  implement a stub) with train/held-out vocabularies that share no word;
* :mod:`rl.tasks.realcode` — mutation bugs in real sdists graded by their own tests;
* :mod:`rl.tasks.mutations` — the mutation machinery (shared with the search benchmarks);
* :mod:`rl.tasks.workspaces` — starting workspaces, patches, pinned sdist downloads;
* :mod:`rl.tasks.grading` — ``grade(task, workspace, sandbox)`` on a fresh fork, tests restored;
* :mod:`rl.tasks.build` — build and validate a task set (``flywheel rl tasks build``).

Importing this package imports nothing heavy.
"""
