"""The faults a chaos round injects: SIGKILL a process of the stack (or Redis, or slurmctld)
and start it again, round robin."""

from __future__ import annotations

import time
from collections import Counter

from tests.chaos.services import ChaosStack, Slurm
from tests.e2e.stack import Redis


class Faults:
    """Round-robin over the kinds of fault; each SIGKILLs something and starts it again."""

    def __init__(self, stack: ChaosStack, redis: Redis, slurm: Slurm | None) -> None:
        self.stack, self.redis, self.slurm = stack, redis, slurm
        self.kills: Counter[str] = Counter()
        self.kinds = ["worker", "beat", "two_beats", "web", "websocket", "redis"]
        if slurm:
            self.kinds.append("slurmctld")
        self.turn = 0
        self.second_beat_until = 0.0
        self.repairs = 0  # drained Slurm nodes resumed by the driver, as an operator would

    def tick(self) -> None:
        """Inject the next fault; end a two-beats period that has lasted long enough."""
        if self.second_beat_until and time.monotonic() > self.second_beat_until:
            self.stack.kill("beat2")
            self.kills["beat2"] += 1
            self.second_beat_until = 0.0
        kind = self.kinds[self.turn % len(self.kinds)]
        self.turn += 1
        getattr(self, f"_{kind}")()

    def _worker(self) -> None:
        self.stack.restart("worker", down_s=1.5)
        self.kills["worker"] += 1

    def _beat(self) -> None:
        self.stack.restart("beat", down_s=1.0)
        self.kills["beat"] += 1

    def _two_beats(self) -> None:
        if not self.second_beat_until:
            self.stack.start_second_beat()
            self.second_beat_until = time.monotonic() + 10

    def _web(self) -> None:
        self.stack.restart("web", down_s=1.0)
        self.kills["web"] += 1

    def _websocket(self) -> None:
        self.stack.restart("websocket", down_s=1.0)
        self.kills["websocket"] += 1

    def _redis(self) -> None:
        self.redis.kill()
        time.sleep(1.0)
        self.redis.start()
        self.kills["redis"] += 1

    def _slurmctld(self) -> None:
        assert self.slurm is not None
        self.slurm.restart_ctld()
        self.kills["slurmctld"] += 1

    def repair(self) -> None:
        if self.slurm and self.slurm.resume_unusable_nodes():
            self.repairs += 1

    def finish(self) -> None:
        if self.second_beat_until:
            self.stack.kill("beat2")
            self.kills["beat2"] += 1
            self.second_beat_until = 0.0

    def total(self) -> int:
        return sum(self.kills.values())
