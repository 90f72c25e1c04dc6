"""Prefect flows (training, scheduled retraining), the unit driver and run reporting, and the console script."""

if __name__ != "prefect_gliner2.flows":  # the folder imported under a bare name (sys.path at a checkout)
    raise ImportError(f"import prefect_gliner2.flows, not {__name__}: a second copy would split every class")
