"""``python -m prefect_gliner2.flows.cli``: the console script."""

from prefect_gliner2.flows.cli import console_main

console_main()
