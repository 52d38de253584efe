"""Raw partitions of a stream: CSV, TSV or Parquet, prepared as each is taken.

A stream's partition (:mod:`het.data.stream`) may be raw rather than a prepared directory:

- a file (CSV, TSV, either gzipped, or Parquet) complete once it holds its name: its writer
  writes it under a hidden name (``.name``, ``_name``) or one ending ``.tmp`` or
  ``.inprogress``, then renames it into place, as Flink's and Kafka Connect's file sinks do;
  a file under such a name is never read;
- a directory of such files, complete once it holds ``_SUCCESS`` (Spark's and Hive's jobs):
  its files in name order, hidden ones and the marker left out.

Each is prepared once, when taken, by ``het data prepare table``'s pass
(:func:`het.data.table.prepare_table`) into the stream's preparation directory, every row a
training row: hashed ids (a dynamic table's keys), dense columns under transforms fitted on the
first partition and then kept, so a value means the same input in every partition and in the
export. Which column is what comes from the stream's schema (a ``schema.toml``, as ``het data
prepare table --schema`` reads), else is inferred from the first partition's head; a schema with
``min_freq`` above 1 is refused (a vocabulary fitted on one partition would send every later
id to its out-of-vocabulary key: a dynamic table's admission does that job on a stream).

A preparation is kept, named after its partition: a job resumed, or another rank of the job,
finds it instead of preparing it again, once its sources' paths, sizes and times, its columns
and (past the first partition) its transforms are this job's.
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import hashlib
import json
import os
import tempfile

MARKER = "_SUCCESS"  # a partition directory's last file: it is complete
UNFINISHED = (".tmp", ".inprogress", ".crc")  # names a writer uses before a file is whole, or not data


def default_directory(pattern: str) -> str:
    """Where a stream's raw partitions are prepared unless told (``--stream-prepared``): the
    system's temporary directory, one a pattern, so a resumed job finds what it prepared."""
    digest = hashlib.sha256(os.path.abspath(pattern).encode()).hexdigest()[:12]
    return os.path.join(tempfile.gettempdir(), f"het-stream-{digest}")


def is_hidden(path: str) -> bool:
    """Whether a writer is still at ``path`` or it is not data (a hidden or temporary name)."""
    name = os.path.basename(path.rstrip("/"))
    return name.startswith((".", "_")) or name.endswith(UNFINISHED)


def raw_files(path: str) -> list[str]:
    """The data files of raw partition ``path`` (a file, or a directory's files in name order)."""
    if os.path.isfile(path):
        return [path]
    names = sorted(n for n in os.listdir(path) if not is_hidden(n) and os.path.isfile(os.path.join(path, n)))
    return [os.path.join(path, n) for n in names]


def is_raw(path: str) -> bool:
    """Whether ``path`` is a raw partition rather than a prepared directory."""
    return os.path.isfile(path) or not os.path.isfile(os.path.join(path, "meta.json"))


class RawPartitions:
    """Prepares a stream's raw partitions into ``directory`` (see the module).

    Args:
        directory: where the preparations go (made if missing).
        schema: a schema TOML's path, or None: inferred from the first partition's head.
    """

    def __init__(self, directory: str, schema: str | None = None):
        self.directory, self.schema_path = os.path.abspath(directory), schema
        self.spec = None  # the first partition's TableSpec, then every partition's
        self.fitted = None  # the first partition's fit: every later one's transforms
        self.schema_toml = None

    def prepared(self, path: str) -> str:
        """The preparation of raw partition ``path``, made now unless there already."""
        from het.data.table import prepare_table

        files = raw_files(path)
        if not files:
            raise ValueError(f"{path}: no data file in it (CSV, TSV or Parquet; hidden names are left out)")
        if os.path.islink(self.directory):
            raise ValueError(f"{self.directory}: a link, expected a directory for the stream's preparations "
                             f"(give another with --stream-prepared)")
        out = os.path.join(self.directory, _name(path))
        sources = [{"path": os.path.abspath(f), "bytes": (st := os.stat(f)).st_size, "mtime_ns": st.st_mtime_ns}
                   for f in files]
        if self.spec is None:
            self._schema_from(files[0])
        kept = _meta(out)
        if kept is not None and self._fits(kept, sources):  # these files, prepared as this job would
            if self.fitted is None:
                self._first_from(kept)
            return out
        os.makedirs(self.directory, exist_ok=True)
        prepare_table(files, out, self.spec, test_fraction=0.0, progress=False, schema_toml=self.schema_toml,
                      fitted=self.fitted, extra_meta={"stream_sources": sources, "stream_schema": self.schema_toml,
                                                      "stream_spec": dataclasses.asdict(self.spec)})
        if self.fitted is None:
            self._first_from(_meta(out))
        return out

    def _schema_from(self, first: str) -> None:
        from het.data.table import TableSpec
        from het.data.table_cli import schema_of

        flags = argparse.Namespace(schema=self.schema_path, preset=None, label=None, dense=None, sparse=None,
                                   positive=None, multi=None, bucket=None, buckets=None, min_freq=None,
                                   dense_transform=None)
        schema, _ = schema_of(flags, first, None, None)
        if (schema.min_freq or 1) > 1 or schema.multi:
            raise ValueError(f"a stream's schema cannot have min_freq above 1 (a vocabulary fitted on its first "
                             f"partition would send every later id to the out-of-vocabulary key: --table-admit-after does "
                             f"that job on a stream) nor multi-hot columns; got min_freq {schema.min_freq}, "
                             f"multi-hot {sorted(schema.multi)}")
        self.spec = TableSpec(schema.label, tuple(schema.dense), tuple(schema.sparse), positive=schema.positive,
                              dense_transform=schema.dense_transform or "auto", multi=tuple(schema.multi.items()),
                              bucket=tuple(schema.bucket), buckets=schema.buckets or 10)
        self.schema_toml = schema.to_toml()

    def _fits(self, kept: dict, sources: list) -> bool:
        """Whether a kept preparation is of these files (paths, sizes, times), under this job's
        columns and, past the first partition, its first partition's fit."""
        spec = json.loads(json.dumps(dataclasses.asdict(self.spec)))
        fitted = self.fitted is None or all(kept.get(k) == self.fitted[k] for k in ("dense_transforms", "buckets"))
        return kept.get("stream_sources") == sources and kept.get("stream_spec") == spec and fitted

    def _first_from(self, meta: dict) -> None:
        """The first partition's fit, from its preparation (a resumed job's too)."""
        self.fitted = {"dense_transforms": meta.get("dense_transforms"), "buckets": meta.get("buckets"),
                       "vocabulary": None}


def _name(path: str) -> str:
    """A preparation's name: the partition's own, and a digest of its full path (two streams'
    ``part-0`` differ)."""
    full = os.path.abspath(path).rstrip("/")
    return f"{os.path.basename(full)}-{hashlib.sha256(full.encode()).hexdigest()[:12]}"


def _meta(directory: str) -> dict | None:
    try:
        with open(os.path.join(directory, "meta.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def complete(pattern: str) -> list[str]:
    """The complete partitions ``pattern`` matches, in path order: directories holding
    :data:`MARKER`, and files under a final name."""
    found = []
    for p in glob.glob(pattern):
        if os.path.isdir(p) and os.path.isfile(os.path.join(p, MARKER)):
            found.append(p)
        elif os.path.isfile(p) and not is_hidden(p):
            found.append(p)
    return sorted(found)
