"""Prefect tasks: one cached, retry-safe task per plan batch (or group), checkpoint, validation, export and held-out
evaluation tasks, and the options they share. Task arguments are run keys and indices, never models or tensors."""

if __name__ != "prefect_gliner2.tasks":  # the folder imported under a bare name (sys.path at a checkout)
    raise ImportError(f"import prefect_gliner2.tasks, not {__name__}: a second copy would split every class")
