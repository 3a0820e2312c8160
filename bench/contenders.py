"""The two contenders that are not retrylib, each run in a process of its own:

- `ceiling`: a plain confluent-kafka consumer reading every record and doing nothing.
- `baseline`: what a user writes without retrylib, seed-style: one process, a consumer,
  the handler per record, a failed record produced to a retry topic with retry headers,
  output rows appended to a Delta table every `flush_every` records with the `deltalake`
  package (delta-rs, as a one-process job without Spark would), consumer offsets committed
  after each append (at-least-once).

Run as `python -m bench.contenders {ceiling|baseline} ARGS_JSON RESULT_JSON`; the result
holds epoch times: `started` (process ready), `first` (first record received) and `done`
(every record read and, for the baseline, every effect durable), plus counts.
"""

from __future__ import annotations

import json
import sys
import time
import uuid

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer

_CONSUMER = {"enable.auto.commit": False, "auto.offset.reset": "earliest"}
_CONSUME_BATCH = 10_000


def _consumer(bootstrap: str, topic: str) -> Consumer:
    consumer = Consumer(
        {**_CONSUMER, "bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex}"}
    )
    consumer.subscribe([topic])
    return consumer


def ceiling(args: dict) -> dict:
    consumer = _consumer(args["bootstrap"], args["topic"])
    started = time.time()
    wanted, seen, first, size = args["records"], 0, None, 0
    while seen < wanted:
        messages = consumer.consume(min(_CONSUME_BATCH, wanted - seen), timeout=1.0)
        if messages and first is None:
            first = time.time()
        for message in messages:
            if message.error() is None:
                seen += 1
            elif message.error().code() != KafkaError._PARTITION_EOF:
                raise RuntimeError(str(message.error()))
    done = time.time()
    consumer.close()
    return {"started": started, "first": first, "done": done, "records": seen, "bytes": size}


def baseline(args: dict) -> dict:
    import pyarrow as pa
    from deltalake import write_deltalake

    from bench.handlers import HANDLERS
    from retrylib.record import Record

    handler = HANDLERS[args["handler"]]
    schema = pa.schema([("partition", pa.int32()), ("offset", pa.int64()), ("size", pa.int32())])
    table, retry_topic, flush_every = args["table"], args["retry_topic"], args["flush_every"]
    delay_ms = args["delay_ms"]
    producer = Producer(
        {
            "bootstrap.servers": args["bootstrap"],
            "enable.idempotence": True,
            "linger.ms": 5,
            "compression.type": "lz4",
        }
    )
    consumer = _consumer(args["bootstrap"], args["topic"])
    started = time.time()
    wanted, seen, first = args["records"], 0, None
    rows: list[dict] = []
    counts = {"succeeded": 0, "retried": 0, "flushes": 0, "flush_seconds": 0.0}
    handler_seconds = 0.0
    since_flush = 0

    def flush() -> None:
        t = time.perf_counter()
        if rows:
            write_deltalake(table, pa.Table.from_pylist(rows, schema=schema), mode="append")
            rows.clear()
        producer.flush(60)
        try:
            consumer.commit(asynchronous=False)
        except KafkaException as e:  # nothing consumed since the last commit
            if e.args[0].code() != KafkaError._NO_OFFSET:
                raise
        counts["flushes"] += 1
        counts["flush_seconds"] += time.perf_counter() - t

    while seen < wanted:
        messages = consumer.consume(min(_CONSUME_BATCH, wanted - seen), timeout=1.0)
        if messages and first is None:
            first = time.time()
        for m in messages:
            error = m.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    continue
                raise RuntimeError(str(error))
            seen += 1
            since_flush += 1
            headers = m.headers() or []
            attempt = int(dict(headers).get("attempt", b"0"))
            record = Record(
                m.key(),
                m.value(),
                headers,
                m.topic(),
                m.partition(),
                m.offset(),
                m.timestamp()[1],
                attempt,
            )
            t = time.perf_counter()
            try:
                rows.append(handler(record))
                counts["succeeded"] += 1
            except Exception as e:  # the seed way: re-publish with retry headers
                now_ms = int(time.time() * 1000)
                retry_headers = [
                    *headers,
                    ("attempt", str(attempt + 1).encode()),
                    ("not_before", str(now_ms + delay_ms).encode()),
                    ("origin", f"{m.topic()}/{m.partition()}/{m.offset()}".encode()),
                    ("error", f"{type(e).__name__}: {e}".encode()),
                ]
                while True:
                    try:
                        producer.produce(
                            retry_topic, key=m.key(), value=m.value(), headers=retry_headers
                        )
                        break
                    except BufferError:
                        producer.poll(0.05)
                producer.poll(0)
                counts["retried"] += 1
            handler_seconds += time.perf_counter() - t
            if since_flush >= flush_every:
                flush()
                since_flush = 0
    if since_flush:
        flush()
    done = time.time()
    consumer.close()
    return {
        "started": started,
        "first": first,
        "done": done,
        "records": seen,
        **counts,
        "handler_seconds": handler_seconds,
    }


def main(argv: list[str]) -> int:
    kind, args_json, result_path = argv
    args = json.loads(args_json)
    result = {"ceiling": ceiling, "baseline": baseline}[kind](args)
    with open(result_path, "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
