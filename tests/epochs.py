"""One epoch of a data stream (text `BatchStream` or video `ClipStream`), checked as it is read."""
from __future__ import annotations

from ballast.dataset import EpochStream, GlobalBatch


def one_epoch(stream: EpochStream) -> list[GlobalBatch]:
    """The batches left in the stream's current epoch; every one says it is of that epoch, and
    the stream is at the start of the next when they are read."""
    epoch, batches = stream.epoch, []
    while stream.epoch == epoch:
        batches.append(stream.next_batch())
        assert batches[-1].epoch == epoch
    assert stream.state_dict()["position"] == 0
    return batches
