"""The surrogate behind the search: an Amdahl-style latency model times a Gaussian-process correction.

`physics` fits the model's non-negative coefficients; `surrogate` fits scikit-optimize's Gaussian-process
regressor to what the model cannot express and predicts every cell with its uncertainty.
"""

from packrat_daemon.search.gp.surrogate import MODEL_FLOOR, ROUGHNESS, Surrogate

__all__ = ["MODEL_FLOOR", "ROUGHNESS", "Surrogate"]
