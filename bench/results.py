"""What the bench scripts share: ending the child process that ran one row, and the results' JSON file and
markdown table."""
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
