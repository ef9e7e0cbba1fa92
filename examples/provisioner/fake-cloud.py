#!/usr/bin/env python3
"""A FAKE cloud for flexq's provisioned pools (docs/rules.md#provisioned-capacity).

flexq runs a pool's `resume_program` with a JSON manifest on stdin (the
batch, the slots' node ids, the shape, registerBy) and its
`suspend_program` with the nodes to delete. This script is both, for
machines without a cloud: "resume" starts one `flexq agent` per slot on
this machine, with FAKE GPUs (no hardware behind them), its node id the
slot's; "suspend" stops them by the pid it kept. Use it for the tour and
the tests; a real provisioner creates and deletes machines instead.

    fake-cloud.py resume  --flexq BIN --server URL --state DIR [faults]
    fake-cloud.py suspend --state DIR

Faults, to try what flexq does when a cloud misbehaves:
    --fail K               the last K slots are not started; exit 1
    --boot-delay S         each agent starts S seconds later (a slow boot)
    --exit-after-register S  each agent is killed (SIGKILL: a crash, a preempted
                           machine) S seconds after it starts
    --hang                 start nothing, and never exit
    --garbage              print garbage instead of starting anything; exit 0
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import time


def fake_gpus(path, count):
    addresses = json.dumps([str(i) for i in range(count)])
    with open(path, "w") as f:
        f.write("#!/bin/sh\n# FAKE GPUs (no hardware), written by fake-cloud.py\n")
        f.write(f"echo '{{\"name\":\"gpu\",\"addresses\":{addresses}}}'\n")
    os.chmod(path, 0o755)


def say(line):
    """Prints a line for flexq's log; the leader that started this program
    may have died meanwhile (its pipe closed): the nodes are started all
    the same, and the next leader adopts them."""
    try:
        print(line, flush=True)
    except BrokenPipeError:
        pass


def start_agent(args, manifest, slot):
    home = os.path.join(args.state, slot)
    os.makedirs(home, exist_ok=True)
    shape = manifest["shape"]
    fake_gpus(os.path.join(home, "fake-gpus.sh"), shape["gpus"])
    config = os.path.join(home, "agent.toml")
    with open(config, "w") as f:
        f.write(
            f'server = "{args.server}"\nnode_id = "{slot}"\n'
            f'region = "{manifest["region"]}"\nzone = "{manifest["zone"]}"\n'
            f'pool = "{manifest["pool"]}"\ncores = {shape["cores"]}\n'
            f'memory_mb = {shape["memoryMb"]}\nlocal_ssd_gb = {shape["localSsdGb"]}\n'
            f'gpu_discovery_script = "{home}/fake-gpus.sh"\n'
            f'work_dir = "{home}/work"\n'
        )
    # The agent's lifetime, in a shell of its own: a slow boot sleeps first,
    # an agent that exits after registering is killed after a while (what
    # it started is left, as a crashed machine's would be, until suspend). Its
    # output goes to a file: flexq waits for this program's output to end.
    agent = f'exec "{args.flexq}" agent --config "{config}"'
    if args.exit_after_register is not None:
        agent = f'"{args.flexq}" agent --config "{config}" & sleep {args.exit_after_register}; kill -9 $!'
    if args.boot_delay:
        agent = f"sleep {args.boot_delay}; {agent}"
    log = open(os.path.join(home, "agent.log"), "ab")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEXQ_AGENT_")}
    proc = subprocess.Popen(
        ["sh", "-c", agent],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
        start_new_session=True,
        env=env,
    )
    with open(os.path.join(args.state, slot + ".pid"), "w") as f:
        f.write(str(proc.pid))
    say(f"started {slot}: pid {proc.pid}")


def resume(args):
    manifest = json.load(sys.stdin)
    os.makedirs(args.state, exist_ok=True)
    with open(os.path.join(args.state, "resumed.jsonl"), "a") as f:
        f.write(json.dumps(manifest) + "\n")
    if args.garbage:
        print("\x00\x01 {not json ]] ünïcode ✓ " * 20)
        return 0
    if args.hang:
        while True:
            time.sleep(3600)
    slots = manifest["slots"]
    failing = slots[len(slots) - args.fail:] if args.fail else []
    for slot in slots:
        if slot not in failing:
            start_agent(args, manifest, slot)
    if failing:
        print(f"stock-out: {', '.join(failing)} could not be created", file=sys.stderr)
        return 1
    return 0


def gone(pid):
    """Whether a process has ended (a zombie nobody reaped has)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def session_of(pid):
    """The processes of the session `pid` leads: the agent's shell, the
    agent, and the Spark processes it started in process groups of their
    own (what a machine's deletion would end)."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # After the command: state, ppid, pgrp, session.
        if int(fields[3]) == pid:
            members.append(int(entry))
    return members


def signal_session(pid, sig):
    for member in session_of(pid):
        try:
            os.kill(member, sig)
        except ProcessLookupError:
            pass


def suspend(args):
    manifest = json.load(sys.stdin)
    os.makedirs(args.state, exist_ok=True)
    with open(os.path.join(args.state, "suspended.jsonl"), "a") as f:
        f.write(json.dumps(manifest) + "\n")
    pids = {}
    for node in manifest["nodes"]:
        try:
            with open(os.path.join(args.state, node + ".pid")) as f:
                pids[node] = int(f.read())
        except (OSError, ValueError):
            print(f"{node}: never started here")
    # Each agent's whole session (its shell, the agent, its Spark, whose
    # processes have groups of their own): asked to stop, then killed
    # after 5 s.
    for pid in pids.values():
        signal_session(pid, signal.SIGTERM)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not all(
        all(gone(m) for m in session_of(p)) for p in pids.values()
    ):
        time.sleep(0.05)
    for node, pid in pids.items():
        signal_session(pid, signal.SIGKILL)
        os.remove(os.path.join(args.state, node + ".pid"))
        print(f"{node}: stopped")
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("command", choices=["resume", "suspend"])
    p.add_argument("--flexq", default="flexq")
    p.add_argument("--server", default="http://127.0.0.1:8080",
                   help="the flexq server agents register with; @FILE: read from FILE")
    p.add_argument("--state", required=True)
    p.add_argument("--fail", type=int, default=0)
    p.add_argument("--boot-delay", type=float, default=0)
    p.add_argument("--exit-after-register", type=float)
    p.add_argument("--hang", action="store_true")
    p.add_argument("--garbage", action="store_true")
    args = p.parse_args()
    if args.server.startswith("@"):
        with open(args.server[1:]) as f:
            args.server = f.read().strip()
    return resume(args) if args.command == "resume" else suspend(args)


if __name__ == "__main__":
    sys.exit(main())
