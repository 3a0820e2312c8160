"""Log setup: retrylib's own lines at INFO, Spark, py4j and Kafka client noise quiet, secrets
never written.

Lines go to stderr as text (`time level logger: message`) or, with RETRYLIB_LOG_FORMAT=json,
as one JSON object per line. Every line passes a `RedactingFilter` that replaces the secret
values of the loaded config (`Config.secret_values`) with "***", tracebacks included; the CLI
runs what it prints through `redact` too. Processes where nothing sets logging up (Spark's
Python workers) mask as well: the same filter sits on librdkafka's logger and on Python's
last-resort handler, and `retrylib.kafka.clients` registers each client's secret options.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any

from retrylib.config.secrets import MASK
from retrylib.errors import RetrylibError

_QUIET = ("py4j", "pyspark", "urllib3")
_PY4J_CALLBACKS = "py4j.clientserver"
KAFKA_CLIENT_LOGGER = "retrylib.kafka.librdkafka"
"""Where the command-line tools send librdkafka's own log lines (quiet unless DEBUG)."""
_ANYWHERE = 6

# Spark's JVM logging when this process launches the JVM itself: warnings only, without the
# start-up chatter (hostname, native libraries, UI port, AQE-in-streaming notices, a plan's
# text truncated); without the stack trace of a failed query (the job reports that failure
# itself, in one message); without a batch "falling behind" the trigger (each batch's line
# has its duration), nor what a stop's interrupt of the stream thread leaves behind (a job
# group already done, a chmod the local file system forks). RETRYLIB_LOG_LEVEL=DEBUG
# leaves the JVM's logging as Spark sets it.
_LOG4J2_PROPERTIES = """\
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = stderr
appender.stderr.type = Console
appender.stderr.name = stderr
appender.stderr.target = SYSTEM_ERR
appender.stderr.layout.type = PatternLayout
appender.stderr.layout.pattern = %d{yyyy-MM-dd HH:mm:ss,SSS} %p %c: %m%n%ex
logger.utils.name = org.apache.spark.util.Utils
logger.utils.level = error
logger.native.name = org.apache.hadoop.util.NativeCodeLoader
logger.native.level = error
logger.stream.name = org.apache.spark.sql.catalyst.analysis.ResolveWriteToStream
logger.stream.level = error
logger.stream4.name = org.apache.spark.sql.execution.streaming.runtime.ResolveWriteToStream
logger.stream4.level = error
logger.jetty.name = org.sparkproject.jetty
logger.jetty.level = error
logger.query.name = org.apache.spark.sql.execution.streaming.MicroBatchExecution
logger.query.level = off
logger.query4.name = org.apache.spark.sql.execution.streaming.runtime.MicroBatchExecution
logger.query4.level = off
logger.behind.name = org.apache.spark.sql.execution.streaming.ProcessingTimeExecutor
logger.behind.level = error
logger.behind4.name = org.apache.spark.sql.execution.streaming.runtime.ProcessingTimeExecutor
logger.behind4.level = error
logger.plan.name = org.apache.spark.util.SparkStringUtils
logger.plan.level = error
logger.dag.name = org.apache.spark.scheduler.DAGScheduler
logger.dag.level = warn
logger.dag.filter.stop.type = RegexFilter
logger.dag.filter.stop.regex = Failed to cancel job group .*
logger.dag.filter.stop.onMatch = DENY
logger.dag.filter.stop.onMismatch = NEUTRAL
logger.shell.name = org.apache.hadoop.util.Shell
logger.shell.level = warn
logger.shell.filter.stop.type = RegexFilter
logger.shell.filter.stop.regex = Interrupted while joining on: .*
logger.shell.filter.stop.onMatch = DENY
logger.shell.filter.stop.onMismatch = NEUTRAL
"""


class RedactingFilter(logging.Filter):
    """Replaces known secret values in a record's message and traceback with "***".

    Attached to the handlers `configure_logging` installs, so it sees every record that
    reaches them, whichever logger made it. The record's arguments are merged into its
    message first, so a secret passed as `%s` argument is caught too. A value of at least
    `_ANYWHERE` characters is masked wherever it occurs; a shorter one only where it stands
    alone (not inside a longer word), so that a short value does not garble every line.
    """

    def __init__(self) -> None:
        super().__init__()
        self._secrets: set[str] = set()
        self._pattern: re.Pattern[str] | None = None

    def add(self, values: Iterable[str]) -> None:
        """Add secret values; longer ones are matched first so none is left half-masked."""
        new = {v for v in values if v} - self._secrets
        if new:
            self._secrets |= new
            alternatives = [
                re.escape(s) if len(s) >= _ANYWHERE else rf"(?<!\w){re.escape(s)}(?!\w)"
                for s in sorted(self._secrets, key=len, reverse=True)
            ]
            self._pattern = re.compile("|".join(alternatives))

    def redact(self, text: str) -> str:
        return text if self._pattern is None else self._pattern.sub(MASK, text)

    def filter(self, record: logging.LogRecord) -> bool:
        if self._pattern is None:
            return True
        record.msg = self.redact(record.getMessage())
        record.args = None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self.redact(record.exc_text)
        if record.stack_info:
            record.stack_info = self.redact(record.stack_info)
        return True


class _FencingReportedElsewhere(logging.Filter):
    """Moves librdkafka's lines about a transactional producer fenced by a newer one (it
    logs them as ERROR and CRITICAL) to DEBUG. Fencing is how an earlier attempt of a produce
    unit ends when a task is retried or a worker lost, and whoever holds the producer says
    what it means in its own line: the unit producer logs that it took over again, and a
    fencing nobody expected ends in a `ProduceError` naming the transactional id."""

    _MARKS = ("fenced by a newer instance", "with an old epoch", "PRODUCER_FENCED")

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno > logging.DEBUG and any(m in record.getMessage() for m in self._MARKS):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
        return True


class OnceAMinute(logging.Filter):
    """Lets through at most one line of a kind (its first argument, such as librdkafka's
    facility FAIL or a partition, at one level) a minute, saying how many like it it held
    back since. Every Kafka client of
    a process logs each failed reconnect while a broker is away: 674 ERROR lines, 20 a
    second, in a 33 s outage, measured here. The job says in lines of its own when the
    brokers stop answering and when they answer again (`retrylib.kafka.runner_lease`).
    With DEBUG on, every line passes."""

    def __init__(self, every_s: float = 60.0, clock: Callable[[], float] = time.monotonic):
        super().__init__()
        self._every_s = every_s
        self._clock = clock
        self._lock = threading.Lock()
        self._kinds: dict[tuple[int, str], tuple[float, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if logging.getLogger(record.name).isEnabledFor(logging.DEBUG):
            return True
        args = record.args if isinstance(record.args, tuple) else ()
        kind = (record.levelno, str(args[0]) if args else str(record.msg))
        now = self._clock()
        with self._lock:
            shown_at, held = self._kinds.get(kind, (None, 0))
            if shown_at is not None and now - shown_at < self._every_s:
                self._kinds[kind] = (shown_at, held + 1)
                return False
            self._kinds[kind] = (now, 0)
        if held:
            record.msg = f"{record.getMessage()} ({held} more like it held back since the last)"
            record.args = None
        return True


_REDACTOR = RedactingFilter()
# A process that has not called `configure_logging` (a worker before its first task, a
# user's own) masks librdkafka's lines, and any other line that falls through to Python's
# last-resort handler (stderr), too.
logging.getLogger(KAFKA_CLIENT_LOGGER).addFilter(_FencingReportedElsewhere())
logging.getLogger(KAFKA_CLIENT_LOGGER).addFilter(OnceAMinute())
logging.getLogger(KAFKA_CLIENT_LOGGER).addFilter(_REDACTOR)
if logging.lastResort is not None:
    logging.lastResort.addFilter(_REDACTOR)


class _ReportedElsewhere(logging.Filter):
    """Drops py4j's log of an exception raised in Python code that Spark called (the
    `foreachBatch` body) when it is a `RetrylibError`: the job reports that one itself, in
    one line, and py4j's copy would add a traceback to it."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return not isinstance(error, RetrylibError)


# The logger of the per-batch metrics lines (`batch.metrics`), named in the docs and read by
# log pipelines: it keeps this name wherever the module that logs them lives.
METRICS_LOGGER = "retrylib.metrics"


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (UTC, ISO 8601), level, logger, message, and the
    traceback when there is one. A `retrylib.metrics` line's message is JSON itself; it is
    kept as an object under "metrics".
    """

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.name == METRICS_LOGGER:
            try:
                line["metrics"] = json.loads(line.pop("message"))
            except ValueError:
                line["message"] = record.getMessage()
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            line["exception"] = record.exc_text
        return json.dumps(line, default=str)


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever `sys.stderr` is when a line is logged, not when it was set up: a
    caller that swaps stderr (a test's capture, a notebook) and closes its own later must
    not leave the handler writing to a closed stream. `setStream` pins another stream."""

    def __init__(self) -> None:
        logging.Handler.__init__(self)
        self._pinned = None

    @property
    def stream(self):
        return self._pinned if self._pinned is not None else sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        self._pinned = value


def configure_logging(level: str | None = None, fmt: str | None = None) -> None:
    """Log to stderr; RETRYLIB_LOG_LEVEL overrides `level` (INFO), RETRYLIB_LOG_FORMAT
    overrides `fmt` ("text" or "json").

    Secrets added with `redact_secrets` before or after this call are masked.
    """
    chosen = (os.environ.get("RETRYLIB_LOG_LEVEL") or level or "INFO").upper()
    style = (os.environ.get("RETRYLIB_LOG_FORMAT") or fmt or "text").lower()
    handler = _StderrHandler()
    if style == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(_REDACTOR)
    logging.basicConfig(level=logging.WARNING, handlers=[handler], force=True)
    logging.getLogger("retrylib").setLevel(chosen)
    debug = logging.getLogger("retrylib").isEnabledFor(logging.DEBUG)
    logging.getLogger(KAFKA_CLIENT_LOGGER).setLevel(logging.DEBUG if debug else logging.CRITICAL)
    for name in _QUIET:
        logging.getLogger(name).setLevel(logging.WARNING)
    callbacks = logging.getLogger(_PY4J_CALLBACKS)
    for existing in [f for f in callbacks.filters if isinstance(f, _ReportedElsewhere)]:
        callbacks.removeFilter(existing)
    if not debug:
        callbacks.addFilter(_ReportedElsewhere())


_worker_logging = False


def configure_worker_logging() -> None:
    """`configure_logging` in a Spark Python worker, once per process: unconfigured, a
    worker drops its INFO lines and prints the rest with no time, level or logger. A
    process with a logging setup of its own (a test run routing in-process) is left alone.
    """
    global _worker_logging
    if _worker_logging:
        return
    _worker_logging = True
    if logging.getLogger().handlers:
        return
    configure_logging()
    # The tasks' own Kafka clients warn of what concerns their reads (a configuration
    # warning, a broker away): unlike the driver's, their warnings are shown.
    kafka = logging.getLogger(KAFKA_CLIENT_LOGGER)
    kafka.setLevel(min(kafka.level, logging.WARNING))


def redact_secrets(values: Iterable[str]) -> None:
    """Mask `values` in every log line from now on, and in `redact`."""
    _REDACTOR.add(values)


def redact(text: str) -> str:
    """`text` with every secret registered by `redact_secrets` replaced by "***"."""
    return _REDACTOR.redact(text)


def spark_log_conf() -> dict[str, str]:
    """Spark settings that keep the JVM's start-up chatter out of the terminal.

    Empty when the JVM already runs (spark-submit, a notebook, an existing session), when
    the user chose their own driver Java options, or at DEBUG level: the settings only take
    effect when this process launches the JVM.
    """
    from pyspark import SparkContext

    if (
        SparkContext._active_spark_context is not None
        or os.environ.get("PYSPARK_GATEWAY_PORT")
        or "extraJavaOptions" in os.environ.get("PYSPARK_SUBMIT_ARGS", "")
        or logging.getLogger("retrylib").isEnabledFor(logging.DEBUG)
    ):
        return {}
    digest = hashlib.sha256(_LOG4J2_PROPERTIES.encode()).hexdigest()[:12]
    path = os.path.join(tempfile.gettempdir(), f"retrylib-log4j2-{digest}.properties")
    if not os.path.exists(path):
        temporary = f"{path}.{os.getpid()}"
        with open(temporary, "w", encoding="utf-8") as f:
            f.write(_LOG4J2_PROPERTIES)
        os.replace(temporary, path)
    return {"spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{path}"}
