"""A stand-in for ``compute-sanitizer`` where there is none (host tests): ``python tests/fake_sanitizer.py [OPTIONS]
APP [ARGS]``.

It runs the application with its stdout and stderr on one pipe and passes every line through, as the real tool
leaves the application's output on the stdout it prints to. A line ``KC-FAKE-REPORT TOOL N`` from the application
stands for N errors that TOOL finds at that point: under that tool it prints N reports in the tool's format in their
place (under another tool, nothing). At the end it prints the tool's summary line and exits as the tool does: the
application's status, else ``--error-exitcode`` where it found errors. Each run appends its tool and workloads to the
file named by ``KC_FAKE_SANITIZER_LOG``, where that is set (so a test can count the processes), and its tool and
``CUDA_VISIBLE_DEVICES`` to ``KC_FAKE_SANITIZER_DEVICES`` (which GPU the run gave it).
"""

from __future__ import annotations

import os
import subprocess
import sys

_REPORT = {
    "memcheck": [
        "Invalid __global__ write of size 4 bytes",
        "    at kc_planted_oob+0x70",
        "    by thread (0,0,0) in block (1,0,0)",
        "    Address 0x7f0000000400 is out of bounds",
        "    Saved host backtrace up to driver entry point at kernel launch time",
    ],
    "racecheck": [
        "Error: Race reported between Write access at kc_planted_race+0x30",
        "    and Read access at kc_planted_race+0x50 [4 hazards]",
    ],
}


def main(argv: list[str]) -> int:
    """Run the application under the stand-in tool; the tool's exit status."""
    tool, error_exit, i = "memcheck", 0, 0
    while i < len(argv) and argv[i].startswith("--"):
        opt, val = argv[i], argv[i + 1]
        tool = val if opt == "--tool" else tool
        error_exit = int(val) if opt == "--error-exitcode" else error_exit
        i += 2
    app = argv[i:]
    if os.environ.get("KC_FAKE_SANITIZER_LOG"):
        with open(os.environ["KC_FAKE_SANITIZER_LOG"], "a", encoding="utf-8") as log:
            log.write(f"{tool} {' '.join(a for n, a in enumerate(app) if n and app[n - 1] == '--run')}\n")
    if os.environ.get("KC_FAKE_SANITIZER_DEVICES"):  # which GPU the run gave this process
        with open(os.environ["KC_FAKE_SANITIZER_DEVICES"], "a", encoding="utf-8") as log:
            log.write(f"{tool} {os.environ.get('CUDA_VISIBLE_DEVICES', '-')}\n")
    print("========= COMPUTE-SANITIZER", flush=True)
    proc = subprocess.Popen(app, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    errors = 0
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("KC-FAKE-REPORT "):
            _, which, n = line.split()
            for _ in range(int(n) if which == tool else 0):
                print("\n".join(f"========= {text}" for text in [*_REPORT[tool], ""]), flush=True)
                errors += 1
            continue
        sys.stdout.write(line)
        sys.stdout.flush()
    code = proc.wait()
    if code != 0:
        print("========= Target application returned an error")
    if tool == "racecheck":
        print(f"========= RACECHECK SUMMARY: {errors} hazards displayed ({errors} errors, 0 warnings)")
    else:
        print(f"========= ERROR SUMMARY: {errors} error{'' if errors == 1 else 's'}")
    sys.stdout.flush()
    if code != 0:
        return code if code > 0 else 128 - code
    return error_exit if errors else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
