"""Prefect flows (training, scheduled retraining), the unit driver and run reporting, and the console script."""
