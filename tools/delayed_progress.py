"""A progress bar on stderr that appears only for work that takes time.

:class:`DelayedProgress` shows nothing for work done within
:data:`PROGRESS_AFTER_S` (opening a small workspace prints nothing); after
that a ``tqdm`` bar on stderr shows a count the worker bumps with
:meth:`~DelayedProgress.update` (cheap: an integer add, no lock, no I/O) or
one a ``poll`` callable reads, refreshed four times a second by a daemon thread.

Not guaranteed: the figures are what the worker reports; with ``poll`` the
bar may lag by up to a refresh.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from types import TracebackType

__all__ = ["PROGRESS_AFTER_S", "DelayedProgress"]

PROGRESS_AFTER_S = 1.0
REFRESH_S = 0.25


class DelayedProgress:
    """``with DelayedProgress("hashing src", unit="file") as p: ... p.update()``.

    ``total`` may be set (or changed) later; ``enabled=False`` makes every method a no-op.
    """

    def __init__(self, desc: str, *, unit: str = "it", unit_scale: bool = False, total: int | None = None,
                 poll: Callable[[], int] | None = None, enabled: bool = True,
                 after_s: float | None = None) -> None:
        self.desc, self.unit, self.unit_scale, self.total, self.poll = desc, unit, unit_scale, total, poll
        self.count = 0
        self.shown = False
        self._after = PROGRESS_AFTER_S if after_s is None else after_s
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        if enabled:
            self._thread = threading.Thread(target=self._run, name="flywheel-progress", daemon=True)
            self._thread.start()

    def update(self, n: int = 1) -> None:
        self.count += n

    def _run(self) -> None:
        if self._done.wait(self._after):
            return
        from tqdm import tqdm

        bar = tqdm(desc=self.desc, unit=self.unit, unit_scale=self.unit_scale, total=self.total,
                   file=sys.stderr, leave=False, dynamic_ncols=True)
        self.shown = True
        try:
            while not self._done.wait(REFRESH_S):
                if bar.total != self.total:
                    bar.total = self.total
                bar.n = self.poll() if self.poll is not None else self.count
                bar.refresh()
        finally:
            bar.close()

    def close(self) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> DelayedProgress:
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
