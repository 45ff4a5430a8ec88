"""Admission of costly requests (uploads): a cap per tenant (429) and one for the process (503).

The slot is counted when it is taken, with no await between check and count, so a burst of
concurrent requests cannot all pass the check; it is given back when the ``with`` block ends.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

from pipelines.api.errors import ServiceUnavailable, TooManyRequests


class Admission:
    def __init__(self, what: str, *, per_tenant: int, total: int) -> None:
        self.what, self.per_tenant, self.total = what, per_tenant, total
        self.open: Counter[str] = Counter()

    @contextmanager
    def slot(self, tenant_id: str) -> Iterator[None]:
        if self.open[tenant_id] >= self.per_tenant:
            raise TooManyRequests(f"this tenant already has {self.per_tenant} {self.what} in progress; try again shortly")
        if sum(self.open.values()) >= self.total:
            raise ServiceUnavailable(f"too many {self.what} in progress; try again shortly")
        self.open[tenant_id] += 1
        try:
            yield
        finally:
            self.open[tenant_id] -= 1
            if self.open[tenant_id] <= 0:
                del self.open[tenant_id]
