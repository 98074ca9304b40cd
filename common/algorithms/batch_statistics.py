"""One update of BatchNorm's running statistics per local batch, however many forward passes a step makes.

SAM and its relatives forward the same batch twice (at `w` and at `w + e`), FedSynSAM
forwards a synthetic batch too. In train mode every forward of a BatchNorm layer moves its
running mean and variance and adds 1 to `num_batches_tracked`, so such a step would count as
two or three batches. The reference SAM implementation (davda54/sam, `disable_running_stats`)
lets only the first pass, at `w`, move them. (FedCOG's KD pass on its generated batch does
move them, as FedCOG's reference code does: client_app/fedcog.py.)

`frozen_batch_statistics` is that switch. Inside it, every `_BatchNorm` module in train mode
has `track_running_stats = False`: torch's BatchNorm forward then normalises by the batch's
own statistics, exactly as a tracked forward in train mode does, and writes nothing (not the
running statistics and not the counter; setting the momentum to 0, as davda54/sam does,
would still add 1 to `num_batches_tracked`). Gradients are the same as without the switch.
Modules in eval mode are left alone (they read their running statistics and write nothing
anyway), and a model without BatchNorm is not touched at all.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm


@contextmanager
def frozen_batch_statistics(model: nn.Module) -> Iterator[None]:
    """Forward passes inside write no BatchNorm running statistics; each tracking module is restored on exit."""
    switched = [m for m in model.modules() if isinstance(m, _BatchNorm) and m.training and m.track_running_stats]
    for module in switched:
        module.track_running_stats = False
    try:
        yield
    finally:
        for module in switched:
            module.track_running_stats = True
