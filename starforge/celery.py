"""The Celery app: broker on Redis, beat schedule for the scheduler and reconciler ticks."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "starforge.settings")

app = Celery("starforge")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["jobs"])
