"""The live policy's replica addresses, followed while the run goes on.

Inference scales without a restart of the orchestrator: the operator rewrites
`inference.addresses` in the mounted run file (kubelet swaps the ConfigMap in place), and the
orchestrator re-reads it every `orchestrator.replica_refresh_s`. The env-servers need nothing
of their own: every RunGroup request carries the plan with the live policy's addresses, and
their inference client opens a channel to an address it has not seen on first use. So a group
sent after the change spreads its Generate calls over the new set; one already sent finishes
on the set it was given (a removed replica's calls fail over to the others, as for a replica
that died).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)


class LiveReplicas:
    def __init__(self, addresses: list[str]):
        self.addresses = list(addresses)
        """One list object for the whole run, changed in place: the live policy's endpoint in
        every plan, the plans' text addresses and the algorithms' policy endpoint hold this
        very list, so each request built after a change carries the new set."""

    def update(self, addresses: list[str]) -> bool:
        """Takes `addresses` as the replica set; False when nothing changed. An empty list is
        refused (a run file being rewritten, or a mistake: the run would have nowhere to
        generate), so the last set stays."""
        if not addresses:
            log.warning("inference.addresses is empty in the run file; keeping %s", ", ".join(self.addresses))
            return False
        if addresses == self.addresses:
            return False
        added = [a for a in addresses if a not in self.addresses]
        removed = [a for a in self.addresses if a not in addresses]
        log.info(
            "inference replicas now: %s (added: %s; removed: %s)",
            ", ".join(addresses),
            ", ".join(added) or "none",
            ", ".join(removed) or "none",
        )
        self.addresses[:] = addresses
        return True

    async def follow(self, read: Callable[[], list[str]], interval_s: float) -> None:
        """Re-reads the addresses (`read()`) every `interval_s`, until cancelled."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                wanted = list(read())
            except (OSError, ValueError) as error:  # a file being replaced; the next round reads it
                log.warning("could not re-read inference.addresses: %s", error)
                continue
            self.update(wanted)
