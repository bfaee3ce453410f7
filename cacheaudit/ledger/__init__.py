"""The ledger: one SQLite file of runs, compilers, file states, include graphs, records, findings.

Content-addressed where it pays: a file path, a file state, an include graph, a compiler identity
and a JSON value (argv, environment) are each stored once and referenced, since thousands of kernels
share one CUTLASS graph and one set of flags. Short write transactions in WAL mode let many shim
processes share one file on local disk; long-lived parallel writers (pytest-xdist workers, ranks)
keep one file each and `combine` them afterwards.

Writes run on the stdlib `sqlite3` connection: the shim writes one record per compile and importing
sqlite-utils costs ~200 ms there (it probes for numpy). Schema creation, migrations and the query
helpers go through sqlite-utils on the same connection.
"""

# The package, lowest first: `places` (the default path, the spool's and the companions' names),
# `values` (runs, test windows, attributions, record ids), `private` (0600 files in 0700
# directories), `redact` (command lines as stored), `rows` (values in, rows out by name,
# retries), `schema` (the SQL, its history, migrations, the writers' and readers' patience),
# `opening` (writable or read-only connections), `connection` (what a ledger's writes and reads
# share: its state, short write transactions), `opened` (the `Opening` of every ledger class),
# `sessions` (a session's run, tests and end questions, without the records' model: the
# `SessionLedger`), `writes` (content-addressed interning, the write
# path), `reads` (rows back into records), `queries`, `store` (the `Ledger`: opened, closed, all
# of the above), `spool` (records kept aside, atomic and swept; the readers' way in), `combine`,
# `evictions`.

from cacheaudit.lazy import export_lazily

# Annotations only: `typing` would cost every process that imports the package.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from cacheaudit.ledger.combine import CombineResult, combine
    from cacheaudit.ledger.places import default_ledger_path, spool_dir
    from cacheaudit.ledger.schema import APPLICATION_ID, BUSY_TIMEOUT_S, SCHEMA, SCHEMA_VERSION
    from cacheaudit.ledger.spool import (
        ingest_spool,
        open_existing,
        open_ledger,
        record_from_json,
        record_to_json,
        spool_record,
    )
    from cacheaudit.ledger.store import Ledger
    from cacheaudit.ledger.values import (
        Attribution,
        RunInfo,
        TestWindow,
        new_record_id,
    )

# The public names, each imported from its module on first use: a process that needs one value
# (a session: the default place; the start-up hook: the spool's directory) does not pay for
# `combine` and the SQL of a fleet, the readers and the writers.
export_lazily(__name__, {
    "CombineResult": "combine", "combine": "combine",
    "APPLICATION_ID": "schema", "BUSY_TIMEOUT_S": "schema", "SCHEMA": "schema",
    "SCHEMA_VERSION": "schema",
    "ingest_spool": "spool", "open_existing": "spool", "open_ledger": "spool",
    "record_from_json": "spool", "record_to_json": "spool", "spool_record": "spool",
    "Ledger": "store",
    "Attribution": "values", "RunInfo": "values", "TestWindow": "values",
    "default_ledger_path": "places", "new_record_id": "values", "spool_dir": "places",
})

__all__ = [
    "APPLICATION_ID", "BUSY_TIMEOUT_S", "SCHEMA", "SCHEMA_VERSION", "Attribution", "CombineResult",
    "Ledger", "RunInfo", "TestWindow", "combine", "default_ledger_path", "ingest_spool",
    "new_record_id", "open_existing", "open_ledger", "record_from_json", "record_to_json",
    "spool_dir", "spool_record",
]
