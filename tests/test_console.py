"""`console.drop_closed_loop_callbacks`: what a failed checkpoint read leaves off the console."""

import asyncio
import gc
import logging

import pytest

from jia_jax import console


def report_unretrieved_failure(message: str, kind: str) -> None:
    """Makes asyncio report a task or a bare future (`kind`) that failed with
    ``ValueError(message)`` and that nobody awaited, as it does when the garbage collector frees
    it."""
    loop = asyncio.new_event_loop()

    async def fail():
        raise ValueError(message)

    if kind == "task":
        pending = loop.create_task(fail())
        loop.run_until_complete(asyncio.sleep(0))  # the task runs to its failure
    else:
        pending = loop.create_future()
        pending.set_exception(ValueError(message))
    loop.close()
    del pending
    gc.collect()


@pytest.mark.parametrize("kind, report", [("task", "Task"), ("future", "Future")])
def test_failed_tensorstore_reads_left_unretrieved_are_dropped_and_others_kept(
    caplog, kind, report
):
    console.drop_closed_loop_callbacks()
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        report_unretrieved_failure(
            "OUT_OF_RANGE: Error reading \"state/d/6a3b\" "
            "[tensorstore_spec='{\"driver\":\"zarr\"}']",
            kind,
        )
        report_unretrieved_failure("a failure of something else", kind)
    reports = [r.getMessage() for r in caplog.records]
    assert len(reports) == 1, reports
    assert reports[0].startswith(f"{report} exception was never retrieved")
    assert "a failure of something else" in reports[0]
