"""Notifications: who is told what about which jobs, and how it reaches them, laid out by layer.

A webhook (`jobs.models.Webhook`) belongs to its owner and covers either the owner's own jobs or,
set up by a team admin, every job of one team. It names the events it wants: a job SUCCEEDED,
FAILED or STOPPED, was preempted (PAUSED when its borrowed GPUs went back), or has waited QUEUED
longer than the webhook's `wait_after_s`. Only while its owner may know: an active user who
still admins the team (a team webhook) or is still in the job's team (their own jobs'), checked
when a delivery is written and again at every try, so someone removed or deactivated is told
nothing more, not even about their own jobs.

- `jobs.actions.webhooks`: adding, removing and testing a webhook (the verbs);
- `jobs.reads.webhooks`: the webhooks a user sees, and who may still be told (`may_tell`);
- `jobs.webhooks.targets`: where a target may point (SSRF), checked when added and at every try;
- `jobs.ledger.outbox`: deliveries written in the transaction of the change they tell, so a
  change that commits is never left untold and one that rolls back is never told;
- `jobs.loops.deliveries`: the delivery loop the Celery task runs: claims, tries, backoff;
- `jobs.webhooks.send`: one try: the payload, its signature, Slack's text, email, the POST.
"""
