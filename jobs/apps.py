from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "jobs"
    verbose_name = "Jobs"

    def ready(self) -> None:
        from jobs import audit_admin, audit_signals, pgtime, signals  # noqa: F401  (receivers)
        from starforge import checks  # noqa: F401  (registers the deploy checks)

        audit_signals.connect()  # the audit log's sign-in and admin doors (jobs.audit)
