"""An example PySpark job that fails: the batch ends FAILED with the
exception in its stateMessage."""
from pyspark.sql import SparkSession

spark = SparkSession.builder.getOrCreate()
print("fails: about to raise", flush=True)
raise ValueError("bad row 17 in the input")
