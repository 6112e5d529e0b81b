#!/usr/bin/env python3
"""A deliberately misbehaving job-router hook for the router emulator's tests.

Copied by the tests under the names translate/update/finalize/cleanup (the router passes no
arguments, so the file name tells the hook what it is). What it does on each call is read from
``$FAKE_HOOK_DIR/<name>.mode`` (or ``<name>.mode.<ProcId>`` for one job), so a test can change
the behaviour between polls. Standard library only.
"""

import os
import signal
import subprocess
import sys
import time

name = os.path.basename(sys.argv[0])
data = sys.stdin.read()
ad_text = data.split("\n------\n")[-1] if name != "finalize" else data.split("\n------\n")[1]
first = data.split("\n------\n")[0]


def attr(text, key):
    for line in text.splitlines():
        left, sep, right = line.partition(" = ")
        if sep and left == key:
            return right
    return None


proc = attr(first if name == "finalize" else ad_text, "ProcId") or "x"
base = os.environ["FAKE_HOOK_DIR"]
mode_file = os.path.join(base, f"{name}.mode.{proc}")
if not os.path.exists(mode_file):
    mode_file = os.path.join(base, f"{name}.mode")
try:
    with open(mode_file) as f:
        words = f.read().split()
except FileNotFoundError:
    words = []
mode = words[0] if words else "default"
arg = words[1] if len(words) > 1 else ""

out = sys.stdout.write


def echo(drop=()):
    for line in ad_text.splitlines():
        if line.strip() and line.partition(" = ")[0] not in drop and not line.startswith("Managed"):
            out(line + "\n")
    # What the ce-k8s translate hook marks a routed job with (docs/internals.md, "Routed jobs").
    out('Managed = "ScheddDone"\nManagedManager = "fake"\n')


if mode == "sleep":
    time.sleep(float(arg or 30))
    mode = "default"
if mode == "stderr":
    sys.stderr.write("a warning on stderr\n")
    mode = "default"

if name == "translate":
    if mode == "default":
        echo()
    elif mode == "empty":
        pass
    elif mode == "whitespace":
        out("\n   \n")
    elif mode == "exit":
        echo()
        sys.exit(int(arg or 1))
    elif mode == "badline":
        echo()
        out("this line has no equals sign\n")
    elif mode == "nouniverse":
        echo(drop=("JobUniverse",))
    elif mode == "signal":
        echo()
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    elif mode == "background":
        subprocess.Popen([sys.executable, "-c", f"import time; time.sleep(1.0); open({arg!r}, 'w').write('alive')"])
        echo()
elif name == "update":
    now = int(time.time())
    if mode in ("default", "empty"):
        pass
    elif mode == "running":
        out(f'JobStatus = 2\nJobCurrentStartDate = {now}\nK8sPodPhase = "Running"\n')
    elif mode == "complete":
        out(f"JobStatus = 4\nExitCode = {arg or 0}\nCompletionDate = {now}\nRemoteWallClockTime = 42.0\n"
            f'JobFinishedHookDone = {now}\nK8sPodPhase = "Succeeded"\n')
    elif mode == "hold":
        out('JobStatus = 5\nHoldReason = "pod failed"\nHoldReasonCode = 3\nHoldReasonSubCode = 42\n')
    elif mode == "badline":
        out("JobStatus = 2\n[ not an attribute ]\n")
    elif mode == "immutable":
        out('Owner = "mallory"\n')
    elif mode == "exit":
        out("JobStatus = 2\n")
        sys.exit(int(arg or 1))
    elif mode == "signal":
        out("JobStatus = 2\n")
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)
elif name == "finalize":
    if mode == "exit":
        sys.exit(int(arg or 1))
    elif mode == "badline":
        out("# a comment is a parse failure\n")
    elif mode == "attrs":
        out('FinalizedBy = "fake"\n')
elif name == "cleanup":
    if mode == "exit":
        sys.exit(int(arg or 1))
    elif mode == "signal":
        os.kill(os.getpid(), signal.SIGKILL)
sys.exit(0)
