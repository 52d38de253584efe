"""A file written by ``torch.save``, its tensors as read-only memory maps, read in pieces.

het's checkpoints are torch files: a zip of a pickle and one uncompressed record per storage.
``torch.load(mmap=True)`` maps them copy-on-write (private and writable: the whole file counts
against a process's data limit); an export reads tables bigger than memory, so it maps the
file read-only and shared instead and copies out one piece at a time. The pages come from the
page cache and go back to it (:meth:`TorchFile.drop_pages`); the process's own memory is what
one piece needs.

Only what het writes is read: dicts, lists, tuples, numbers, strings and tensors of plain
dtypes. Anything else in the pickle is refused, as ``torch.load(weights_only=True)`` refuses it.
"""

from __future__ import annotations

import io
import mmap
import pickle
import zipfile
from collections import OrderedDict

import numpy as np

from het.files import member_offset

BFLOAT16 = np.dtype(np.uint16, metadata={"bfloat16": True})  # numpy has none: its bits, marked
_STORAGES = {"FloatStorage": np.float32, "DoubleStorage": np.float64, "HalfStorage": np.float16,
             "BFloat16Storage": BFLOAT16,
             "LongStorage": np.int64, "IntStorage": np.int32, "ShortStorage": np.int16, "CharStorage": np.int8,
             "ByteStorage": np.uint8, "BoolStorage": np.bool_}


class LazyTensor:
    """A tensor of a torch file, not read yet: its dtype and shape, and its values as a
    read-only view of the file's map (:meth:`array`) or in pieces (:meth:`rows`).

    Shape: as saved; ``rows(lo, hi)`` copies rows ``lo .. hi - 1`` of the first dimension.
    """

    def __init__(self, file: TorchFile, key: str, dtype, offset: int, shape: tuple, stride: tuple):
        self.file, self.key, self.dtype = file, key, np.dtype(dtype)
        self.offset, self.shape, self.stride = offset, tuple(shape), tuple(stride)

    def __len__(self) -> int:
        return self.shape[0] if self.shape else 1

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    def array(self) -> np.ndarray:
        """The values, read-only, without a copy: pages come in as they are read."""
        base = self.file.storage(self.key, self.dtype)
        item = self.dtype.itemsize
        if not self.shape:
            return base[self.offset:self.offset + 1].reshape(())
        return np.lib.stride_tricks.as_strided(base[self.offset:], self.shape, tuple(s * item for s in self.stride),
                                               writeable=False)

    def rows(self, lo: int, hi: int) -> np.ndarray:
        """A copy of rows ``lo .. hi - 1`` (of the first dimension)."""
        return np.array(self.array()[lo:hi])

    def float_rows(self, lo: int, hi: int) -> np.ndarray:
        """Rows ``lo .. hi - 1`` as float32: float16's and bfloat16's widened (exact)."""
        rows = self.array()[lo:hi]
        if self.dtype.metadata and self.dtype.metadata.get("bfloat16"):
            return (rows.astype(np.uint32) << 16).view(np.float32)
        return rows.astype(np.float32)

    def numpy(self) -> np.ndarray:
        """A copy of every value (for the small arrays only)."""
        return np.array(self.array())

    def __repr__(self) -> str:
        return f"LazyTensor({self.dtype}, {self.shape})"


class TorchFile:
    """A ``torch.save`` file opened for reading in pieces; :attr:`obj` is what was saved, its
    tensors :class:`LazyTensor`.

    Args:
        path: the file.

    Raises:
        ValueError: the file is not a torch zip file, or holds what het never writes; the
            message names the file.

    Example:
        >>> import tempfile, torch
        >>> path = tempfile.mkdtemp() + "/t.pt"
        >>> torch.save({"w": torch.arange(6.).reshape(3, 2), "n": 2}, path)
        >>> f = TorchFile(path)
        >>> f.obj["n"], f.obj["w"].shape, f.obj["w"].rows(1, 3).tolist()
        (2, (3, 2), [[2.0, 3.0], [4.0, 5.0]])
        >>> f.close()
    """

    def __init__(self, path: str):
        self.path = path
        try:
            self._zip = zipfile.ZipFile(path)
            names = self._zip.namelist()
            pkl = next(n for n in names if n.endswith("/data.pkl") and n.count("/") == 1)
        except (zipfile.BadZipFile, StopIteration, OSError) as e:
            raise ValueError(f"{path}: not a torch file (torch.save's zip of data.pkl and its storages): "
                             f"{type(e).__name__}: {e}") from None
        self._prefix = pkl[:-len("data.pkl")]
        self._map: mmap.mmap | None = None
        self._bytes: np.ndarray | None = None
        try:
            self.obj = _Unpickler(io.BytesIO(self._zip.read(pkl)), self).load()
        except (pickle.UnpicklingError, EOFError, KeyError, TypeError, AttributeError, ValueError) as e:
            raise ValueError(f"{path}: holds {type(e).__name__} ({e}), not a file het wrote") from None

    def storage(self, key: str, dtype) -> np.ndarray:
        """A storage's values as a read-only array over the file's map."""
        info = self._zip.getinfo(f"{self._prefix}data/{key}")
        if info.compress_type != zipfile.ZIP_STORED:
            raise ValueError(f"{self.path}: storage {key} is compressed; torch.save writes them stored")
        start = member_offset(self._zip.fp, info)
        count = info.file_size // np.dtype(dtype).itemsize
        return self._whole()[start:start + count * np.dtype(dtype).itemsize].view(dtype)

    def _whole(self) -> np.ndarray:
        if self._bytes is None:
            with open(self.path, "rb") as f:
                self._map = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
            self._bytes = np.frombuffer(self._map, dtype=np.uint8)
        return self._bytes

    def drop_pages(self) -> None:
        """Unmap the pages read so far from this process (the page cache may keep them)."""
        if self._map is not None:
            self._map.madvise(mmap.MADV_DONTNEED)

    def close(self) -> None:
        self._bytes = None
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:  # an array still views it: the map goes with that array
                pass
            self._map = None
        self._zip.close()


class _Storage:
    def __init__(self, key: str, dtype):
        self.key, self.dtype = key, dtype


class _Unpickler(pickle.Unpickler):
    """torch.save's pickle with tensors made :class:`LazyTensor`; only plain data allowed."""

    def __init__(self, stream, file: TorchFile):
        super().__init__(stream)
        self.file = file

    def find_class(self, module, name):
        if module == "torch._utils" and name == "_rebuild_tensor_v2":
            return self._rebuild
        if module == "torch" and name in _STORAGES:
            return _STORAGES[name]
        if (module, name) == ("collections", "OrderedDict"):
            return OrderedDict
        if (module, name) == ("torch", "Size"):
            return tuple
        raise pickle.UnpicklingError(f"refused {module}.{name}: only tensors and plain data are read")

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise pickle.UnpicklingError(f"unexpected persistent id {pid!r}")
        return _Storage(str(pid[2]), pid[1])

    def _rebuild(self, storage, offset, size, stride, requires_grad=False, hooks=None, metadata=None):
        return LazyTensor(self.file, storage.key, storage.dtype, int(offset), tuple(size), tuple(stride))
