"""Deterministic fault points for the fault tests (tests/test_faults.py); inert unless GNNSCALE_FAULT is set.

GNNSCALE_FAULT="<point>[#<n>]:<action>" acts on the n-th (default: first) pass through fault_point(<point>)
in this process. Points: "train.batch" (a training batch ended), "infer.batch" (an inference batch of a
layer ended), "csc.shard" (build-csr scattered a shard), "write:<file name>" (an atomic write of that file
is complete under its temporary name, not yet renamed into place). Actions: kill (SIGKILL: no cleanup
runs), int (SIGINT: Ctrl-C), enospc (OSError ENOSPC from the write), nan (the point's caller makes its
value non-finite), wait (write the file $GNNSCALE_FAULT_MARK, then sleep until killed).
"""

from __future__ import annotations

import errno
import os
import signal
import time

_counts: dict[str, int] = {}


def fault_point(point: str) -> str | None:
    """None, or the action a caller must carry out itself ("nan"); kill / int / enospc / wait happen here."""
    spec = os.environ.get("GNNSCALE_FAULT")
    if not spec:
        return None
    where, _, action = spec.rpartition(":")
    name, _, nth = where.partition("#")
    if name != point:
        return None
    _counts[point] = _counts.get(point, 0) + 1
    if _counts[point] != int(nth or 1):
        return None
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)
    if action == "int":
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.5)  # the handler runs at the next bytecode; KeyboardInterrupt surfaces from here
    if action == "enospc":
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    if action == "wait":
        mark = os.environ.get("GNNSCALE_FAULT_MARK")
        if mark:
            with open(mark, "w") as fh:
                fh.write(str(os.getpid()))
        time.sleep(120)
    return action
