"""A tiny GigaTrain client project: what a GigaTrain 1.1 user writes, and nothing else.

It imports only `giga_train`'s public names (and `giga_datasets`' `register_dataset` when that
package is installed), so the same files run under the real GigaTrain 1.1.0 (the reference venv)
and under ours. tests/reference/record.py runs it and writes what it saw as JSON.
"""
