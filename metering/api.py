"""The usage API (`/api/v1/usage`). (Being built for issue 6.)"""

from ninja import Router

from jobs.auth import ConsoleSession, UserToken

router = Router(auth=[UserToken(), ConsoleSession()], tags=["usage"])
