"""An example PySpark job that runs for a while (for cancel and ttl)."""
import sys
import time

from pyspark.sql import SparkSession

spark = SparkSession.builder.getOrCreate()
seconds = int(sys.argv[1]) if len(sys.argv) > 1 else 600
print(f"sleeps: sleeping {seconds}s", flush=True)
spark.sparkContext.parallelize(range(2), 2).map(lambda i: time.sleep(seconds)).collect()
print("sleeps: done", flush=True)
