"""The jars and Spark settings a user adds to every Spark retrylib starts: the job under
`spark-submit.sh` and under `retrylib run`, and the session of `status`, `redrive` and
`check`. Both come from the environment, so that one place serves every entry point:

- `RETRYLIB_SPARK_JARS`: jars, comma-separated (paths or URLs, as `--jars` takes them),
  e.g. S3A's (`python -m retrylib.dev.jars s3 --classpath`);
- `RETRYLIB_SPARK_CONF`: Spark settings, `key=value` pairs separated by spaces or new
  lines, e.g. `spark.hadoop.fs.s3a.endpoint=http://127.0.0.1:9000
  spark.hadoop.fs.s3a.path.style.access=true`.

spark-submit.sh merges the jars with its own, and with a `--jars` in `RETRYLIB_SPARK_EXTRA`
(its free-form spark-submit flags), into one `--jars` (spark-submit keeps only the last of
several), and passes each setting as a `--conf` (`python -m retrylib.spark.extra`);
`retrylib.spark.session` applies them to the session it builds. A Spark Connect server
brings its own jars; the settings go to the session where the server lets a session set
them. Values hold no spaces (no S3A or Hadoop setting needs one); a setting with one goes in
`RETRYLIB_SPARK_EXTRA` as spark-submit's own `--conf`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

from retrylib.errors import ConfigError

JARS = "RETRYLIB_SPARK_JARS"
CONF = "RETRYLIB_SPARK_CONF"
SUBMIT_FLAGS = "RETRYLIB_SPARK_EXTRA"


def extra_jars(environ: Mapping[str, str] = os.environ) -> list[str]:
    """The jars `RETRYLIB_SPARK_JARS` names, in order, without empty entries."""
    return [jar.strip() for jar in environ.get(JARS, "").split(",") if jar.strip()]


def extra_conf(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The settings `RETRYLIB_SPARK_CONF` holds, in order.

    Raises `ConfigError` in one line naming the entry that is not `spark.<key>=<value>`."""
    settings: dict[str, str] = {}
    for entry in environ.get(CONF, "").split():
        key, equals, value = entry.partition("=")
        if not equals or not key.startswith("spark.") or not value:
            raise ConfigError(
                f"{CONF}: {entry!r} is not a Spark setting: write spark.<key>=<value> pairs "
                "separated by spaces (e.g. spark.hadoop.fs.s3a.path.style.access=true)"
            )
        settings[key] = value
    return settings


def split_submit_flags(environ: Mapping[str, str] = os.environ) -> tuple[list[str], list[str]]:
    """`RETRYLIB_SPARK_EXTRA`'s words (split at white space, as spark-submit.sh always has)
    without its `--jars` (`--jars X` or `--jars=X`), and the jars those named."""
    words, jars = environ.get(SUBMIT_FLAGS, "").split(), []
    rest: list[str] = []
    index = 0
    while index < len(words):
        word = words[index]
        if word == "--jars" and index + 1 < len(words):
            jars.append(words[index + 1])
            index += 2
            continue
        if word.startswith("--jars="):
            jars.append(word.removeprefix("--jars="))
        else:
            rest.append(word)
        index += 1
    return rest, [jar for value in jars for jar in value.split(",") if jar]


def submit_arguments(own_jars: str, environ: Mapping[str, str] = os.environ) -> list[str]:
    """spark-submit's arguments for `own_jars` (comma-separated, may be empty) and the
    user's extras: one `--jars` holding all of them (none when there are none), and a
    `--conf` per setting of `RETRYLIB_SPARK_CONF`.

    Raises `ConfigError` as `extra_conf`."""
    jars = [jar for jar in own_jars.split(",") if jar]
    for jar in [*split_submit_flags(environ)[1], *extra_jars(environ)]:
        if jar not in jars:
            jars.append(jar)
    arguments = ["--jars", ",".join(jars)] if jars else []
    for key, value in extra_conf(environ).items():
        arguments += ["--conf", f"{key}={value}"]
    return arguments


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m retrylib.spark.extra [OWN_JARS]`: print spark-submit's arguments for
    `OWN_JARS` and the user's jars and settings, one a line; with `--rest`, the words of
    `RETRYLIB_SPARK_EXTRA` other than its `--jars`, one a line (spark-submit.sh reads both).
    """
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        if args[:1] == ["--rest"]:
            arguments = split_submit_flags()[0]
        else:
            arguments = submit_arguments(args[0] if args else "")
    except ConfigError as error:
        print(f"retrylib: {error}", file=sys.stderr)
        return 2
    if arguments:
        print("\n".join(arguments))
    return 0


if __name__ == "__main__":
    sys.exit(main())
