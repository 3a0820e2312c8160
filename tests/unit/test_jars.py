"""The Maven coordinates and the pom retrylib resolves its JVM jars with (no Maven run)."""

from __future__ import annotations

import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest
from hdfs_cluster import hdfs_coordinates

from retrylib.dev.jars import (
    AWS_SDK_VERSION,
    artifact_id,
    delta_artifact,
    hadoop_version,
    kafka_coordinates,
    pom,
    s3_coordinates,
    spark_coordinates,
)
from retrylib.errors import JarsError


@pytest.mark.parametrize(
    ("jar", "artifact"),
    [
        ("kafka-clients-3.9.2.jar", "kafka-clients"),
        ("delta-spark_4.2_2.13-4.4.0.jar", "delta-spark_4.2_2.13"),
        ("spark-sql-kafka-0-10_2.13-4.2.0.jar", "spark-sql-kafka-0-10_2.13"),
        ("zstd-jni-1.5.7-3.jar", "zstd-jni"),
        ("RoaringBitmap-1.6.10.jar", "RoaringBitmap"),
        ("jsr305-3.0.0.jar", "jsr305"),
    ],
)
def test_artifact_id_is_the_name_before_the_version(jar, artifact):
    assert artifact_id(jar) == artifact


@pytest.mark.parametrize(
    ("spark", "delta", "artifact"),
    [
        ("4.0.0", "4.0.1", "delta-spark_2.13"),
        ("4.0.2", "4.0.0", "delta-spark_2.13"),
        ("4.0.1", "4.4.0", "delta-spark_4.0_2.13"),
        ("4.1.1", "4.4.0", "delta-spark_4.1_2.13"),
        ("4.1.0", "4.1.0", "delta-spark_4.1_2.13"),
        ("4.2.0", "4.4.0", "delta-spark_4.2_2.13"),
    ],
)
def test_connector_matches_pyspark_and_delta_is_built_for_that_spark(spark, delta, artifact):
    connector, delta_jar = spark_coordinates(spark, delta)
    assert connector == f"org.apache.spark:spark-sql-kafka-0-10_2.13:{spark}"
    assert delta_jar == f"io.delta:{artifact}:{delta}"


@pytest.mark.parametrize(
    ("spark", "delta", "message"),
    [
        (
            "4.1.1",
            "4.0.1",
            r"delta-spark 4\.0\.1 runs on Spark 4\.0 only.*install delta-spark 4\.4\.0",
        ),
        (
            "4.2.0",
            "4.0.0",
            r"runs on Spark 4\.0 only; with pyspark 4\.2\.0 install delta-spark 4\.4\.0",
        ),
        ("4.0.0", "3.3.2", r"built for Spark 3; with pyspark 4\.0\.0 install delta-spark 4\.0\.1"),
        ("four", "4.4.0", r"pyspark version 'four'"),
    ],
)
def test_delta_that_cannot_run_on_the_spark_is_refused_naming_the_one_to_install(
    spark, delta, message
):
    with pytest.raises(JarsError, match=message):
        delta_artifact(spark, delta)


def test_pom_lists_each_coordinate_and_no_repository():
    text = pom(kafka_coordinates())
    root = ElementTree.fromstring(text)
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    found = [
        ":".join(d.find(f"m:{part}", ns).text for part in ("groupId", "artifactId", "version"))
        for d in root.iterfind("m:dependencies/m:dependency", ns)
    ]
    assert found == kafka_coordinates()
    assert "repositor" not in text and "http" not in text.replace(ns["m"], "")


def test_the_test_hdfs_is_the_hadoop_of_pyspark_s_own_client_jar():
    shipped = [Path("hadoop-client-runtime-3.5.0.jar"), Path("hadoop-client-api-3.5.0.jar")]
    version = hadoop_version(shipped)
    assert version == "3.5.0"
    assert hdfs_coordinates(version)[0] == "org.apache.hadoop:hadoop-client-minicluster:3.5.0"
    with pytest.raises(JarsError, match="no hadoop-client-api"):
        hadoop_version([Path("hadoop-client-runtime-3.5.0.jar")])


def test_s3a_is_hadoop_aws_at_pyspark_s_hadoop_with_sdk_modules_and_never_the_bundle():
    coordinates = s3_coordinates("3.4.1")
    assert coordinates[0] == "org.apache.hadoop:hadoop-aws:3.4.1"
    assert f"software.amazon.awssdk:s3:{AWS_SDK_VERSION}" in coordinates
    assert not [c for c in coordinates if ":bundle:" in c]
    root = ElementTree.fromstring(pom(coordinates, ["software.amazon.awssdk:bundle"]))
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    for dependency in root.iterfind("m:dependencies/m:dependency", ns):
        (exclusion,) = dependency.iterfind("m:exclusions/m:exclusion", ns)
        excluded = [exclusion.find(f"m:{part}", ns).text for part in ("groupId", "artifactId")]
        assert excluded == ["software.amazon.awssdk", "bundle"]
