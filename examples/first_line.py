"""The smallest PySpark job: one line of output, then a SparkSession that
stops at once. `flexq bench agent` times flexq's part of starting it."""
print("first_line: the driver is running", flush=True)
from pyspark.sql import SparkSession  # noqa: E402

SparkSession.builder.getOrCreate().stop()
