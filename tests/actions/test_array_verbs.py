"""The verbs an array takes are named once (`jobs.actions.arrays.ARRAY_VERBS`, each job verb but
delete): the console's buttons and routes read them, and the API's path parameter, which the
schema needs spelled out, names the same."""

from typing import get_args

from jobs.actions.arrays import ARRAY_VERBS
from jobs.api import arrays as api_arrays
from jobs.states import VERBS


def test_an_array_takes_every_job_verb_but_delete():
    assert ARRAY_VERBS == ("stop", "pause", "resume", "retry")
    assert set(ARRAY_VERBS) == set(VERBS) - {"delete"}


def test_the_api_takes_the_verbs_an_array_takes():
    assert get_args(api_arrays.Verb) == ARRAY_VERBS
