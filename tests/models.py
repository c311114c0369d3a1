"""Small eager models the load and fault tests lower many times (tests/ is on sys.path)."""

from __future__ import annotations

import torch


class _Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


class _Conv(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(x)) * 2.0


class _AddMul(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return (x + y) * y - x


def small_models() -> dict[str, tuple[torch.nn.Module, tuple[torch.Tensor, ...]]]:
    """Four small models with their example inputs, the same weights on every call."""
    torch.manual_seed(0)
    return {
        "linear": (torch.nn.Linear(4, 4), (torch.randn(2, 4),)),
        "mlp": (_Mlp(), (torch.randn(3, 8),)),
        "conv": (_Conv(), (torch.randn(1, 3, 8, 8),)),
        "add-mul": (_AddMul(), (torch.randn(2, 5), torch.randn(2, 5))),
    }
