"""Traces a user-defined two-branch model and prints what graphpipe sees.

    python examples/inspect_model.py
"""

from __future__ import annotations

import torch
from torch import nn

import graphpipe


class TwoTower(nn.Module):
    """A text tower and an image tower joined by a classifier: two parallel branches."""

    def __init__(self) -> None:
        super().__init__()
        self.text = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64))
        self.image = nn.Sequential(nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 64))
        self.head = nn.Linear(128, 10)

    def forward(self, text: torch.Tensor, image: torch.Tensor) -> torch.Tensor:
        return self.head(torch.cat([self.text(text), self.image(image)], dim=1))


def main() -> None:
    model = TwoTower()
    inputs = (torch.randn(16, 64), torch.randn(16, 256))
    graph = graphpipe.trace(model, inputs)
    graphpipe.profile(graph, model, inputs, batch_sizes=(1, 4, 16))
    print(graph)
    decomposition = graph.series_parallel()
    print("series-parallel tree:", decomposition.tree.to_string(graph))
    for node in graph.nodes:
        times = ", ".join(f"b={p.batch_size}: {1e6 * (p.forward_seconds + p.backward_seconds):.0f}us"
                          for p in node.profile)
        print(f"  {node.name:<10} {node.target:<12} {node.forward_flops:>8.0f} FLOP/sample  {times}")


if __name__ == "__main__":
    main()
