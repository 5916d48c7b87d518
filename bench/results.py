"""What the bench scripts share: a row run in a child process (its end, and the row a failed one gives), and
the results' JSON file and markdown table."""
import datetime
import json
import os
import sys


def end_row_child():
    """End a row's child process once its result is written: flush, then skip interpreter teardown (NCCL/gloo
    threads can hang or abort there)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def failed_row(base, run, tail):
    """The row of a child process that wrote none: its last `tail` lines of output go to stderr, and the cause
    named is the out-of-memory line, else the last line naming an Error (not the launcher's summary after it)."""
    output = (run.stdout + run.stderr).strip().splitlines()
    print("\n".join(output[-tail:]), file=sys.stderr)
    cause = next((line for line in output if "OutOfMemoryError" in line), None) or \
        next((line for line in reversed(output) if "Error" in line), output[-1] if output else "")
    return dict(base, status="oom" if "OutOfMemoryError" in cause else "error",
                error=f"exit {run.returncode}: {cause.strip()}"[:300])


def run_meta(script, **fields):
    """A results file's meta: today's date, `fields`, and the command line that made it."""
    return dict(date=datetime.date.today().isoformat(), **fields,
                command=" ".join(["python", script, *sys.argv[1:]]))


def write_results(path, **document):
    """The results JSON (meta=..., rows=..., ...) at `path`, its folder made if needed."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(document, f, indent=2)


def print_table_header(*columns):
    """A markdown table's header line and separator."""
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
