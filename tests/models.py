"""Small eager models the tests lower (tests/ is on sys.path)."""

from __future__ import annotations

import io

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


class MlpCumsum(_Mlp):
    """The small MLP, then a cumsum XNNPACK leaves on the CPU (input: (2, 8))."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cumsum(super().forward(x), dim=1)


def pt2_bytes(ep: torch.export.ExportedProgram) -> bytes:
    """``ep``'s PT2 archive (``torch.export.save``), as bytes."""
    buffer = io.BytesIO()
    torch.export.save(ep, buffer)
    return buffer.getvalue()


class Mlp16(torch.nn.Module):
    """16 features in, 32 hidden, 8 out."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.fc2 = torch.nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


class Cond(torch.nn.Module):
    """A ``torch.cond`` on the input's sum between two branches reading a buffer, then a linear."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.register_buffer("offset", torch.tensor([1.0, 2.0, 3.0, 4.0]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        def true_fn(x: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
            return torch.sin(x) * 2 + offset

        def false_fn(x: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
            return torch.cos(x) - offset

        return self.fc(torch.cond(x.sum() > 0, true_fn, false_fn, (x, self.offset)))


class Tied(torch.nn.Module):
    """An embedding and an output head sharing one weight (64 tokens, 16 features)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(64, 16)
        self.head = torch.nn.Linear(16, 64, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.embed(tokens)))
