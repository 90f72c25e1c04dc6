"""Deployments: ``prefect.yaml`` (work-pool deployments) and ``serve.py`` (serve the same deployments in-process)."""
