"""An example PySpark job that runs for a while (for cancel, ttl and
preemption): `sleeps.py [SECONDS] [MARKER]`. With MARKER, a SIGTERM to the
driver writes `sigterm <unix time>` there before it exits (status 143)."""
import signal
import sys
import time

from pyspark.sql import SparkSession

seconds = int(sys.argv[1]) if len(sys.argv) > 1 else 600
if len(sys.argv) > 2:
    marker = sys.argv[2]

    def on_sigterm(signum, frame):
        with open(marker, "a") as f:
            f.write(f"sigterm {time.time():.3f}\n")
        sys.exit(143)

    signal.signal(signal.SIGTERM, on_sigterm)

spark = SparkSession.builder.getOrCreate()
print(f"sleeps: sleeping {seconds}s", flush=True)
spark.sparkContext.parallelize(range(2), 2).map(lambda i: time.sleep(seconds)).collect()
print("sleeps: done", flush=True)
