"""Scheduler-neutral core: the job spec, its validation, and bash quoting."""
