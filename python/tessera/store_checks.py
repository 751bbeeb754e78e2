"""Checks of a tile store made before python3-lmdb opens it, as tessera makes them.

- :func:`check_data_file`: lmdb maps the data file, and a read of a page past its end is SIGBUS,
  which no ``except`` catches. So the file is checked against LMDB's two meta pages first, as
  data/tile_store.cpp's check_data_file does: the newer one names the last page in use.
- :func:`check_database`: python3-lmdb touches every page of a value before it returns it (its
  "preload"), so a value whose length a flipped bit made run past the file is SIGBUS in ``get``
  itself (tessera, reading the tile's header first, sees the length disagree and refuses). So
  each database's B-tree is walked here first with pread, and every page, key and value it
  refers to must lie in the file (LMDB's layout: lmdb.h, mdb.c).
- :func:`check_not_being_written`: ``tessera tile`` holds an exclusive flock on ``.STORE.lock``
  beside the store for its whole run (common/output.h), and commits slide by slide: a store read
  while it holds the lock may lack slides, or hold none yet.
"""
import fcntl
import os
import struct

from tessera.slide_record import TileStoreError

# A meta page: a 16-byte page header, then magic u32, version u32, address, map size, two 48-byte
# database records (free pages, then the main database; the first one's first u32 is the page
# size), last page u64, transaction id u64.
_META_HEADER = 16
_MAGIC, _PAGE_SIZE_AT, _MAIN_AT, _LAST_PAGE_AT, _TXN_AT = 0xBEEFC0DE, 24, 72, 120, 128
_META_BYTES = _META_HEADER + 136
# A database record: pad, flags, depth, branch, leaf and overflow pages, entries, root page.
_DATABASE = struct.Struct("<IHHQQQQQ")
_NO_ROOT = (1 << 64) - 1  # an empty database's root
_MAX_DEPTH = 32  # LMDB's cursor stack
# A page header: its number, pad, flags, then where its pointers end and its nodes begin; then a u16
# pointer to each node. A node: data size (a branch node: the child page, with the flags as its
# top word), flags, key size; then the key, then the data or (F_BIGDATA) the number of the first
# of the overflow pages that hold it, each value there after a page header.
_PAGE = struct.Struct("<QHHHH")
_NODE = struct.Struct("<HHHH")
_P_BRANCH, _P_LEAF, _P_KINDS = 0x01, 0x02, 0x01 | 0x02 | 0x04 | 0x08 | 0x20 | 0x40
_F_BIGDATA, _F_DUPDATA = 0x01, 0x04


def data_file(store):
    """The LMDB data file of `store`: STORE/data.mdb, or STORE itself for a store in one file."""
    return os.path.join(store, "data.mdb") if os.path.isdir(store) else store


def _read_meta(file, offset):
    """(page size, last page, transaction id, main database record) of the meta page at `offset`,
    or None when there is none there (the file ends before it, or it lacks LMDB's magic)."""
    meta = file.read(_META_BYTES, offset)
    if len(meta) < _META_BYTES or struct.unpack_from("<I", meta, _META_HEADER)[0] != _MAGIC:
        return None
    return (struct.unpack_from("<I", meta, _META_HEADER + _PAGE_SIZE_AT)[0],
            struct.unpack_from("<Q", meta, _META_HEADER + _LAST_PAGE_AT)[0],
            struct.unpack_from("<Q", meta, _META_HEADER + _TXN_AT)[0],
            meta[_META_HEADER + _MAIN_AT:_META_HEADER + _MAIN_AT + _DATABASE.size])


class _DataFile:
    """The data file open for pread, and its size."""

    def __init__(self, store):
        self.name = data_file(store)
        try:
            self.fd = os.open(self.name, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as error:
            raise TileStoreError(f"{self.name}: cannot open: {error.strerror}") from None
        self.size = os.fstat(self.fd).st_size

    def read(self, size, offset):
        try:
            return os.pread(self.fd, size, offset)
        except OSError as error:
            raise TileStoreError(f"{self.name}: cannot read: {error.strerror}") from None

    def __enter__(self):
        return self

    def __exit__(self, *_):
        os.close(self.fd)


def _newest_meta(file):
    """(page size, transaction id, main database record) of the newer meta page, checked."""
    first = _read_meta(file, 0)
    # LMDB's pages are a power of two from 512 bytes to 64 KiB; the second meta page is the second page.
    valid = first and 512 <= first[0] <= 65536 and not first[0] & (first[0] - 1)
    second = _read_meta(file, first[0]) if valid else None
    if not first or not second:
        raise TileStoreError(f"{file.name}: not an LMDB data file, or cut short ({file.size} bytes, no valid meta "
                             "pages)")
    page_size, last_page, txn, main = max(first, second, key=lambda meta: meta[2])
    needed = (last_page + 1) * page_size
    if file.size < needed:
        raise TileStoreError(f"{file.name}: truncated: {file.size} bytes, its meta page says {needed} are in use")
    return page_size, txn, main


def check_data_file(store):
    """Raises TileStoreError naming the data file when it is not LMDB's, is shorter than its newer
    meta page says is in use (a copy cut short, a full disk), or its main database (the one that
    names the others) does not lie in it. Returns the page size."""
    for attempt in range(2):
        with _DataFile(store) as file:
            page_size, txn, main = _newest_meta(file)
            try:
                _walk(file, page_size, main, "main")
                return page_size
            except TileStoreError:
                # A run that committed meanwhile may have reused the pages walked: walk its tree.
                if attempt or _newest_meta(file)[1] == txn:
                    raise


def check_database(store, page_size, record, name):
    """Raises TileStoreError naming the data file and the database when a page, key or value of
    the database `record` (its 48-byte record in the main database) does not lie in the file.
    Call it inside a read transaction, so that no writer reuses the pages it walks."""
    with _DataFile(store) as file:
        _walk(file, page_size, record, name)


def _walk(file, page_size, record, name):
    """Walks a database's B-tree from its root: every page it refers to is in the file and says it
    is that page, of the kind its depth calls for; every node lies in its page; every value in its
    page or in overflow pages in the file; the leaves hold as many entries as the record counts."""
    where = f"{file.name}: the {name} database"

    def corrupt(why):
        raise TileStoreError(f"{where}: {why} (a corrupt store)")

    if len(record) != _DATABASE.size:
        corrupt(f"a record of {len(record)} bytes")
    _, _, depth, _, _, _, entries, root = _DATABASE.unpack(record)
    if root == _NO_ROOT:
        if entries:
            corrupt(f"no pages, {entries} entries")
        return
    if not 1 <= depth <= _MAX_DEPTH:
        corrupt(f"a depth of {depth}")
    pages = file.size // page_size
    stack, visited, found = [(root, 1)], 0, 0
    while stack:
        number, level = stack.pop()
        visited += 1
        if not 2 <= number < pages or visited > pages:
            corrupt(f"a page number {number}, not one of the file's {pages} pages" if visited <= pages else
                    "pages that refer to each other in a cycle")
        page = file.read(page_size, number * page_size)
        says, _, flags, lower, upper = _PAGE.unpack_from(page)
        kind = _P_LEAF if level == depth else _P_BRANCH
        if says != number or flags & _P_KINDS != kind:
            corrupt(f"page {number} says it is page {says} of kind {flags & _P_KINDS:#x}, not "
                    f"{'a leaf' if kind == _P_LEAF else 'a branch'}")
        if not _PAGE.size < lower <= upper <= page_size or (lower - _PAGE.size) % 2:
            corrupt(f"page {number} has its nodes at {lower}..{upper}")
        for at in struct.unpack_from(f"<{(lower - _PAGE.size) // 2}H", page, _PAGE.size):
            if not upper <= at <= page_size - _NODE.size:
                corrupt(f"page {number} has a node at {at}, outside its nodes")
            low, high, node_flags, key_size = _NODE.unpack_from(page, at)
            data_at = at + _NODE.size + key_size
            if kind == _P_BRANCH:
                if data_at > page_size:
                    corrupt(f"page {number} has a key of {key_size} bytes at {at}, past its end")
                stack.append((low | high << 16 | node_flags << 32, level + 1))
                continue
            found += 1
            size = low | high << 16
            if node_flags & _F_DUPDATA:
                corrupt(f"page {number} has duplicate values (tessera writes none)")
            if node_flags & _F_BIGDATA:
                if data_at + 8 > page_size:
                    corrupt(f"page {number} has a node at {at} that runs past its end")
                first = struct.unpack_from("<Q", page, data_at)[0]
                if first < 2 or first * page_size + _PAGE.size + size > file.size:
                    corrupt(f"page {number} has a value of {size} bytes from page {first}, past the file's "
                            f"{file.size} bytes")
            elif data_at + size > page_size:
                corrupt(f"page {number} has a node of {key_size} + {size} bytes at {at}, past its end")
    if found != entries:
        corrupt(f"{found} entries in its leaves, {entries} in its record")


def lock_file(store):
    """The lock a tessera run writing `store` holds: `.NAME.lock` beside it (common/output.cpp)."""
    path = os.path.normpath(store)  # "out/" and "out/." name the lock of "out"
    return os.path.join(os.path.dirname(path), "." + os.path.basename(path) + ".lock")


def check_not_being_written(store):
    """Raises TileStoreError naming the store and the run (pid, host, command) that holds its lock.

    The lock is tested by taking it shared and letting go at once: flock has no other test, and
    this reader never writes. A lock file that nobody holds is a killed run's (the run removes it
    when it ends); where the file cannot be opened (a link, another user's) no run can be named.
    """
    lock = lock_file(store)
    try:
        fd = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 1024, 0).decode("utf-8", "replace").rstrip("\n\0") or "another tessera run"
            raise TileStoreError(f"{store}: being written by a tessera run ({holder}); its slides are not all "
                                 "stored yet: read it when that run has ended") from None
        except OSError:  # a file system without flock, where tessera could not have locked it either
            return
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
