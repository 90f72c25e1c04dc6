"""The Prefect-free machinery under the flows and tasks: the session worker (client and child process), the run
directory, the run-key lease, the live-run table, the unit schedule, model sources and the retry rule.

Nothing here imports prefect; torch loads only in the worker child process.
"""
