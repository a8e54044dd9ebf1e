"""What every thread of a learner's communication side is given."""

from __future__ import annotations

from dataclasses import dataclass

from atoll.live.comm.channels import Channels
from atoll.live.comm.faults import LinkFaults
from atoll.live.comm.messages import CommOptions
from atoll.live.comm.session import Flags, Session
from atoll.live.comm.status import StatusReporter


@dataclass(eq=False)
class Part:
    """The options, the session (newest Welcome), the two channels, the flags, the reports to
    the training side and the link's faults (chaos). A thread class adds the few other parts
    it uses."""

    o: CommOptions
    session: Session
    channels: Channels
    flags: Flags
    reporter: StatusReporter
    faults: LinkFaults

    @property
    def id(self) -> str:
        return self.o.learner_id
