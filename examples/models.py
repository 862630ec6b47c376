"""Example targets for the passline command: `passline explain examples/models.py:layer_norm ...`."""
import torch


def layer_norm(x):
    return torch.nn.functional.layer_norm(x, x.shape[-1:])


def transposed(x):
    return (x.exp().t() + 1).sin()


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 64))

    def forward(self, x):
        return self.net(x)


def example_inputs():
    return [torch.randn(16, 64, requires_grad=True)]


class LayerNorm32(torch.nn.LayerNorm):
    """LayerNorm with weight and bias: its backward has row sums (dx) and column sums (dw, db)."""

    def __init__(self):
        super().__init__(32)
