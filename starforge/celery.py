"""The Celery app: broker on Redis, beat schedule for the scheduler and reconciler ticks.

Each worker process freezes what it has loaded out of the garbage collector's reach when it
starts, as the web workers do (`starforge.wsgi`): a full collection walking Django, Celery and
the loops' modules took a worker 80 to 220 ms of a core under load on two cores, time the web
workers beside it then waited for.

The worker and beat lower their CPU priority as they start (SF_WORKER_NICE, `jobs.priority`):
where they share cores with web workers, their bursts wait for requests rather than the other
way round.

Each task ends (and starts) with its database connections handed back as a web request's are
(`close_old_connections`): to the connection pool, or closed if an error left one unusable.
Celery's own Django fixup would close the pool itself around every task (see
CELERY_DB_REUSE_MAX in the settings).
"""

import gc
import os

from celery import Celery, signals

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "starforge.settings")

app = Celery("starforge")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["jobs"])


@signals.task_prerun.connect
@signals.task_postrun.connect
def _hand_back_connections(sender=None, **_) -> None:
    if getattr(getattr(sender, "request", None), "is_eager", False):
        return  # run in the caller's process, perhaps inside its transaction: not ours
    from django.db import close_old_connections

    close_old_connections()


@signals.worker_process_init.connect
def _freeze_what_is_loaded(**_) -> None:
    gc.collect()
    gc.freeze()


@signals.worker_init.connect
@signals.beat_init.connect
def _yield_to_the_web(**_) -> None:
    from django.conf import settings

    from jobs.priority import yield_to_the_web

    yield_to_the_web(settings.SF_WORKER_NICE)
