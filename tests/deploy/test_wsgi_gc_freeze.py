"""A web worker freezes what loading the application made, so a full garbage collection under
load walks only what requests left behind (`starforge.wsgi`)."""

import json
import os
import subprocess
import sys

from django.conf import settings

PROBE = """
import gc, json
import starforge.wsgi
print(json.dumps({"frozen": gc.get_freeze_count(), "tracked": len(gc.get_objects())}))
"""


def test_loading_the_wsgi_application_freezes_its_objects():
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=settings.BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    counts = json.loads(done.stdout.strip().splitlines()[-1])
    # The application, its views and the API's schemas: well over 50,000 objects, all frozen.
    assert counts["frozen"] > 50_000
    assert counts["tracked"] < 1_000
