from django.apps import AppConfig


class MeteringConfig(AppConfig):
    name = "metering"
    verbose_name = "Metering"
