#!/bin/sh
# A FAKE GPU discovery script, for machines without GPUs (the tour, tests).
# It prints two GPU addresses in Spark's resource format; no GPU is behind
# them. On a real GPU node leave gpu_discovery_script empty (nvidia-smi -L).
echo '{"name":"gpu","addresses":["0","1"]}'
