"""The store side of a PS shard: each table's rows, clocks and optimizer state, behind one
interface (:class:`het.ps.server.store.rowstore.RowStore`), with the optimizers, the disk tier, the
write-ahead log and the saves beneath it. Nothing here knows the wire."""
