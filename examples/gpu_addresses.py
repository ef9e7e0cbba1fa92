"""An example PySpark job: records, per task, the GPU addresses Spark gave it.

With fake GPUs (examples/fake-gpus.sh) nothing runs on a GPU, but Spark's
resource scheduling is real: each task sees exactly the addresses the worker
it runs on was given, which are exactly those flexq allocated.
Usage: gpu_addresses.py OUTPUT_JSON [TASKS [SECONDS_PER_TASK]]
"""
import json
import os
import sys
import time

from pyspark import TaskContext
from pyspark.sql import SparkSession

out = sys.argv[1]
tasks = int(sys.argv[2]) if len(sys.argv) > 2 else 8
busy = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
spark = SparkSession.builder.getOrCreate()
conf = spark.sparkContext.getConf()
print(
    "gpu_addresses: started; dynamic allocation "
    + conf.get("spark.dynamicAllocation.enabled", "false")
    + ", maxExecutors "
    + conf.get("spark.dynamicAllocation.maxExecutors", "unset"),
    flush=True,
)


def record(i):
    ctx = TaskContext.get()
    time.sleep(busy)
    return {
        "task": i,
        "gpus": ctx.resources()["gpu"].addresses,
        "node": os.environ.get("FLEXQ_NODE"),
        "executorIndex": os.environ.get("FLEXQ_EXECUTOR_INDEX"),
    }


rows = spark.sparkContext.parallelize(range(tasks), tasks).map(record).collect()
with open(out, "w") as f:
    json.dump(rows, f)
print(f"gpu_addresses: {len(rows)} tasks recorded in {out}", flush=True)
spark.stop()
