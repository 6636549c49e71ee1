"""The job ledger: models, state machine, scheduler, reconciler, executors, API and tasks."""
