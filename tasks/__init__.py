"""Prefect tasks: one cached, retry-safe task per plan batch (or group), checkpoint, validation, export and held-out
evaluation tasks, and the options they share. Task arguments are run keys and indices, never models or tensors."""
