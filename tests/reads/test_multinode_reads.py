"""Reading a multi-node job: its JobOut fields, the logs API's rank filter (with cursors that
still move past the other ranks' lines), the pushed lines' ranks, and the console's job page
(nodes × GPUs, what each node asked for, each rank's node, state and exit code, the Logs tab's
rank filter and the System tab's group per rank)."""

import json

import pytest
from asgiref.sync import async_to_sync
from django.test import Client

from jobs import broadcast
from jobs.models import Job
from jobs.stores import logstore
from tests.api_helpers import assert_refused
from tests.factories import queued_job, with_attempt

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("storage")]  # on each store
T0 = 1_700_000_000.0
RANKS = [
    {"rank": 0, "node": "gpu-a1", "state": "killed", "exit_code": -15},
    {"rank": 1, "node": "gpu-b12", "state": "failed", "exit_code": 7},
]


def ranked(first: int, ranks: list[int | None], text: str = "rank {rank} line {seq}") -> list:
    """Stored lines from seq `first`, one per entry of `ranks` (None: a line of no rank)."""
    lines = []
    for seq, rank in enumerate(ranks, start=first):
        line = {
            "seq": seq,
            "stream": "stdout",
            "ts": T0 + seq,
            "text": text.format(seq=seq, rank=rank),
        }
        if rank is not None:
            line["rank"] = rank
        lines.append(line)
    return lines


@pytest.fixture
def gang(team, alice) -> Job:
    """A FAILED two-node job (4 a100 per node, 16 CPUs, 64 GiB), both ranks reported."""
    job = queued_job(
        team,
        alice,
        total_gpus=8,
        nodes=2,
        gpu_type="a100",
        cpus=16,
        memory_mb=64 * 1024,
        image="ghcr.io/acme/train:1",
        name="gang-run",
    )
    with_attempt(job, "FAILED", job_ref="ref-1", nodes=2, ranks=RANKS, exit_code=7)
    return Job.objects.get(pk=job.pk)


def logs(api, job: Job, **params) -> dict:
    response = api.get(f"/jobs/{job.pk}/logs", **params)
    assert response.status_code == 200, response.content
    return response.json()


def seqs(body: dict) -> list[tuple[int, int | None]]:
    return [(line["seq"], line.get("rank")) for line in body["lines"]]


def end_cursor(job: Job) -> str:
    return logstore.read(job.pk, None, 10_000).cursor


# -- JobOut ----------------------------------------------------------------------------------


def test_job_out_has_nodes_gpus_per_node_resources_and_the_ranks(api, gang):
    body = api.get(f"/jobs/{gang.pk}").json()
    assert (body["gpus"], body["nodes"], body["gpus_per_node"], body["gpu_type"]) == (
        8,
        2,
        4,
        "a100",
    )
    assert (body["cpus"], body["memory_mb"], body["image"]) == (16, 65536, "ghcr.io/acme/train:1")
    assert body["ranks"] == RANKS
    [attempt] = api.get(f"/jobs/{gang.pk}/attempts").json()
    assert (attempt["nodes"], attempt["ranks"]) == (2, RANKS)


# -- the logs API's rank filter --------------------------------------------------------------


def test_rank_filter_returns_that_ranks_lines_and_the_lines_of_no_rank(api, gang):
    logstore.append(gang.pk, 1, ranked(0, [0, 1, 1, None, 0, 1]))
    assert seqs(logs(api, gang)) == [(0, 0), (1, 1), (2, 1), (3, None), (4, 0), (5, 1)]
    assert seqs(logs(api, gang, rank=1)) == [(1, 1), (2, 1), (3, None), (5, 1)]
    zero = logs(api, gang, rank=0)
    assert seqs(zero) == [(0, 0), (3, None), (4, 0)]
    assert zero["cursor"] == end_cursor(gang)  # scanned past rank 1's last line too
    assert zero["done"] is True


def test_a_rank_filter_pages_by_cursor_over_every_attempt(api, gang):
    logstore.append(gang.pk, 1, ranked(0, [1, 0, 0, 0, 1, 0]))
    logstore.append(gang.pk, 2, ranked(0, [0, 1, 0, 1]))
    pages, cursor = [], None
    while True:
        body = logs(api, gang, rank=1, limit=2, **({"cursor": cursor} if cursor else {}))
        pages.append([(line["attempt"], line["seq"]) for line in body["lines"]])
        cursor = body["cursor"]
        if len(body["lines"]) < 2:
            break
    assert pages == [[(1, 0), (1, 4)], [(2, 1), (2, 3)], []]
    assert cursor == end_cursor(gang)


def test_a_full_page_ends_its_cursor_just_after_its_last_line(api, gang):
    logstore.append(gang.pk, 1, ranked(0, [1, 0, 1, 0, 0]))
    first = logs(api, gang, rank=1, limit=1)
    assert seqs(first) == [(0, 1)]
    # The cursor is where the scan stopped: the unfiltered read from it starts at seq 1.
    assert seqs(logs(api, gang, cursor=first["cursor"]))[0] == (1, 0)
    second = logs(api, gang, rank=1, limit=1, cursor=first["cursor"])
    assert seqs(second) == [(2, 1)]
    assert seqs(logs(api, gang, cursor=second["cursor"])) == [(3, 0), (4, 0)]


def test_tail_of_one_rank_is_its_last_lines_and_the_cursor_is_the_end(api, gang):
    logstore.append(gang.pk, 1, ranked(0, [0, 1, 0]))
    logstore.append(gang.pk, 2, ranked(0, [1, 0, 0, 0]))
    body = logs(api, gang, rank=1, tail=2)
    assert [(line["attempt"], line["seq"]) for line in body["lines"]] == [(1, 1), (2, 0)]
    assert body["cursor"] == end_cursor(gang)
    assert seqs(logs(api, gang, rank=0, tail=2)) == [(2, 0), (3, 0)]  # (seq, rank)


def test_a_line_whose_text_looks_like_a_rank_field_stays_with_its_own_rank(api, gang):
    logstore.append(gang.pk, 1, ranked(0, [0], text='x,"rank":1,"stream":"stdout" {seq}'))
    assert logs(api, gang, rank=1)["lines"] == []
    assert logs(api, gang, rank=0)["lines"][0]["text"] == 'x,"rank":1,"stream":"stdout" 0'


def test_follow_with_a_rank_waits_past_the_other_ranks_lines(api, gang):
    Job.objects.filter(pk=gang.pk).update(status="RUNNING")
    logstore.append(gang.pk, 1, ranked(0, [0, 1]))
    body = logs(api, gang, rank=1, tail=10)
    logstore.append(gang.pk, 1, ranked(2, [0, 0]))  # only rank 0 wrote since
    waited = logs(api, gang, rank=1, cursor=body["cursor"], follow="true", wait=0.3)
    assert (waited["lines"], waited["done"]) == ([], False)
    assert waited["cursor"] == end_cursor(gang)


@pytest.mark.parametrize("rank", [2, 99])
def test_a_rank_the_job_does_not_have_is_400_with_a_sentence(api, gang, rank):
    response = api.get(f"/jobs/{gang.pk}/logs", rank=rank)
    assert_refused(response, 400, f"job {gang.pk} has no rank {rank}: its ranks are 0 to 1")


def test_a_single_node_job_is_its_rank_0(api, team, alice):
    job = queued_job(team, alice)
    with_attempt(job, "RUNNING", job_ref="ref")
    logstore.append(job.pk, 1, ranked(0, [None, None]))
    assert seqs(logs(api, job, rank=0)) == [(0, None), (1, None)]
    response = api.get(f"/jobs/{job.pk}/logs", rank=1)
    assert_refused(response, 400, f"job {job.pk} has no rank 1: its only rank is 0")
    assert api.get(f"/jobs/{job.pk}/logs", rank=-1).status_code == 422


def test_the_raw_lines_carry_their_rank_right_after_seq(api, gang):
    logstore.append(gang.pk, 1, ranked(0, [1]))
    [raw] = logstore.read(gang.pk, None, 10, rank=1).raw_lines
    assert raw.startswith(b'{"attempt":1,"seq":0,"rank":1,"stream":"stdout",')


def test_the_download_marks_each_line_with_its_rank(api, gang):
    logstore.append(gang.pk, 1, ranked(0, [1, None, 0]))
    response = api.get(f"/jobs/{gang.pk}/logs/download")
    text = b"".join(async_to_sync(collect)(response)).decode()
    assert (
        text
        == "==> attempt 1 <==\n[rank 1] rank 1 line 0\nrank None line 1\n[rank 0] rank 0 line 2\n"
    )


async def collect(response) -> list[bytes]:
    return [chunk async for chunk in response.streaming_content]


# -- pushed lines ----------------------------------------------------------------------------


def test_pushed_lines_carry_their_rank_and_single_node_lines_none():
    message = broadcast.lines_message(1, ranked(4, [1, None]), "1:500")
    assert [line.get("rank") for line in message["lines"]] == [1, None]
    assert "rank" not in message["lines"][1]
    assert message["lines"][0] == {
        "seq": 4,
        "rank": 1,
        "stream": "stdout",
        "ts": T0 + 4,
        "text": "rank 1 line 4",
    }


@pytest.mark.django_db(transaction=True)
def test_the_job_socket_forwards_each_lines_rank(settings, team, alice):
    from channels.db import database_sync_to_async

    from tests.sockets import run, session_of, socket

    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    job = queued_job(team, alice, total_gpus=2, nodes=2)
    session = session_of(alice)

    async def scenario():
        page = socket(f"/ws/jobs/{job.pk}/", session)
        assert (await page.connect())[0]
        await database_sync_to_async(logstore.append)(job.pk, 1, ranked(0, [0, 1]))
        message = await page.receive_json_from(timeout=5)
        await page.disconnect()
        return message

    message = run(scenario)
    assert [(line["seq"], line["rank"]) for line in message["lines"]] == [(0, 0), (1, 1)]


# -- the console's job page ------------------------------------------------------------------


def page_of(job: Job) -> str:
    client = Client()
    client.force_login(job.user)
    response = client.get(f"/jobs/{job.pk}/")
    assert response.status_code == 200
    return response.content.decode()


def section(page: str, tab: str) -> str:
    start = page.index(f'id="{tab}"')
    return page[page.rindex("<section", 0, start) : page.index("</section>", start)]


def test_job_page_shows_nodes_gpus_resources_and_each_rank(gang):
    page = page_of(gang)
    assert '<span class="gpus">8 GPU(s) (2 nodes × 4 a100)</span>' in page
    assert (
        '<p class="resources">per node: CPUs <code>16</code> · memory <code>64 GiB</code> · '
        "image <code>ghcr.io/acme/train:1</code></p>"
    ) in page
    ranks = page[page.index('<table class="ranks">') : page.index("</table>")]
    rows = [row.split("</tr>")[0] for row in ranks.split("<tbody>")[1].split("<tr>")[1:]]
    assert rows == [
        '<td>0</td><td class="mono">gpu-a1</td><td>killed</td><td>-15</td>',
        '<td>1</td><td class="mono">gpu-b12</td><td>failed</td><td>7</td>',
    ]


def test_a_multi_node_job_whose_ranks_have_not_reported_says_so(team, alice):
    job = queued_job(team, alice, total_gpus=2, nodes=2)
    page = page_of(job)
    assert '<span class="gpus">2 GPU(s) (2 nodes × 1)</span>' in page
    assert "No rank of this attempt has reported yet." in page
    assert '<option value="1">rank 1</option>' in section(page, "tab-logs")


def test_logs_tab_has_a_rank_filter_for_a_multi_node_job(gang):
    tab = section(page_of(gang), "tab-logs")
    select = tab[tab.index('<select class="logs-rank"') : tab.index("</select>")]
    assert select.split(">", 1)[1].split("</option>")[:-1] == [
        '<option value="">all ranks',
        '<option value="0">rank 0 (gpu-a1)',
        '<option value="1">rank 1 (gpu-b12)',
    ]


def test_system_tab_has_a_group_per_rank_titled_with_its_node(gang):
    tab = section(page_of(gang), "tab-system")
    assert '<div class="charts"></div>' in tab  # the series of no rank, as for one node
    for rank, node in ((0, "gpu-a1"), (1, "gpu-b12")):
        assert (
            f'<div class="rank-group" data-prefix="rank{rank}/" hidden><h3>rank {rank} · '
            f'<span class="mono">{node}</span></h3><div class="charts"></div></div>'
        ) in tab


def test_a_single_node_job_page_has_no_ranks_filter_or_groups(team, alice):
    job = queued_job(team, alice, total_gpus=2, gpu_type="h100")
    with_attempt(job, "RUNNING", job_ref="ref")
    page = page_of(job)
    assert '<span class="gpus">2 GPU(s) (h100)</span>' in page
    for absent in ('class="ranks"', "logs-rank", "rank-group", 'class="resources"'):
        assert absent not in page


def test_system_series_of_each_rank_come_back_under_their_prefix(api, gang):
    from tests.ingesting import runner

    with_attempt(gang, "RUNNING", job_ref="ref-2", nodes=2)
    points = [
        {"kind": "system", "name": f"rank{r}/{name}", "step": 1, "value": 1.0 + r, "ts": T0}
        for r in (0, 1)
        for name in ("nvml_available", "cpu_percent")
    ]
    body = {"attempt": 2, "points": [{"seq": i, **p} for i, p in enumerate(points)]}
    answer = runner(gang.pk, 2).post(
        "/api/v1/ingest/metrics", json.dumps(body), content_type="application/json"
    )
    assert answer.status_code == 200, answer.content
    series = api.get(f"/jobs/{gang.pk}/metrics", kind="system").json()["series"]
    assert set(series) == {
        f"rank{r}/{n}" for r in (0, 1) for n in ("nvml_available", "cpu_percent")
    }
