"""What steps cost on this machine: the cost models policies plan with (``model``), how they are measured
(``calibration``) and where measurements are kept between runs (``store``)."""

from quickdraft.costs.model import BatchCostModel, CostModel, expected_tokens, fitted_value, interpolate, monotone_fit

__all__ = ["BatchCostModel", "CostModel", "expected_tokens", "fitted_value", "interpolate", "monotone_fit"]
