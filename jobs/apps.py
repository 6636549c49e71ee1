from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "jobs"
    verbose_name = "Jobs"

    def ready(self) -> None:
        from jobs import pgtime, signals  # noqa: F401  (connects the receivers)
        from starforge import checks  # noqa: F401  (registers the deploy checks)
