"""Per-file checksums of a checkpoint folder: recorded in meta.json when it is committed, verified
before a resume. CRC-32 (zlib, which releases the GIL: files are summed in parallel threads) with
the size: a flipped bit, a truncated, missing or replaced file is found; this is against accidents
(disks, copies, partial syncs), not against someone who rewrites meta.json too."""
import os
import zlib
from concurrent.futures import ThreadPoolExecutor

CHUNK = 8 << 20
SKIP = ("meta.json",)


def _files(folder):
    for root, dirs, names in os.walk(folder):
        dirs.sort()
        for name in sorted(names):
            path = os.path.join(root, name)
            rel = os.path.relpath(path, folder)
            if rel not in SKIP:
                yield rel, path


def inside(folder, rel):
    """Whether `rel` (a path a meta.json names) resolves, symlinks followed, to `folder` or below it."""
    if not isinstance(rel, str) or not rel or os.path.isabs(rel):
        return False
    base = os.path.realpath(folder)
    return os.path.realpath(os.path.join(base, rel)).startswith(base + os.sep)


def crc32_file(path):
    crc = 0
    with open(path, "rb") as f:
        while True:
            chunk = f.read(CHUNK)
            if not chunk:
                return f"{crc & 0xFFFFFFFF:08x}"
            crc = zlib.crc32(chunk, crc)


def folder_checksums(folder, workers=4):
    """{relative path: [size, crc32 hex]} of every file under `folder` but meta.json."""
    files = list(_files(folder))
    with ThreadPoolExecutor(max(1, min(workers, len(files)))) as pool:
        sums = list(pool.map(lambda item: crc32_file(item[1]), files))
    return {rel: [os.path.getsize(path), crc] for (rel, path), crc in zip(files, sums)}


def first_mismatch(folder, recorded, workers=4):
    """(relative path, what is wrong) of the first file of `recorded` that is missing, of another size,
    or whose CRC differs, or that lies outside `folder`; None when every recorded file is intact. Sizes are
    checked before any read."""
    for rel, (size, _) in recorded.items():
        if not inside(folder, rel):
            return rel, "outside the checkpoint folder (meta.json is not the one its save wrote)"
        path = os.path.join(folder, rel)
        if not os.path.isfile(path):
            return rel, "missing"
        actual = os.path.getsize(path)
        if actual != size:
            return rel, f"{'truncated' if actual < size else 'grown'}: {actual} bytes, {size} when saved"
    items = sorted(recorded.items())
    with ThreadPoolExecutor(max(1, min(workers, len(items)))) as pool:
        sums = list(pool.map(lambda item: crc32_file(os.path.join(folder, item[0])), items))
    for (rel, (_, crc)), actual in zip(items, sums):
        if actual != crc:
            return rel, f"checksum mismatch (crc32 {actual}, {crc} when saved)"
    return None
