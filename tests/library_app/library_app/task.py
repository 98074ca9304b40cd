# tests/library_app/library_app/task.py: the app's own model and data; nothing of fedsynth here
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def make_net(num_classes: int = 10, channels: int = 1, image_size: int = 28) -> nn.Module:
    """A small CNN with BatchNorm; the factory a server-side model names (`model="library_app.task:make_net"`)."""
    side = (image_size - 5) // 3 + 1
    return nn.Sequential(nn.Conv2d(channels, 4, 5, stride=3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                         nn.Linear(4 * side * side, num_classes))


def initial_net() -> nn.Module:
    torch.manual_seed(0)
    return make_net()


def load_data(partition_id: int, examples: int = 32, batch_size: int = 16) -> DataLoader:
    """This node's images (1x28x28) and labels: a seeded toy task that a CNN can learn."""
    generator = torch.Generator().manual_seed(partition_id)
    x = torch.randn(examples, 1, 28, 28, generator=generator)
    y = (x[:, 0, :14].mean(dim=(1, 2)) * 20).clamp(-4.99, 4.99).add(5).long()  # 10 classes
    return DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=True, generator=generator)
