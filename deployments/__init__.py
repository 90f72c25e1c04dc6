"""Deployments: ``prefect.yaml`` (work-pool deployments) and ``serve.py`` (serve the same deployments in-process)."""

if __name__ != "prefect_gliner2.deployments":  # the folder imported under a bare name (sys.path at a checkout)
    raise ImportError(f"import prefect_gliner2.deployments, not {__name__}: a second copy would split every class")
