"""The Prefect-free machinery under the flows and tasks: a run's lifecycle (prepare, open, finish), the session
worker (client, child process and the typed protocol between them), the run directory, the run-key lease, the
live-run table, the unit schedule, model sources, the retry rule and test fault plans.

Nothing here imports prefect; torch loads only in the worker child process.
"""

if __name__ != "prefect_gliner2.runtime":  # the folder imported under a bare name (sys.path at a checkout)
    raise ImportError(f"import prefect_gliner2.runtime, not {__name__}: a second copy would split every class")
