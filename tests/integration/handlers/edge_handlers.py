"""A handler driven by the record's "do" header, for records whose key cannot say it
(null, empty, not UTF-8). Rows use job_handlers.OUTPUT_SCHEMA.

do = fail-once    fails on attempt 0; then one row: key = repr(key), value = repr((value, headers))
do = many         100,000 rows from the one record
do = unprintable  always raises an exception whose str() raises
do = huge         always raises with a 1 MB message
"""

from __future__ import annotations

from retrylib import Record


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("str() of this exception fails")


def handle(record: Record) -> dict | list[dict]:
    action = dict(record.headers).get("do")
    row = {"topic": record.topic, "partition": record.partition, "offset": record.offset}
    if action == b"many":
        return [{**row, "key": f"many-{i}", "value": None, "attempt": 0} for i in range(100_000)]
    if action == b"unprintable":
        raise Unprintable
    if action == b"huge":
        raise RuntimeError("x" * 1_000_000)
    if record.attempt == 0:
        raise RuntimeError("fails once")
    detail = repr((record.value, record.headers))
    return {**row, "key": repr(record.key), "value": detail, "attempt": record.attempt}
