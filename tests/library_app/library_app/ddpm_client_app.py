# tests/library_app/library_app/ddpm_client_app.py: FedDDPM's and FedDDPM+'s node, phases included
import torch
from flwr.app import Context, Message
from flwr.clientapp import ClientApp
from torch.utils.data import DataLoader, TensorDataset

from fedsynth.client import (
    build_unet, epochs, feature_sums_reply, is_warmup, tensor_batches, train_ddpm, train_reply, warmup_length,
    warmup_reply,
)

app = ClientApp()
UNET = {"channels": 1, "image_size": 8, "timesteps": 20}  # the strategy's image_channels, image_size, diffusion_timesteps


def node_images(context: Context) -> torch.Tensor:
    """This node's training images, (N, 1, 8, 8) in [-1, 1] (your own data here)."""
    generator = torch.Generator().manual_seed(int(context.node_config["partition-id"]))
    return torch.rand(32, 1, 8, 8, generator=generator) * 2 - 1


@app.train()
def train(msg: Message, context: Context) -> Message:
    net = build_unet("unet-small", **UNET)
    net.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    images = node_images(context)
    loader = DataLoader(TensorDataset(images), batch_size=16, shuffle=True)
    pid, server_round = int(context.node_config["partition-id"]), int(msg.content["config"]["server-round"])
    if is_warmup(msg):  # once, before round 1: train the node's own DDPM from the initial model, send it once
        warmup_epochs, warmup_steps = warmup_length(msg)
        batches = (tensor_batches(images, torch.zeros(len(images)), 16, warmup_steps, seed=pid) if warmup_steps
                   else epochs(loader, count=warmup_epochs))
        result = train_ddpm(net, batches, timesteps=UNET["timesteps"], seed=(0, pid))
        return warmup_reply(msg, net, num_examples=len(images), train_loss=result.train_loss)
    result = train_ddpm(net, loader, timesteps=UNET["timesteps"], seed=(server_round, pid))
    return train_reply(msg, net, result, num_examples=len(images))


@app.query("fid_stats")
def fid_stats(msg: Message, context: Context) -> Message:
    """FedDDPM+'s feature sums (quicktest_reference="clients"): of the node's images, under the server's extractor."""
    return feature_sums_reply(msg, node_images(context))
