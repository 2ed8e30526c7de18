"""SpecDec++'s acceptance-prediction head: P(the target accepts this draft token), from the draft's state.

A logistic model over the draft model's last hidden state plus two summaries of its
distribution (top probability and entropy), standardised with the training set's mean and
spread. ``specdec++:T`` multiplies the predicted acceptance of the tokens drafted so far and
stops drafting once P(at least one rejection in the block) = 1 − Π p_i exceeds T.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from quickdraft.errors import ConfigError, ModelFilesError


def head_features(hidden: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """``[B, H]`` hidden and ``[B, V]`` logits -> ``[B, H + 2]`` features."""
    log_probs = torch.log_softmax(logits.float(), dim=-1)  # [B, V]
    top_probability = log_probs.amax(dim=-1, keepdim=True).exp()  # [B, 1]
    entropy = -(log_probs.exp() * log_probs).nan_to_num().sum(dim=-1, keepdim=True)  # [B, 1]
    return torch.cat([hidden.float(), top_probability, entropy], dim=-1)


@dataclass
class AcceptanceHead:
    weight: torch.Tensor  # [F]
    bias: torch.Tensor  # [] scalar
    mean: torch.Tensor  # [F]
    scale: torch.Tensor  # [F]
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        vector = self.weight.shape
        if len(vector) != 1 or self.mean.shape != vector or self.scale.shape != vector or self.bias.dim() != 0:
            shapes = [list(tensor.shape) for tensor in (self.weight, self.bias, self.mean, self.scale)]
            raise ConfigError(f"weight, mean and scale must be [F] vectors and bias a scalar, got shapes {shapes}")

    @property
    def num_features(self) -> int:
        """F: the width of the hidden states it reads plus 2 (:func:`head_features`)."""
        return int(self.weight.shape[0])

    def probability(self, features: torch.Tensor) -> torch.Tensor:
        """``[N, F]`` features -> ``[N]`` acceptance probabilities."""
        standardised = (features.float() - self.mean) / self.scale
        return torch.sigmoid(standardised @ self.weight + self.bias)

    def predict(self, hidden: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        return self.probability(head_features(hidden, logits))

    def save(self, path: Path) -> None:
        from safetensors.torch import save_file

        path.parent.mkdir(parents=True, exist_ok=True)
        tensors = {"weight": self.weight, "bias": self.bias.reshape(1), "mean": self.mean, "scale": self.scale}
        save_file({k: v.contiguous() for k, v in tensors.items()}, path, {"quickdraft": json.dumps(self.metadata)})

    @classmethod
    def load(cls, path: str | Path, hidden_size: int | None = None) -> AcceptanceHead:
        """The head saved at ``path``; with ``hidden_size`` (the draft model's), one that reads hidden states
        of another width (a head trained for another draft model) raises ``ModelFilesError``."""
        from safetensors import safe_open

        path = Path(path)
        if not path.is_file():
            raise ModelFilesError(
                f"no acceptance head at {path}: train one with `quickdraft train-acceptance-head --out {path}`"
            )
        try:
            with safe_open(str(path), "pt") as file:
                tensors = {name: file.get_tensor(name) for name in file.keys()}  # noqa: SIM118 - not a dict
                metadata = json.loads((file.metadata() or {}).get("quickdraft", "{}"))
            missing = [name for name in ("weight", "bias", "mean", "scale") if name not in tensors]
            if missing:  # another model's file: a draft head from train-draft, say
                raise ValueError(f"it holds no {', '.join(missing)} tensor (a draft head from train-draft?)")
            head = cls(tensors["weight"], tensors["bias"][0], tensors["mean"], tensors["scale"], metadata)
        except Exception as error:  # safetensors raises its own error type for damaged files
            raise ModelFilesError(f"{path} is not a quickdraft acceptance head: {error}") from None
        if hidden_size is not None and head.num_features != hidden_size + 2:
            raise ModelFilesError(
                f"{path} is an acceptance head for another draft model: it reads {head.num_features} features, "
                f"and this draft model's hidden size {hidden_size} makes {hidden_size + 2} "
                "(train one for it with `quickdraft train-acceptance-head`)"
            )
        return head


WEIGHT_DECAYS = (1e-3, 1e-2, 1e-1, 1.0)  # L2 strengths tried; a draft's hidden state has ~900 features


def fit_head(
    features: torch.Tensor, labels: torch.Tensor, weight_decays: tuple[float, ...] = WEIGHT_DECAYS, seed: int = 0
) -> AcceptanceHead:
    """Logistic regression with the L2 strength that predicts a held-back quarter of the rows best
    (log loss), refitted on all rows: with a few thousand draft tokens and ~900 features, a weak
    penalty fits the training tokens perfectly and generalises no better than the base rate."""
    if features.shape[0] < 2 or labels.min() == labels.max():
        raise ConfigError("training an acceptance head needs both accepted and rejected draft tokens")
    order = torch.randperm(features.shape[0], generator=torch.Generator().manual_seed(seed))
    held, kept = order[: features.shape[0] // 4], order[features.shape[0] // 4 :]
    if len(weight_decays) > 1 and len(held) and labels[kept].min() != labels[kept].max():

        def held_loss(decay: float) -> float:
            head = _fit(features[kept], labels[kept], decay)
            probability = head.probability(features[held]).clamp(1e-6, 1 - 1e-6)
            return float(torch.nn.functional.binary_cross_entropy(probability, labels[held].float()))

        weight_decay = min(weight_decays, key=held_loss)
    else:
        weight_decay = weight_decays[0]
    head = _fit(features, labels, weight_decay)
    head.metadata["weight_decay"] = weight_decay
    return head


def _fit(features: torch.Tensor, labels: torch.Tensor, weight_decay: float, steps: int = 300) -> AcceptanceHead:
    """Logistic regression by full-batch L-BFGS on standardised features; ``labels`` are 0/1."""
    features = features.float()
    mean = features.mean(dim=0)
    scale = features.std(dim=0).clamp_min(1e-6)
    standardised = (features - mean) / scale
    weight = torch.zeros(features.shape[1], requires_grad=True)
    bias = torch.zeros((), requires_grad=True)
    optimizer = torch.optim.LBFGS([weight, bias], max_iter=steps, line_search_fn="strong_wolfe")
    targets = labels.float()

    def loss() -> torch.Tensor:
        optimizer.zero_grad()
        logits = standardised @ weight + bias
        value = torch.nn.functional.binary_cross_entropy_with_logits(logits, targets)
        value = value + weight_decay * weight.pow(2).sum()
        value.backward()
        return value

    optimizer.step(loss)
    return AcceptanceHead(weight.detach(), bias.detach(), mean, scale)


def calibration(head: AcceptanceHead, features: torch.Tensor, labels: torch.Tensor, bins: int = 10) -> dict[str, Any]:
    """Brier score, expected calibration error, accuracy and per-bin reliability on ``features``."""
    predicted = head.probability(features)
    observed = labels.float()
    edges = torch.linspace(0, 1, bins + 1)
    reliability, error = [], 0.0
    for low, high in zip(edges[:-1].tolist(), edges[1:].tolist(), strict=True):
        inside = (predicted >= low) & ((predicted < high) if high < 1 else (predicted <= high))
        count = int(inside.sum())
        if count:
            mean_predicted, mean_observed = float(predicted[inside].mean()), float(observed[inside].mean())
            error += count / len(predicted) * abs(mean_predicted - mean_observed)
            reliability.append({"bin": [low, high], "n": count, "predicted": mean_predicted, "observed": mean_observed})
    return {
        "n": len(predicted),
        "brier": float((predicted - observed).pow(2).mean()),
        "ece": error,
        "accuracy": float(((predicted >= 0.5).float() == observed).float().mean()),
        "base_rate": float(observed.mean()),
        "reliability": reliability,
    }


def default_head_path(draft_path: Path) -> Path:
    """Where `train-acceptance-head` puts the head for ``draft_path`` by default, and where it is looked up: named
    by the model's key, so another draft model in a directory of the same name does not find it."""
    from quickdraft.files import cache_root, model_key

    return cache_root() / "acceptance-heads" / f"{model_key(draft_path)}.safetensors"
