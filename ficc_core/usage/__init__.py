"""Usage: what each invoke request used (the one :class:`UsageRecord`), kept in the store.

The gateway's accounting makes a record per request; the :class:`UsageLedger` writes
them in batches (with a :class:`~.spool.UsageSpool` on disk until stored); the report
(:mod:`.report`) and a service's summary read them back. Both the gateway and inference
import this package; it imports neither (docs/architecture.md, "Layering").
"""

from .ledger import UsageLedger
from .records import CredentialUsage, UsageRecord, UsageSummary, UsageTotals
from .report import UsageQuery, UsageReport, usage_report
from .spool import UsageSpool

__all__ = [
    "CredentialUsage",
    "UsageLedger",
    "UsageQuery",
    "UsageRecord",
    "UsageReport",
    "UsageSpool",
    "UsageSummary",
    "UsageTotals",
    "usage_report",
]
