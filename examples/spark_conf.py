"""Prints the Spark configuration an executor of this batch was given
(cores, GPUs, GPUs per task, executors), one `key=value` a line, and
runs one task on every executor so that each has started."""
from pyspark.sql import SparkSession

spark = SparkSession.builder.getOrCreate()
conf = spark.sparkContext.getConf()
for key in [
    "spark.executor.instances",
    "spark.executor.cores",
    "spark.executor.resource.gpu.amount",
    "spark.task.resource.gpu.amount",
]:
    print(f"spark_conf: {key}={conf.get(key, 'unset')}", flush=True)
n = int(conf.get("spark.executor.instances", "1"))
spark.sparkContext.parallelize(range(n), n).map(lambda x: x).collect()
spark.stop()
