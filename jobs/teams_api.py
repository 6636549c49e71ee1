"""The teams API (`/api/v1/teams`): members see their teams; team admins manage members and
defaults. (Being built for issue 6.)"""

from ninja import Router

from jobs.auth import ConsoleSession, UserToken

router = Router(auth=[UserToken(), ConsoleSession()], tags=["teams"])
