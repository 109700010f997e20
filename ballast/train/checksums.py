"""A checkpoint's SHA-256 manifest: finds damage that keeps a file's size (bytes overwritten in
place by a failing disk or a bad copy), which the size check of `checkpoint_files.check` cannot see.

Written with the checkpoint, into its temporary folder before the rename into place (a rename
changes no byte, so the digests hold for the committed folder). Once every rank has written
its files, rank 0 lists the folder and the ranks hash it in parallel, rank r the files r,
r + world, ... of the listing, so no rank reads the whole checkpoint alone; rank 0 gathers the
digests and writes `MANIFEST` over them and meta.json. `verify` hashes every listed file again
before the checkpoint is trusted. A checkpoint written before ballast wrote manifests has none
(`present`): it is checked by sizes only, with a warning (`checkpoint_files.resumable`).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch.distributed as dist

MANIFEST = "sha256.json"


def digest(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def hash_shares(folder: Path) -> dict[str, str] | None:
    """Collective: every file of `folder` hashed by one rank; all the digests on rank 0, None on
    the others. Call it once every rank's files are in `folder` (after a barrier)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    # Rank 0's listing for all: on a shared file system another rank's view may lag behind.
    listing = [sorted(p.name for p in folder.iterdir() if p.is_file()) if rank == 0 else None]
    dist.broadcast_object_list(listing, src=0)
    mine = {name: digest(folder / name) for name in listing[0][rank::world]}
    shares = [None] * world if rank == 0 else None
    dist.gather_object(mine, shares, dst=0)
    return None if shares is None else {name: d for share in shares for name, d in share.items()}


def manifest(digests: dict[str, str]) -> str:
    """The text of `MANIFEST` listing `digests` (file name -> SHA-256)."""
    return json.dumps({"sha256": dict(sorted(digests.items()))}, indent=1)


def present(folder: Path) -> bool:
    return (folder / MANIFEST).is_file()


def verify(folder: Path) -> str | None:
    """What is wrong with `folder` against its manifest (an unreadable manifest, a listed file
    missing or changed), or None when every file matches."""
    try:
        listed = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError) as e:
        return f"{MANIFEST} is unreadable ({type(e).__name__}: {e})"
    listed = listed.get("sha256") if isinstance(listed, dict) else None
    if not isinstance(listed, dict):
        return f"{MANIFEST} holds no sha256 table"
    for name, expected in listed.items():
        path = folder / name
        if not path.is_file():
            return f"{name} is missing (listed in {MANIFEST})"
        if digest(path) != expected:
            return f"{name} does not match its SHA-256 in {MANIFEST} (its bytes changed after it was written)"
    return None
