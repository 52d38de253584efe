"""The shard's side of the PS: each table's rows, clocks and optimizer state (``store/``), the
shard that answers requests with them (``shard``, with its sessions, parts of large pushes,
record of changed keys, memory budget and native hot path), the server that puts it behind a
transport (``server``), and the process that runs one (``process``). Nothing here is imported by
a worker."""
