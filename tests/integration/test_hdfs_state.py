"""The job's state on a real HDFS (the `hdfs` fixture) through the tests' Spark session: a Delta
table, and the checkpoint's JSON files at `hdfs://` URIs."""

from __future__ import annotations

from chispa import assert_df_equality

from retrylib.checkpoint import claim_json, read_json


def test_a_delta_table_at_an_hdfs_uri_reads_back_what_was_written(spark, hdfs):
    table = f"{hdfs}/some/table"
    schema = "key STRING, n INT"
    spark.createDataFrame([("a", 1), ("b", 2)], schema).write.format("delta").save(table)
    spark.createDataFrame([("c", 3)], schema).write.format("delta").mode("append").save(table)

    expected = spark.createDataFrame([("a", 1), ("b", 2), ("c", 3)], schema)
    assert_df_equality(spark.read.format("delta").load(table), expected, ignore_row_order=True)


def test_a_json_file_claimed_at_an_hdfs_uri_reads_back_and_stays_the_first_claim(spark, hdfs):
    uri = f"{hdfs}/checkpoint/retrylib/identity.json"
    assert read_json(spark, uri) is None

    assert claim_json(spark, uri, {"app_id": "first"}) == {"app_id": "first"}
    assert claim_json(spark, uri, {"app_id": "second"}) == {"app_id": "first"}
    assert read_json(spark, uri) == {"app_id": "first"}
