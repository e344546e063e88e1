"""XLA's own account of the train step's command-buffer updates, read from a trainer's output.

Before launching a command buffer (a CUDA graph), XLA checks the address of every buffer
allocation the buffer's commands use; where one moved since the last launch it updates the
command buffer, recording again each command that uses a moved allocation and skipping the rest
(openxla/xla: `CommandBufferThunk::ExecuteOnStream`, `CommandExecutor::RecordUpdate`). At the
verbosity `ENV` sets it logs each update: the allocations that moved, and the commands updated
and skipped, with the time taken. `summary` turns those lines into figures a step: how often the
step updates, how many allocations moved, how many commands it recorded again.
"""

from __future__ import annotations

import re
import statistics
from typing import Any

from scripts.bench import harness

# The environment that has XLA log its command-buffer updates (the thunk's at level 3, the
# executor's count of commands at level 1; older XLA logged the latter from command_buffer_cmd).
ENV = {
    "TF_CPP_MIN_LOG_LEVEL": "0",
    "TF_CPP_VMODULE": "command_buffer_thunk=3,command_executor=1,command_buffer_cmd=1",
}

# XLA's wording has changed between versions ("Update command buffer on device #0 ...",
# "[0] Create/Update command buffer by recoding ..."); both end the line with the counts.
_UPDATE = re.compile(r"Update command buffer\b[^\n]*?updated_allocs=(\d+)")
_RECORDED = re.compile(r"Updated (\d+) commands in (\d+) \S+ \(skipped (\d+) command updates\)")


def summary(log: str, steps: int) -> dict[str, Any] | None:
    """Per step, over the part of `log` between its first and last progress lines (compilation
    and warm-up before the first; the final eval's programs after the last), spanning `steps`
    steps: command-buffer updates, commands recorded again and skipped, µs spent recording, and
    the median count of moved allocations an update. None where that part logs no update (none
    happened, or the XLA of the run logs them otherwise)."""
    lines = list(harness.PROGRESS.finditer(log))
    steady = log[lines[0].end():lines[-1].start()] if lines else log
    moved = [int(m.group(1)) for m in _UPDATE.finditer(steady)]
    recorded = [tuple(map(int, m.groups())) for m in _RECORDED.finditer(steady)]
    if not moved and not recorded:
        return None
    return {
        "updates_per_step": len(moved) / steps,
        "moved_allocations_median": statistics.median(moved) if moved else None,
        "recorded_per_step": sum(n - skipped for n, _, skipped in recorded) / steps,
        "skipped_per_step": sum(skipped for *_, skipped in recorded) / steps,
        "record_us_per_step": sum(us for _, us, _ in recorded) / steps,
    }
