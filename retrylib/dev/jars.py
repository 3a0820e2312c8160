"""The JVM jars the job needs where no cluster provides them: resolved by Maven, cached.

Three sets, each resolved once into a folder of its own under the cache (`RETRYLIB_JARS`,
default `~/.cache/retrylib/jars`), keyed by its coordinates so that another pyspark version
gets a folder of its own:

- `spark`: Spark's Kafka connector at the installed pyspark's version and Delta Lake's
  jars built for that Spark, minus every artifact pyspark already ships (Spark's own
  versions win, as with `--packages`).
- `kafka`: Apache Kafka's broker (KRaft) with its dependencies and a log4j binding, for the
  embedded broker of the demo and the tests.
- `s3`: Hadoop's S3A file system (`hadoop-aws` at the Hadoop version of pyspark's own
  client) with the few modules of the AWS SDK it calls instead of the SDK's whole bundle,
  for a local Spark that keeps its state on `s3a://` (give them to a job with
  `RETRYLIB_SPARK_JARS`, `retrylib/spark/extra.py`). Not fetched unless asked for.

Maven resolves them with the user's own settings (`~/.m2/settings.xml`: mirrors, proxies);
nothing here names a repository. A folder whose `classpath.txt` lists files that all exist
is complete, so a second resolution downloads nothing. On Databricks and EMR the cluster
brings its own connector and Delta; nothing here runs there.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from retrylib.errors import JarsError

log = logging.getLogger(__name__)

DEFAULT_DELTA_VERSION = "4.4.0"
"""Delta Lake's jar version when the delta-spark Python package is not installed."""
KAFKA_VERSION = "4.1.1"
"""Apache Kafka version of the embedded broker (any KRaft broker serves the tests)."""
AWS_SDK_VERSION = "2.35.4"
"""The AWS SDK (v2) version hadoop-aws 3.5.0 builds with; Hadoop 3.4's S3A calls the same
modules."""
AWS_SDK_MODULES = ("s3", "s3-transfer-manager", "sts", "apache-client")
"""The SDK modules S3A calls, in place of the SDK's `bundle` (a 600 MB jar of every AWS
service) that hadoop-aws declares: the S3 clients, the transfer manager (S3A will not write
without it), the HTTP client its synchronous client is built on, and STS, which S3A's
assumed-role and web-identity credentials call (a run with keys needs no STS, 0.5 MB). With
their dependencies, less what pyspark ships: 37 jars, 13.4 MB."""
_VERSION_START = re.compile(r"\d+\.\d")
_HADOOP_CLIENT_API = re.compile(r"hadoop-client-api-(\d+\.\d+\.\d+)\.jar")
_LOG4J_SLF4J = "org.apache.logging.log4j:log4j-slf4j-impl:2.24.3"
DELTA_SQL_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}
"""Session settings Delta needs on a Spark that is not a Databricks runtime."""


def _pyspark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


def _line(version: str, what: str) -> tuple[int, int]:
    """`"4.0.1"` -> `(4, 0)`; raises `JarsError` naming `what` when it does not parse."""
    parts = version.split(".")
    if len(parts) < 2 or not parts[0].isdigit() or not parts[1].isdigit():
        raise JarsError(f"{what} version {version!r} is not <major>.<minor>[.<patch>]")
    return int(parts[0]), int(parts[1])


def delta_artifact(spark_version: str, delta_version: str) -> str:
    """Delta Lake's Maven artifact id built for Spark `spark_version` at `delta_version`.

    Delta 4.0.x is built for Spark 4.0 alone and published as `delta-spark_2.13`. From 4.1
    on Delta publishes one artifact per Spark line, `delta-spark_<major>.<minor>_2.13`
    (its plain `delta-spark_2.13` is then built for its newest Spark line, so it is never
    the one to pick). Raises `JarsError` for a Delta older than 4.0 (built for Spark 3) or
    Delta 4.0.x with a Spark other than 4.0, naming the delta-spark to install instead.
    """
    spark_line = _line(spark_version, "pyspark")
    delta_line = _line(delta_version, "delta-spark")
    if delta_line < (4, 0):
        raise JarsError(
            f"delta-spark {delta_version} is built for Spark 3; with pyspark {spark_version} "
            f"install delta-spark {_delta_for(spark_line)}"
        )
    if delta_line == (4, 0):
        if spark_line != (4, 0):
            raise JarsError(
                f"delta-spark {delta_version} runs on Spark 4.0 only; with pyspark "
                f"{spark_version} install delta-spark {_delta_for(spark_line)}"
            )
        return "delta-spark_2.13"
    return f"delta-spark_{spark_line[0]}.{spark_line[1]}_2.13"


def _delta_for(spark_line: tuple[int, int]) -> str:
    return "4.0.1" if spark_line == (4, 0) else DEFAULT_DELTA_VERSION


def spark_coordinates(spark_version: str, delta_version: str) -> list[str]:
    """Maven coordinates of Spark's Kafka connector at `spark_version` and of Delta Lake
    `delta_version` built for that Spark. Raises `JarsError` as `delta_artifact`."""
    return [
        f"org.apache.spark:spark-sql-kafka-0-10_2.13:{spark_version}",
        f"io.delta:{delta_artifact(spark_version, delta_version)}:{delta_version}",
    ]


def kafka_coordinates() -> list[str]:
    return [f"org.apache.kafka:kafka_2.13:{KAFKA_VERSION}", _LOG4J_SLF4J]


def s3_coordinates(hadoop_version: str) -> list[str]:
    """hadoop-aws at `hadoop_version` and the AWS SDK modules it calls (`AWS_SDK_MODULES`)."""
    sdk = [f"software.amazon.awssdk:{module}:{AWS_SDK_VERSION}" for module in AWS_SDK_MODULES]
    return [f"org.apache.hadoop:hadoop-aws:{hadoop_version}", *sdk]


def hadoop_version(jars: Sequence[Path]) -> str:
    """The version in the name of the `hadoop-client-api-<version>.jar` among `jars`.

    Raises `JarsError` when there is none."""
    for jar in jars:
        match = _HADOOP_CLIENT_API.fullmatch(jar.name)
        if match:
            return match.group(1)
    raise JarsError("pyspark ships no hadoop-client-api-<version>.jar: which Hadoop is it?")


def installed_delta_version() -> str:
    """The delta-spark Python package's version (its jars must match it), or the default."""
    from importlib import metadata

    try:
        return metadata.version("delta-spark")
    except metadata.PackageNotFoundError:
        return DEFAULT_DELTA_VERSION


def artifact_id(jar_name: str) -> str:
    """`kafka-clients-3.9.2.jar` -> `kafka-clients`: the name before the version, which is
    the first dash-separated part that starts "<digits>.<digit>" (`spark-sql-kafka-0-10`
    holds parts that start with digits too)."""
    stem = jar_name.removesuffix(".jar")
    parts = stem.split("-")
    for index, part in enumerate(parts):
        if index and _VERSION_START.match(part):
            return "-".join(parts[:index])
    return stem


def cache_root() -> Path:
    return Path(os.environ.get("RETRYLIB_JARS") or Path.home() / ".cache" / "retrylib" / "jars")


def pom(coordinates: Sequence[str], without: Sequence[str] = ()) -> str:
    """A pom whose dependencies are `coordinates` (group:artifact:version), each without the
    artifacts `without` (group:artifact) anywhere in its tree: Maven never downloads them."""
    exclusions = "".join(
        "<exclusion><groupId>{}</groupId><artifactId>{}</artifactId></exclusion>".format(
            *excluded.split(":")
        )
        for excluded in without
    )
    dependencies = "\n".join(
        "    <dependency><groupId>{}</groupId><artifactId>{}</artifactId>"
        "<version>{}</version>".format(*coordinate.split(":"))
        + (f"<exclusions>{exclusions}</exclusions>" if exclusions else "")
        + "</dependency>"
        for coordinate in coordinates
    )
    return f"""<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>retrylib.local</groupId>
  <artifactId>retrylib-jars</artifactId>
  <version>0</version>
  <packaging>pom</packaging>
  <dependencies>
{dependencies}
  </dependencies>
</project>
"""


def resolve(
    name: str,
    coordinates: Sequence[str],
    exclude: Sequence[str] = (),
    without: Sequence[str] = (),
) -> list[Path]:
    """The jars of `coordinates` and their runtime dependencies, minus artifact ids `exclude`
    (resolved, left out of the set: pyspark ships them) and minus `without` (group:artifact,
    never resolved: see `pom`).

    Resolved once by Maven into the cache; later calls read the cached list. Raises
    `JarsError` when Maven is missing or fails (its output's tail is in the message).
    """
    parts = [*coordinates, "--", *sorted(exclude)] + (["--", *without] if without else [])
    key = hashlib.sha256("\n".join(parts).encode()).hexdigest()
    folder = cache_root() / f"{name}-{key[:12]}"
    listing = folder / "classpath.txt"
    if listing.is_file():
        jars = [Path(line) for line in listing.read_text().splitlines() if line]
        if jars and all(jar.is_file() for jar in jars):
            return jars
    mvn = shutil.which("mvn")
    if mvn is None:
        raise JarsError(
            "Maven (mvn) is needed once to fetch Spark's Kafka connector, Delta Lake and the "
            "embedded Kafka broker: install Maven 3.8+ (e.g. apt install maven), or point "
            "RETRYLIB_JARS at a folder resolved on another machine"
        )
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pom.xml").write_text(pom(coordinates, without))
    target = folder / "jars"
    shutil.rmtree(target, ignore_errors=True)
    command = [
        mvn,
        "-q",
        "-B",
        "-f",
        str(folder / "pom.xml"),
        "dependency:copy-dependencies",
        "-DincludeScope=runtime",
        f"-DoutputDirectory={target}",
    ]
    if exclude:
        command.append("-DexcludeArtifactIds=" + ",".join(sorted(exclude)))
    log.info("resolving %s jars with Maven: %s", name, ", ".join(coordinates))
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise JarsError(
            f"Maven could not resolve {', '.join(coordinates)} (exit {done.returncode}): "
            f"{(done.stdout + done.stderr)[-3000:]}"
        )
    jars = sorted(target.glob("*.jar"))
    listing.write_text("".join(f"{jar}\n" for jar in jars))
    return jars


def pyspark_jars() -> list[Path]:
    """The jars the installed pyspark ships (its `jars` folder), sorted."""
    return sorted((_pyspark_home() / "jars").glob("*.jar"))


def spark_jars() -> list[Path]:
    """Spark's Kafka connector and Delta Lake for the installed pyspark, resolved once.

    Raises `JarsError` as `spark_coordinates` and `resolve`."""
    import pyspark

    shipped = {artifact_id(jar.name) for jar in pyspark_jars()}
    coordinates = spark_coordinates(pyspark.__version__, installed_delta_version())
    return resolve("spark", coordinates, sorted(shipped))


def kafka_jars() -> list[Path]:
    """Apache Kafka's broker and its dependencies, resolved once."""
    return resolve("kafka", kafka_coordinates())


def shipped_artifacts(shipped: Sequence[Path]) -> list[str]:
    """The artifact ids of pyspark's `shipped` jars, and of those whose classes one of them
    holds (`jcl-over-slf4j` holds commons-logging's), sorted: what a set for the installed
    pyspark leaves out."""
    return sorted({artifact_id(jar.name) for jar in shipped} | {"commons-logging"})


def s3_jars() -> list[Path]:
    """S3A for the installed pyspark's Hadoop, resolved once, without the SDK's bundle and
    without what pyspark ships. Raises `JarsError` as `hadoop_version` and `resolve`."""
    shipped = pyspark_jars()
    coordinates = s3_coordinates(hadoop_version(shipped))
    without = ["software.amazon.awssdk:bundle"]
    return resolve("s3", coordinates, shipped_artifacts(shipped), without=without)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m retrylib.dev.jars [spark|kafka|s3 ...] [--classpath]`: resolve, print the
    jars."""
    parser = argparse.ArgumentParser(prog="python -m retrylib.dev.jars", description=main.__doc__)
    parser.add_argument(
        "sets", nargs="*", metavar="spark|kafka|s3", help="default: spark and kafka"
    )
    parser.add_argument(
        "--classpath", action="store_true", help="print the jars comma-separated (for --jars)"
    )
    args = parser.parse_args(argv)
    finders = {"spark": spark_jars, "kafka": kafka_jars, "s3": s3_jars}
    args.sets = args.sets or ["spark", "kafka"]
    unknown = sorted(set(args.sets) - set(finders))
    if unknown:
        parser.error(f"unknown jar set(s) {unknown}: choose from {list(finders)}")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        resolved = {name: finders[name]() for name in args.sets}
    except JarsError as error:
        print(f"retrylib: {error}", file=sys.stderr)
        return 1
    if args.classpath:
        print(",".join(str(jar) for jars in resolved.values() for jar in jars))
    else:
        for name, jars in resolved.items():
            print(f"{name}: {len(jars)} jars")
    return 0


if __name__ == "__main__":
    sys.exit(main())
